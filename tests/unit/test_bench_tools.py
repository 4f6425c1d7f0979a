"""The benchmark tools (tools/bench_*.py) refuse bad input with one line and exit 2, run here in
this process. tests/integration/test_bench_tools.py runs them, and one bad input of each as a real
process for the exit-code path."""

import pytest

from tests.oracles import ending


@pytest.fixture
def tool():
    """A tool's main(), from tools/ (a folder of scripts, not a package: imported by name)."""
    def main_of(name):
        module = __import__(f"tools.{name}", fromlist=["main"])
        return module.main
    return main_of


def _refuses(capfd, main, prog, cases):
    for args in cases:
        done = ending(capfd, lambda: main(args))
        assert done.code == 2, (args, done.lines)
        assert len(done.lines) == 1 and f"{prog}: error" in done.lines[0], (args, done.lines)


def test_bench_train_refuses_bad_input_with_one_line(capfd, tool):
    _refuses(capfd, tool("bench_train"), "bench_train", (["--variants", "nope"], ["--variant", "x"]))


def test_bench_overhead_refuses_bad_input_with_one_line(capfd, tool):
    _refuses(capfd, tool("bench_overhead"), "bench_overhead",
             (["--variants", "paddle_dist,paddle_dist"], ["--chunk", "99", "--steps", "10"], ["--min-ratio", "-1"]))


def test_bench_link_refuses_bad_input_with_one_line(capfd, tool):
    _refuses(capfd, tool("bench_link"), "bench_link",
             (["--model", "resnet"], ["--ranks-per-host", "3"], ["--variants", "nope"], ["--variant", "x"],
              ["--variant", "y=sync.mode=bogus"], ["--variant", "fused=sync.compress=bf16"]))


def test_bench_loader_refuses_bad_input_with_one_line(capfd, tool):
    _refuses(capfd, tool("bench_loader"), "bench_loader",
             (["--frameworks", "paddle,paddle"], ["--workers", "-1"], ["--workers", "2,2"], ["--images", "1"]))


def test_bench_sparse_refuses_bad_input_with_one_line(capfd, tool):
    _refuses(capfd, tool("bench_sparse"), "bench_sparse", (["--variants", "raw,nope"], ["--rows", "0"]))
