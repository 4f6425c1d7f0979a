"""A user error ends a script as it ends a launcher: one line, exit 2, still the error a
script may catch (errors.for_scripts); a rank that ended on one is "refused", and neither the
report nor `python -m paddle_dist.runs` offers the command that would fail the same way."""

import json
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest

from paddle_dist import errors
import paddle_dist
from paddle_dist.runs.layout import Run
from paddle_dist.runtime import monitor as rank_monitor
from paddle_dist.runs import listing
from paddle_dist.launch.console import Console
from paddle_dist.errors import ConfigError, DataError, UserError
from paddle_dist.errors import REFUSAL_LINE, Refused, for_scripts
from paddle_dist.runs.report import Exit, root_cause, with_resume
from paddle_dist.runs.status import read_all as read_status

from tests.oracles import rank_status
from tests.unit.runs.test_listing import _run_dir

TYPO = "unknown config key 'train.epoch'; did you mean train.epochs?"
COMMAND = ["python", "my_script.py"]


def test_a_typo_is_a_config_error_that_ends_a_script_with_2_and_one_line(capsys):
    with pytest.raises(ConfigError) as caught:
        paddle_dist.load_config(overrides=["train.epoch=4"])
    assert str(caught.value) == TYPO and type(caught.value).__name__ == "ConfigError"
    assert isinstance(caught.value, SystemExit) and caught.value.code == 2
    assert capsys.readouterr().err == f"{REFUSAL_LINE}{TYPO}\n"
    assert errors.outcome_of(caught.value) == "refused" and errors.exit_code_of(caught.value) == 2
    plain = pickle.loads(pickle.dumps(caught.value))        # to another process: the plain error
    assert type(plain) is ConfigError and str(plain) == TYPO
    done = subprocess.run([sys.executable, "-c", "import paddle_dist\n"
                           "paddle_dist.load_config(overrides=['train.epoch=4'])"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"{REFUSAL_LINE}{TYPO}\n", "")


def test_a_refusal_keeps_its_class_attributes_and_cause_and_is_said_once(capsys):
    class RowError(DataError):
        def __init__(self, row):             # a signature of its own: never called again
            super().__init__(f"row {row} is corrupted; remove it")
            self.row = row

    @for_scripts
    def read():
        try:
            raise OSError("bad CRC")
        except OSError as exc:
            raise RowError(7) from exc

    outer = for_scripts(read)                 # a public function called inside another
    with pytest.raises(RowError) as caught:
        outer()
    assert caught.value.row == 7 and isinstance(caught.value.__cause__, OSError)
    assert isinstance(caught.value, Refused) and str(caught.value) == "row 7 is corrupted; remove it"
    assert capsys.readouterr().err == f"{REFUSAL_LINE}row 7 is corrupted; remove it\n"
    assert for_scripts(lambda: 5)() == 5
    with pytest.raises(ValueError):          # anything else passes as it is
        for_scripts(int)("x")
    assert capsys.readouterr().err == ""


def _refused_record(run_dir, rank, error: UserError, when: float):
    """A rank's status record as fit() writes it when `error` ends it (monitor.Monitor)."""
    monitor = rank_monitor.Monitor(SimpleNamespace(global_rank=rank, local_rank=rank), run_dir)
    monitor.finish(errors.outcome_of(error), error)
    path = Run(run_dir).rank_status(rank)
    path.write_text(json.dumps(dict(json.loads(path.read_text()), time=when)))


def _with_command(run_dir):
    Run(run_dir).run_file.write_text(json.dumps({"command": COMMAND, "same_command_continues": True}))
    return run_dir


def test_a_job_that_refused_its_input_is_one_line_and_not_offered_to_continue(tmp_path):
    run_dir = _with_command(_run_dir(tmp_path, "refused", ("stopped", {"error": RuntimeError("peer")})))
    _refused_record(run_dir, 1, DataError("sample 200 is corrupted; remove it"), when=1.0)
    status = rank_status(run_dir, 1)
    assert (status["state"], status["exit_code"], status["error_type"]) == ("refused", 2, "DataError")
    report = with_resume(root_cause(read_status(run_dir)), run_dir)
    assert (report.code, report.lines) == (2, [f"{REFUSAL_LINE}sample 200 is corrupted; remove it"])
    # A crash is continued by the command that started the run.
    crashed = _with_command(_run_dir(tmp_path, "crashed", ("stopped", {"error": RuntimeError("peer")}),
                                     ("failed", {"error": RuntimeError("CUDA error")})))
    report = with_resume(root_cause(read_status(crashed)), crashed)
    assert report.code == 1
    assert report.lines[-1] == f"paddle_dist: to continue this run, run: {' '.join(COMMAND)}"


def test_a_script_that_exits_2_is_its_one_line_else_its_last_lines(tmp_path):
    log = tmp_path / "workerlog.0"
    log.write_text(f"W1126 10:09:46.1 init.cc] a warning\n{REFUSAL_LINE}{TYPO}\n")
    exits = [Exit(0, 2, 10.0), Exit(1, 2, 10.01)]
    report = with_resume(root_cause({}, exits=exits, logs={0: str(log)}), None, COMMAND)
    assert (report.code, report.lines) == (2, [f"{REFUSAL_LINE}{TYPO}"])
    # The script's own argparse (usage, then "error: ..."): the usual report, its last lines.
    log.write_text("usage: my_script.py [-h] --out OUT\nmy_script.py: error: the following arguments "
                   "are required: --out\n")
    report = with_resume(root_cause({}, exits=exits, logs={0: str(log)}), None, COMMAND)
    assert report.code == 2 and report.lines[0].endswith("Root cause: rank 0 exited with code 2")
    assert "  | usage: my_script.py [-h] --out OUT" in report.lines
    assert not any("to run it again" in line for line in report.lines)


def test_runs_lists_a_refused_run_without_a_command(tmp_path):
    refused = _with_command(_run_dir(tmp_path, "refused", ("stopped", {"error": RuntimeError("peer")})))
    _refused_record(refused, 1, ConfigError("the ranks' models differ"), when=5.0)
    # A crash first, then a refusal: the crash is the root cause, which a command continues.
    both = _with_command(_run_dir(tmp_path, "both", ("failed", {"error": RuntimeError("boom")}), when=1.0))
    _refused_record(both, 1, ConfigError("x"), when=5.0)
    found = {run["run"].rsplit("/", 1)[1]: run for run in listing.recent(tmp_path, 10)}
    assert (found["refused"]["state"], found["refused"]["resume"]) == ("refused", "")
    assert (found["both"]["state"], found["both"]["resume"]) == ("failed", " ".join(COMMAND))


def test_the_console_leaves_a_scripts_refusal_to_the_report(capfd):
    console = Console(filtered=True)
    console.write(f"epoch 1\n{REFUSAL_LINE}{TYPO}\nlast\n".encode())
    console.close()
    assert capfd.readouterr().out == "epoch 1\nlast\n"


def test_exit_code_of_is_one_function_for_an_exception_and_a_return_code():
    """errors.exit_code_of answers for an exception that ends a rank and for a process's
    return code alike, and no other module defines one."""
    from pathlib import Path

    assert errors.exit_code_of(errors.Preempted("stopped")) == errors.EXIT_PREEMPTED
    assert errors.exit_code_of(RuntimeError("boom")) == errors.EXIT_FAILED
    assert (errors.exit_code_of(-9), errors.exit_code_of(3), errors.exit_code_of(0)) == (137, 3, 0)
    package = Path(errors.__file__).parent
    assert [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
            if "def exit_code_of(" in path.read_text()] == ["errors.py"]


def test_peer_failure_is_imported_from_errors_alone():
    """errors.py defines PeerFailure and is its one road (docs/faults.md names it): a module
    that needs it imports it from there, not through a module that imported it."""
    import ast
    from pathlib import Path

    package = Path(errors.__file__).parent
    roads = [f"{path.relative_to(package)}:{node.lineno} from {node.module}"
             for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and any(a.name == "PeerFailure" for a in node.names)
             and node.module not in ("errors", "paddle_dist.errors")]
    assert roads == []
