"""runtime/scripthooks/pythonpath/sitecustomize.py: how a plain script's ranks start up with
`python -m paddle_dist.launch`'s hook on their PYTHONPATH, checked in fresh interpreters (a
stand-in `paddle` package where paddle itself is not needed)."""

import os

from paddle_dist.runtime import protocol

HOOKS = protocol.SCRIPT_HOOKS


def test_the_hooks_directory_holds_only_sitecustomize():
    assert sorted(n for n in os.listdir(HOOKS) if n != "__pycache__") == ["sitecustomize.py"]


def test_start_up_chains_the_next_sitecustomize_and_imports_nothing_else(tmp_path, fresh_python):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.path.append('/added')\nRAN = True\n")
    out, _ = fresh_python("import sys, sitecustomize as s\n"
                          "print(type(sys.meta_path[0]).__name__, s.chained.RAN, s.__file__ == s.HERE + '/sitecustomize.py')\n"
                          "print(sys.path.index(s.HERE) < sys.path.index(%r), '/added' in sys.path)\n"
                          "print(sorted(m for m in ('paddle', 'paddle_dist', 'numpy') if m in sys.modules))\n" % str(other),
                          HOOKS, other)
    assert out.split("\n")[:3] == ["PaddleFinder True True", "True True", "[]"]


def test_a_failing_next_sitecustomize_is_reported_as_python_does_and_the_hook_stays(tmp_path, fresh_python):
    (tmp_path / "sitecustomize.py").write_text("raise RuntimeError('broken')\n")
    out, err = fresh_python("import sys; print(type(sys.meta_path[0]).__name__)", HOOKS, tmp_path)
    assert out.strip() == "PaddleFinder"
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: broken" in err


def test_every_data_parallel_class_is_hooked_once_paddle_has_run(tmp_path, fresh_python):
    """A stand-in paddle: its DataParallel, a subclass and its own loader seen by the package."""
    fake = tmp_path / "fake"
    (fake / "paddle").mkdir(parents=True)
    (fake / "paddle" / "__init__.py").write_text(
        "LOADER = __loader__\n"
        "class DataParallel:\n"
        "    def __init__(self, layers):\n"
        "        self.layers = layers\n")
    out, _ = fresh_python("import sys, sitecustomize as s\n"
                          "made = []\n"
                          "s.attach = made.append\n"
                          "import paddle\n"
                          "class Mine(paddle.DataParallel):\n"
                          "    def __init__(self, layers):\n"
                          "        super().__init__(layers)\n"
                          "a, b = paddle.DataParallel(1), Mine(2)\n"
                          "print(made == [a, b], paddle.LOADER is paddle.__loader__ is paddle.__spec__.loader,\n"
                          "      type(paddle.__loader__).__name__)\n",
                          HOOKS, fake)
    assert out.strip() == "True True SourceFileLoader"
