"""Unit tests for paddle_dist.doctor.selftest, the self-test's parent (`python -m paddle_dist.doctor
--test`) without starting a job: its table built from rank files written here, its job and its
plan. The rank side: test_checks.py, test_checks_amp.py, test_selftest_rank.py;
tests/integration/test_selftest.py runs the real job.
"""

from __future__ import annotations

import json

import pytest

from paddle_dist import config
from paddle_dist.doctor import selftest
from paddle_dist.runtime.env import DistEnv
from paddle_dist.errors import UserError
from paddle_dist.doctor.selftest import NOT_RUN, Line, assemble, exit_code, format_table
from paddle_dist.doctor.checks import Job
from paddle_dist.doctor.selftest_rank import CHECKS, SETUP

NAMES = [SETUP] + [c.name for c in CHECKS]


@pytest.fixture
def job(tmp_path):
    return Job(config.with_overrides([]), DistEnv(), tmp_path)


# ---------------------------------------------------------------- the parent's table
def rank_file(rank: int, **changes):
    """Rank `rank`'s rows of a job where everything passed, with some rows replaced."""
    rows = []
    for name in NAMES:
        if name == "export + predict" and rank:
            continue
        row = {"check": name, "status": "PASS", "seconds": 0.25, "detail": f"{name} ok", "digest": ""}
        if name.startswith("grad sync"):
            row["digest"] = "ab" * 32
        rows.append(dict(row, **changes.get(name, {})))
    return {"rank": rank, "running": None, "done": True, "rows": rows, "hung": None,
            "log": f"/tmp/x/log/workerlog.{rank}"}


def line(lines, name) -> Line:
    return next(x for x in lines if x.check == name)


def test_everything_passed():
    lines = assemble({0: rank_file(0), 1: rank_file(1)}, 2)
    assert [x.check for x in lines] == NAMES
    assert {x.status for x in lines} == {"PASS"} and exit_code(lines) == 0
    assert line(lines, "grad sync fused").detail == "grad sync fused ok; ranks bit-identical"
    assert line(lines, "grad sync fused").ranks == "2/2"
    assert line(lines, "export + predict").ranks == "1/1"       # rank 0 alone


def test_one_ranks_wrong_result_fails_the_row_and_the_exit_code():
    wrong = {"all-reduce int32": {"status": "FAIL", "detail": "value 0: got -4, expected -12"}}
    lines = assemble({0: rank_file(0), 1: rank_file(1, **wrong)}, 2)
    bad = line(lines, "all-reduce int32")
    assert (bad.status, bad.ranks, bad.detail) == ("FAIL", "1/2", "rank 1: value 0: got -4, expected -12")
    assert exit_code(lines) == 1
    assert [x.status for x in lines].count("FAIL") == 1


def test_ranks_that_end_with_different_weights_fail():
    other = {"grad sync overlap": {"digest": "cd" * 32}}
    lines = assemble({0: rank_file(0), 1: rank_file(1, **other)}, 2)
    bad = line(lines, "grad sync overlap")
    assert bad.status == "FAIL" and bad.detail.startswith("the ranks' weights differ: rank 0 abab")
    assert exit_code(lines) == 1


def test_skips_do_not_fail():
    skip = {"AMP bfloat16 O2": {"status": "SKIP", "detail": "GPUs only"}}
    lines = assemble({0: rank_file(0, **skip), 1: rank_file(1, **skip)}, 2)
    assert (line(lines, "AMP bfloat16 O2").status, line(lines, "AMP bfloat16 O2").ranks) == ("SKIP", "-")
    assert exit_code(lines) == 0


def test_a_hung_check_is_named_and_the_rest_not_run():
    hung = rank_file(1)
    at = NAMES.index("grad sync overlap")
    hung.update(rows=hung["rows"][:at], running="grad sync overlap", done=False,
                hung="self-test: grad sync overlap gave no result within 60 s")
    stopped = rank_file(0)
    stopped.update(rows=stopped["rows"][:at], running="grad sync overlap", done=False)
    lines = assemble({0: stopped, 1: hung}, 2)
    bad = line(lines, "grad sync overlap")
    assert (bad.status, bad.ranks) == ("FAIL", "0/2")
    assert bad.detail == ("rank 1: self-test: grad sync overlap gave no result within 60 s "
                          "(hung; stopped); also rank 0")            # the hang, not its consequence
    assert [x.status for x in lines[at + 1:]] == [NOT_RUN] * (len(NAMES) - at - 1)
    assert lines[at + 1].detail == "rank 0: stopped at an earlier check; also rank 1"
    assert exit_code(lines) == 1
    peer = rank_file(0)                 # rank 0 met rank 1's end inside its collective
    peer["rows"][at] = {"check": "grad sync overlap", "status": "FAIL", "seconds": 3.0,
                        "detail": "PeerFailure: gradient all-reduce failed: Connection closed by peer"}
    assert line(assemble({0: peer, 1: hung}, 2), "grad sync overlap").detail.startswith("rank 1: self-test")


