"""Unit tests for paddle_dist.launch.supervisor: one interface for every way ranks start, its
typed result, and the launcher's start deadline."""

import os
import sys
import time

from paddle_dist import errors
from paddle_dist.launch import supervisor


# ---------------------------------------------------------------- one supervision interface
def test_every_way_of_starting_ranks_has_one_interface_and_a_typed_result():
    from paddle_dist.launch import supervisor

    for kind in (supervisor.LaunchSupervision, supervisor.RankSupervision, supervisor.SpawnSupervision):
        assert issubclass(kind, supervisor.Supervision)
        assert all(getattr(kind, name) is not getattr(supervisor.Supervision, name)
                   for name in ("start", "wait", "close"))


def test_ranks_under_supervision_end_in_a_job_result_the_report_reads_once(tmp_path, capfd):
    """Two real ranks, one ending with 3: wait() gives each rank's exit first hand and its
    log; run() reports the rank that failed, once, and returns its code."""
    import sys

    from paddle_dist.launch import supervisor
    from paddle_dist.launch.outcome import report

    argv = [sys.executable, "-c", "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"]
    envs = [{"RANK": "0"}, {"RANK": "1"}]
    job = supervisor.RankSupervision(argv, dict(os.environ), envs, None, 5, tmp_path / "log")
    try:
        job.start()
        result = job.wait()
    finally:
        job.close()
    assert sorted((e.rank, e.code) for e in result.exits) == [(0, 0), (1, 3)]
    assert result.logs == {0: str(tmp_path / "log" / "workerlog.0"), 1: str(tmp_path / "log" / "workerlog.1")}
    assert not result.ended_well and result.request is None and result.started
    assert report(result) == 3
    said = capfd.readouterr().err
    assert said.count("Root cause: rank 1 exited with code 3") == 1
    job.close()                                       # closing twice is harmless
    ok = supervisor.RankSupervision(argv[:2] + ["pass"], dict(os.environ), envs, None, 5, tmp_path / "ok")
    assert ok.run() == 0 and capfd.readouterr().err == ""


# ---------------------------------------------------------------- the launcher's start deadline
def test_a_launcher_that_starts_no_rank_is_stopped_with_3(tmp_path, capsys):
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    code = supervisor.LaunchSupervision(argv, {}, None, 60, tmp_path, start_timeout=0.5).run()
    assert code == errors.EXIT_RENDEZVOUS and time.monotonic() - started < 10
    assert "started no rank within 0.5 s" in capsys.readouterr().err


# ---------------------------------------------------------------- the log directory (issue 53, finding 3)
def test_a_log_directory_another_user_could_change_or_with_links_is_refused_before_any_rank(tmp_path):
    """The launcher's log directory is checked all the way and held open: a planted one
    (here open to everyone, as another user's would be refused for its owner) or one holding
    a link is refused in one line, and nothing is written through it."""
    import pytest

    from paddle_dist.errors import UserError

    (canary := tmp_path / "canary").write_text("kept\n")
    (planted := tmp_path / "planted").mkdir()
    planted.chmod(0o777)
    argv = [sys.executable, "-c", "pass"]
    with pytest.raises(UserError, match=r"^--log_dir .*/planted is not yours alone \(other users can write "
                                        r"into it: mode 0777\): .*\(--log_dir DIR\)$"):
        supervisor.log_opener(planted, "--log_dir")
    (linked := tmp_path / "linked").mkdir()
    (linked / "workerlog.0").symlink_to(canary)
    for job in (supervisor.RankSupervision(argv, {}, [{}], None, 5, linked),
                supervisor.LaunchSupervision(argv, {}, None, 5, linked)):
        with pytest.raises(UserError, match=r"linked/workerlog.0 is a symbolic link"):
            job.run()
    assert canary.read_text() == "kept\n" and sorted(p.name for p in linked.iterdir()) == ["workerlog.0"]
    assert list(planted.iterdir()) == []
