"""A user error in a script of one's own (a typo in its config, a refusal of fit()) is one
line and exit 2 under every launcher, as the same typo given to the launcher is: no
traceback, no command to run it again (errors.for_scripts, report._refused).

scripts/config_typo.py imports paddle_dist first, as the README's example does; a typo
fails before any training, so each job here takes a few seconds.
"""

import pytest

from paddle_dist.runs.logs import is_noise

from .procs import ROOT, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "config_typo.py")
OWN_FIT = str(ROOT / "tests" / "integration" / "scripts" / "own_fit.py")
LINE = "paddle_dist: error: unknown config key 'train.epoch'; did you mean train.epochs?"


def _said(text: str):
    """The lines of an output that are not Paddle's noise (logs.is_noise), nor its
    warning that ccache is missing (Paddle 2.6 prints it whatever paddle_dist filters)."""
    return [line for line in text.splitlines()
            if line.strip() and not is_noise(line) and "ccache" not in line and "warnings.warn" not in line]


@pytest.mark.compat
def test_a_config_typo_in_a_script_is_one_line_and_exit_2():
    result = run([SCRIPT], timeout=60)
    assert result.returncode == 2, result.stderr
    assert _said(result.stderr) == [LINE] and result.stdout == ""


@pytest.mark.compat
def test_under_paddle_dist_launch_the_report_is_that_one_line(tmp_path):
    result = run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), SCRIPT],
                 timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [LINE]          # the report: no command to run it again
    assert LINE not in result.stdout                     # rank 0's own line: said once, by the report
    assert "Traceback" not in result.stdout + result.stderr
    for rank in (0, 1):
        assert LINE in (tmp_path / "log" / f"workerlog.{rank}").read_text()


@pytest.mark.compat
def test_under_paddles_launcher_every_rank_says_one_line_and_the_job_exits_2(tmp_path):
    result = run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                  "--log_dir", str(tmp_path / "log"), SCRIPT], timeout=120)
    # Paddle's launcher ends with the code of the first rank that failed, which it lists first.
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert LINE in result.stdout                          # its console: rank 0's output
    for rank in (0, 1):
        assert _said((tmp_path / "log" / f"workerlog.{rank}").read_text()) == [LINE]


def test_a_config_loaded_before_spawn_stops_the_script_before_any_rank_starts(tmp_path):
    """Under paddle.distributed.spawn, a failure inside a rank comes back from spawn as
    Paddle's own exception with the rank's traceback (its `except Exception` catches
    every error first); loaded before spawn, the config's typo is one line."""
    result = run([SCRIPT, "--spawn", "2"], timeout=60)
    assert result.returncode == 2, result.stderr
    assert _said(result.stderr) == [LINE] and result.stdout == ""


def test_a_script_that_catches_the_config_error_goes_on():
    result = run([SCRIPT, "--catch"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"caught ConfigError: {LINE.split('error: ', 1)[1]}", "rank 0: config accepted, 5 epochs"]
    assert _said(result.stderr) == [LINE]                 # said when raised, caught or not


def test_a_refusal_inside_fit_is_one_line_under_paddle_dist_launch(tmp_path):
    """fit() refuses the script's own LRScheduler against a schedule in the config, on
    every rank, before any run directory exists: the job's report is that one line."""
    result = run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), OWN_FIT,
                  "--out", str(tmp_path), "--root", str(tmp_path / "runs"), "--scheduler",
                  "--override", "train.lr_schedule=cosine"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("paddle_dist: error: the optimizer has its own LRScheduler"), line
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()
