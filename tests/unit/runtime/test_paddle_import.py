"""runtime/paddle_import: `import paddle` after paddle_dist runs with the garbage collector
paused, then freezes what it made; a plain script's ranks get the same through their
sitecustomize. Each case runs in a fresh interpreter (the real paddle, or a stand-in package
where the case is about failing)."""

from pathlib import Path

import pytest

from paddle_dist.runtime import paddle_import, protocol

ROOT = Path(__file__).resolve().parents[3]


def test_paddle_imported_after_paddle_dist_is_frozen_and_the_collector_is_back_on(fresh_python):
    out = fresh_python("import gc, paddle_dist, paddle\n"
                       "print(gc.get_freeze_count(), gc.isenabled(), type(paddle.__loader__).__name__,\n"
                       "      float(paddle.to_tensor([1.5, 2.0]).sum()))\n", ROOT)[0].split()
    frozen, enabled, loader, total = out
    assert int(frozen) > 50_000            # Paddle's modules, classes and functions
    assert (enabled, loader, total) == ("True", "SourceFileLoader", "3.5")


def test_a_script_that_turned_the_collector_off_keeps_it_off(fresh_python):
    out = fresh_python("import gc\ngc.disable()\nimport paddle_dist, paddle\n"
                       "print(gc.get_freeze_count() > 50_000, gc.isenabled())\n", ROOT)[0].split()
    assert out == ["True", "False"]


def test_paddle_imported_before_paddle_dist_is_left_as_it_was(fresh_python):
    out = fresh_python("import gc, paddle, paddle_dist\nprint(gc.get_freeze_count(), gc.isenabled())\n",
                       ROOT)[0].split()
    assert out == ["0", "True"]


def test_a_failing_import_still_gives_the_collector_back(tmp_path, fresh_python):
    fake = tmp_path / "fake"
    (fake / "paddle").mkdir(parents=True)
    (fake / "paddle" / "__init__.py").write_text("raise ImportError('broken build')\n")
    out = fresh_python("import gc, sitecustomize\n"
                       "try:\n"
                       "    import paddle\n"
                       "except ImportError as exc:\n"
                       "    print(exc, gc.isenabled())\n", protocol.SCRIPT_HOOKS, fake)[0].split()
    assert out == ["broken", "build", "True"]


def test_a_plain_scripts_ranks_import_paddle_frozen_and_hooked(fresh_python):
    """The sitecustomize of a script's ranks loads paddle_import.py by its path: the real
    paddle is frozen, its DataParallel hooked, and no paddle_dist module was imported."""
    out = fresh_python("import gc, sys, sitecustomize\n"
                       "before = sorted(m for m in sys.modules if m.startswith('paddle_dist'))\n"
                       "import paddle\n"
                       "print(gc.get_freeze_count() > 50_000, gc.isenabled(), before,\n"
                       "      paddle.DataParallel.__init__._paddle_dist_hooked)\n",
                       protocol.SCRIPT_HOOKS)[0].split()
    assert out == ["True", "True", "[]", "True"]


def test_paddle_dist_imported_first_in_such_a_rank_adds_no_second_finder(fresh_python):
    out = fresh_python("import gc, sys, sitecustomize, paddle_dist, paddle\n"
                       "ours = [f for f in sys.meta_path if getattr(f, 'pauses_collector', False)]\n"
                       "print(len(ours), gc.get_freeze_count() > 50_000, paddle.DataParallel.__init__._paddle_dist_hooked)\n",
                       protocol.SCRIPT_HOOKS, ROOT)[0].split()
    assert out == ["1", "True", "True"]


@pytest.mark.parametrize("first, chosen, warned", [
    ("sitecustomize", "4", False),           # a plain script's rank, the launcher's count
    ("paddle_dist", "4", False),             # a rank of paddle_dist's own
    ("paddle_dist", None, True),             # the user's own OMP_NUM_THREADS: Paddle's words stand
])
def test_paddles_warning_on_openmp_threads_is_left_out_for_the_launchers_count(
        first, chosen, warned, fresh_python, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    if chosen:
        monkeypatch.setenv(paddle_import.OMP_CHOSEN, chosen)
    else:
        monkeypatch.delenv(paddle_import.OMP_CHOSEN, raising=False)
    out, err = fresh_python(f"import {first}, paddle, os, sys\nprint(os.environ['OMP_NUM_THREADS'])\n"
                            "print('after', file=sys.stderr)\n", protocol.SCRIPT_HOOKS, ROOT)
    assert out == "4\n"
    assert ("WARNING: OMP_NUM_THREADS set to 4" in err) == warned, err
    assert ("PLEASE USE OMP_NUM_THREADS WISELY." in err) == warned, err
    assert err.endswith("after\n")             # stderr is the process's own again
