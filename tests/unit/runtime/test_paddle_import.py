"""runtime/paddle_import: `import paddle` after paddle_dist runs with the garbage collector
paused, then freezes what it made; a plain script's ranks get the same through their
sitecustomize. Each case runs in a fresh interpreter (the real paddle, or a stand-in package
where the case is about failing)."""

import os
import subprocess
import sys
from pathlib import Path

from paddle_dist.runtime import protocol

ROOT = Path(__file__).resolve().parents[3]


def fresh(code, tmp_path, *path):
    """`code` in a fresh interpreter whose PYTHONPATH is `path`; its stdout, split."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_paddle_imported_after_paddle_dist_is_frozen_and_the_collector_is_back_on(tmp_path):
    out = fresh("import gc, paddle_dist, paddle\n"
                "print(gc.get_freeze_count(), gc.isenabled(), type(paddle.__loader__).__name__,\n"
                "      float(paddle.to_tensor([1.5, 2.0]).sum()))\n", tmp_path, ROOT)
    frozen, enabled, loader, total = out
    assert int(frozen) > 50_000            # Paddle's modules, classes and functions
    assert (enabled, loader, total) == ("True", "SourceFileLoader", "3.5")


def test_a_script_that_turned_the_collector_off_keeps_it_off(tmp_path):
    out = fresh("import gc\ngc.disable()\nimport paddle_dist, paddle\n"
                "print(gc.get_freeze_count() > 50_000, gc.isenabled())\n", tmp_path, ROOT)
    assert out == ["True", "False"]


def test_paddle_imported_before_paddle_dist_is_left_as_it_was(tmp_path):
    out = fresh("import gc, paddle, paddle_dist\nprint(gc.get_freeze_count(), gc.isenabled())\n", tmp_path, ROOT)
    assert out == ["0", "True"]


def test_a_failing_import_still_gives_the_collector_back(tmp_path):
    fake = tmp_path / "fake"
    (fake / "paddle").mkdir(parents=True)
    (fake / "paddle" / "__init__.py").write_text("raise ImportError('broken build')\n")
    out = fresh("import gc, sitecustomize\n"
                    "try:\n"
                    "    import paddle\n"
                    "except ImportError as exc:\n"
                    "    print(exc, gc.isenabled())\n", tmp_path, protocol.SCRIPT_HOOKS, fake)
    assert out == ["broken", "build", "True"]


def test_a_plain_scripts_ranks_import_paddle_frozen_and_hooked(tmp_path):
    """The sitecustomize of a script's ranks loads paddle_import.py by its path: the real
    paddle is frozen, its DataParallel hooked, and no paddle_dist module was imported."""
    out = fresh("import gc, sys, sitecustomize\n"
                    "before = sorted(m for m in sys.modules if m.startswith('paddle_dist'))\n"
                    "import paddle\n"
                    "print(gc.get_freeze_count() > 50_000, gc.isenabled(), before,\n"
                    "      paddle.DataParallel.__init__._paddle_dist_hooked)\n",
                    tmp_path, protocol.SCRIPT_HOOKS)
    assert out == ["True", "True", "[]", "True"]


def test_paddle_dist_imported_first_in_such_a_rank_adds_no_second_finder(tmp_path):
    out = fresh("import gc, sys, sitecustomize, paddle_dist, paddle\n"
                "ours = [f for f in sys.meta_path if getattr(f, 'pauses_collector', False)]\n"
                "print(len(ours), gc.get_freeze_count() > 50_000, paddle.DataParallel.__init__._paddle_dist_hooked)\n",
                tmp_path, protocol.SCRIPT_HOOKS, ROOT)
    assert out == ["1", "True", "True"]
