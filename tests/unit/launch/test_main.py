"""`python -m paddle_dist.launch` (paddle_dist/launch/__main__.py): what it refuses before anything
starts, run in this process. tests/integration/test_launch_any_script.py runs scripts through it,
and tests/integration/test_user_errors.py its exit-code path for a user error."""

from paddle_dist.launch.__main__ import launch_main
from paddle_dist.options import run

from tests.oracles import ending


def test_missing_script_is_a_usage_error(capfd, tmp_path):
    done = ending(capfd, lambda: run(launch_main, ["--nprocs", "2", str(tmp_path / "nope.py")]))
    assert done.code == 2
    assert "nope.py" in done.lines[0] and "not found" in done.lines[0]
    done = ending(capfd, lambda: run(launch_main, ["--nprocs", "2", str(tmp_path)]))
    assert done.code == 2 and "is not a file" in done.lines[0]