def test_a_rank_that_never_wrote_a_file(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps(rank_file(0)))
    ranks = selftest.read_ranks(tmp_path, 2)
    lines = assemble(ranks, 2)
    assert line(lines, SETUP).status == "FAIL"
    assert line(lines, SETUP).detail == (f"rank 1: ended in this check without a result (crashed, or "
                                         f"stopped after another rank failed: see {tmp_path}/log/workerlog.1)")
    assert line(lines, "all-reduce float32").status == NOT_RUN
    assert line(lines, "export + predict").status == "PASS"


def test_time_running_out_is_a_fail_of_the_check_in_progress():
    running = rank_file(0)
    running.update(rows=running["rows"][:2], running=NAMES[2], done=False)
    lines = assemble({0: running}, 1, expired=True)
    assert lines[2].detail == "rank 0: the self-test ran out of time here (hung; stopped)"


def test_the_table_and_its_summary():
    lines = [Line(SETUP, "2/2", "PASS", 1.5, "gloo"), Line("all-reduce float16", "-", "SKIP", 0.004, "why"),
             Line("grad sync fused", "0/2", "FAIL", 0.0, "rank 1: wrong")]
    assert format_table(lines).splitlines() == [
        "check               ranks  result  time    detail",
        "process group       2/2    PASS    1.50 s  gloo",
        "all-reduce float16  -      SKIP    4 ms    why",
        "grad sync fused     0/2    FAIL    -       rank 1: wrong"]
    assert selftest.summary(lines, 9.87) == "self-test: 1 passed, 1 failed, 1 skipped in 9.9 s"


def test_json_output(capsys, tmp_path):
    lines = [Line(SETUP, "2/2", "PASS", 1.5, "gloo")]
    selftest.show(lines, "2 ranks, gloo on CPU", 3.0, tmp_path, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data == {"job": "2 ranks, gloo on CPU", "seconds": 3.0, "passed": True, "logs": None,
                    "rows": [{"check": SETUP, "ranks": "2/2", "status": "PASS", "seconds": 1.5,
                              "detail": "gloo"}]}


def test_the_job_is_every_visible_gpu_else_two_cpu_ranks():
    assert selftest.job_config(None, None, []).dist.nprocs == 2
    assert selftest.job_config(None, None, ["0", "1", "2"]).dist.nprocs == 3
    chosen = selftest.job_config(None, "1,2", ["0", "1", "2"])
    assert (chosen.dist.nprocs, chosen.dist.gpus) == (None, "1,2")
    assert selftest.job_config(3, None, []).dist.launcher == "launch"
    with pytest.raises(UserError, match="--gpus is empty"):
        selftest.job_config(None, " ", [])


def test_the_plan_starts_the_ranks_with_paddle_dists_launcher(tmp_path):
    """The ranks are run by launcher.launch as train.py's are: python rank.py FOLDER once
    per rank, with the variables Paddle's launcher would give them, on CPU with gloo."""
    from paddle_dist.runtime.devices import GpuInfo
    from paddle_dist.runtime.variables import HostFacts

    cfg = selftest.job_config(2, None, [])
    host = HostFacts({}, GpuInfo(False, 0), 2)
    p = selftest.prepare(cfg, DistEnv(), tmp_path, host)
    assert (p.mode, p.direct, p.nprocs, p.gpus) == ("launch", True, 2, ())
    assert p.argv[-2:] == (str(tmp_path / "rank.py"), str(tmp_path))   # after the gate
    assert p.env["PADDLE_DIST_SUPERVISED"] == "1" and p.env["OMP_NUM_THREADS"] == "1"
    assert config.from_dict(json.loads((tmp_path / "config.json").read_text())).dist.nprocs == 2
    assert "selftest_rank.main(sys.argv[1:])" in (tmp_path / "rank.py").read_text()
    assert selftest.describe(p) == "2 ranks, gloo on CPU"
    one = selftest.prepare(selftest.job_config(1, None, []), DistEnv(), tmp_path, host)
    assert one.mode == "launch" and selftest.describe(one) == "1 rank on CPU"
