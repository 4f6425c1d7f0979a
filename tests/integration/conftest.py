"""Runs shared between the integration test modules (one pytest-xdist worker builds each:
tests/conftest.py groups their users)."""

import pytest

from .procs import check, run


@pytest.fixture(scope="session")
def main_job(tmp_path_factory):
    """The main job as `make demo` runs it (train.py, 2 ranks, the demo config: LeNet on the
    bundled MNIST, 12 epochs), once: test_train_cli checks what it reached, test_deploy
    deploys what it trained. (result, run directory)."""
    root = tmp_path_factory.mktemp("main-job") / "runs"
    result = check(run(["train.py", "-o", "dist.nprocs=2", "-o", "train.api=loop",
                        "-o", f"output.root={root}"], timeout=300))
    [run_dir] = [d for d in root.iterdir() if d.is_dir()]
    return result, run_dir
