"""`python -m paddle_dist.doctor --test` on this machine: 2 CPU ranks started by paddle_dist's
launcher, every check's row, exit 0; and a check that hangs is stopped by its deadline and
named, with exit 1."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from paddle_dist.doctor import selftest_rank

from .procs import ROOT, run

pytestmark = pytest.mark.compat

TIMEOUT = 180                 # seconds: the run itself takes about 10 s here
ROW = re.compile(r"^(\S.*?)\s{2,}(\S+)\s{2,}(PASS|FAIL|SKIP|NOT RUN)\s{2,}(.+?)\s{2,}(.*)$")
EXPECTED = {
    "process group": "PASS",
    "all-reduce float32": "PASS", "all-reduce float64": "PASS", "all-reduce int32": "PASS",
    "all-reduce int64": "PASS", "all-reduce bfloat16": "PASS",
    "grad sync fused": "PASS", "grad sync overlap": "PASS", "grad sync dataparallel": "PASS",
    "checkpoint + RNG": "PASS",
    "AMP float16 O1 + GradScaler": "SKIP", "AMP bfloat16 O1": "SKIP",    # GPUs only
    "AMP float16 O2 + GradScaler": "SKIP", "AMP bfloat16 O2": "SKIP",
    "export + predict": "PASS", "overlap on a CUDA side stream": "SKIP",
}


def table(stdout: str):
    """{check: (ranks, result, detail)} from the printed table."""
    rows = {}
    for text in stdout.splitlines():
        match = ROW.match(text)
        if match and match.group(1) != "check":
            rows[match.group(1)] = (match.group(2), match.group(3), match.group(5))
    return rows


def test_self_test_on_two_cpu_ranks_passes():
    done = run(["-m", "paddle_dist.doctor", "--test", "--nprocs", "2"], timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "paddle_dist self-test: 2 ranks, gloo on CPU"
    rows = table(done.stdout)
    assert list(rows) == [selftest_rank.SETUP] + [c.name for c in selftest_rank.CHECKS]
    for name, status in EXPECTED.items():
        assert rows[name][1] == status, (name, rows[name])
    # float16 over Paddle's gloo: right (2.6) or a known wrong sum that paddle_dist avoids (3.x).
    assert rows["all-reduce float16"][1] in ("PASS", "SKIP")
    assert rows["grad sync fused"][0] == "2/2" and rows["export + predict"][0] == "1/1"
    for mode in ("fused", "overlap", "dataparallel"):
        assert rows[f"grad sync {mode}"][2].endswith("ranks bit-identical")
    skipped = 5 + (rows["all-reduce float16"][1] == "SKIP")
    assert re.fullmatch(rf"self-test: {17 - skipped} passed, 0 failed, {skipped} skipped in \d+\.\d s",
                        lines[-1]), lines[-1]
    assert "Traceback" not in done.stderr


HANGING_RANK = """import sys, time, dataclasses
sys.path.insert(0, {root!r})
from paddle_dist.doctor import checks
from paddle_dist.doctor import selftest_rank as st

def hang(job):
    if job.env.global_rank == 1:
        time.sleep(600)
    return checks.grad_sync("fused", job)

st.CHECKS[:] = [dataclasses.replace(c, seconds=3, run=hang) if c.name == "grad sync fused" else c
                for c in st.CHECKS]
sys.exit(st.main(sys.argv[1:]))
"""


def _self_test_with(rank_script: str, tmp_path):
    """doctor --test on 2 ranks that run `rank_script`: (the result, the match of the line
    naming the logs it kept, or None)."""
    script = tmp_path / "parent.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom paddle_dist.doctor import selftest\n"
                      f"selftest.RANK_SCRIPT = {rank_script!r}\nsys.exit(selftest.run(2))\n")
    done = run([str(script)], timeout=TIMEOUT)
    return done, re.search(r"^logs kept in (/\S+) ", done.stdout, re.M)


@pytest.mark.waits
def test_a_check_that_hangs_is_stopped_and_named(tmp_path):
    """Rank 1 hangs in 'grad sync fused' (rank 0 waits for it there, and hangs too or fails
    once rank 1 is stopped): the deadline (3 s here) stops the job, the row names the
    hang, the later checks are not run, exit 1, the logs are kept."""
    done, kept = _self_test_with(HANGING_RANK, tmp_path)
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        rows = table(done.stdout)
        assert rows["grad sync fused"][:2] == ("0/2", "FAIL")
        # The hang is named (rank 1's, or rank 0's when it waited there long enough to hang
        # too), not what rank 0 met once rank 1 was stopped.
        assert re.fullmatch(r"rank [01]: self-test: grad sync fused gave no result within 3 s "
                            r"\(hung; stopped\)(; also rank [01])?", rows["grad sync fused"][2])
        assert rows["all-reduce float32"][1] == "PASS"
        assert [rows[name][1] for name in ("grad sync overlap", "checkpoint + RNG", "export + predict")] == \
            ["NOT RUN"] * 3
        assert kept and (Path(kept.group(1)) / "log" / "workerlog.1").is_file()
    finally:
        if kept:
            shutil.rmtree(kept.group(1), ignore_errors=True)


def test_self_test_under_the_gpu_standin_runs_every_amp_row():
    """Under tests/gpu_standin.py (an enabled GradScaler, O2's state and bfloat16 outputs,
    amp.plan as on a GPU with both dtypes) the AMP rows train with the GPU default sync
    (dataparallel) at both API levels; O2's BatchNorm network evaluates, resumes from its
    checkpoint bit-identical and exports. float16 O2 has no CPU kernel: a SKIP that says so."""
    from tests import gpu_standin

    done = run(["-m", "paddle_dist.doctor", "--test", "--nprocs", "2"], timeout=TIMEOUT,
               base_env=gpu_standin.environ())
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    assert list(rows) == [selftest_rank.SETUP] + [c.name for c in selftest_rank.CHECKS]
    for name in ("AMP float16 O1 + GradScaler", "AMP bfloat16 O1", "AMP bfloat16 O2"):
        ranks, status, detail = rows[name]
        assert (ranks, status) == ("2/2", "PASS"), (name, rows[name])
        assert "(loop)" in detail and "(hapi)" in detail and "sync dataparallel" in detail
        assert detail.endswith("ranks bit-identical")
    o2 = rows["AMP bfloat16 O2"][2]
    assert "weights and BatchNorm statistics - float32 replay" in o2
    assert "checkpoint resumed bit-identical (16-bit weights, BatchNorm statistics, master weights)" in o2
    assert "float32 checkpoint exported" in o2
    assert rows["AMP float16 O2 + GradScaler"][1:] == ("SKIP", "the GPU stand-in runs train.amp=O2 with "
                                                       "train.amp_dtype=bfloat16 only: a CPU has no float16 kernels")
    assert "loss scaler" in rows["checkpoint + RNG"][2]


FAILING_RANK = """import sys, dataclasses
sys.path.insert(0, {root!r})
from paddle_dist.doctor import checks
from paddle_dist.doctor import selftest_rank as st

def wrong(job):
    return checks.Row("grad sync fused", checks.FAIL, detail="wrong on purpose")

def raises(job):
    raise ValueError("broken on purpose")

st.CHECKS[:] = [dataclasses.replace(c, run={{"grad sync fused": wrong, "checkpoint + RNG": raises}}.get(c.name, c.run))
                for c in st.CHECKS]
sys.exit(st.main(sys.argv[1:]))
"""


def test_a_failed_check_that_every_rank_met_leaves_the_later_rows_to_run(tmp_path):
    """A wrong result and an exception on every rank are FAIL rows; the ranks still meet
    after them, so every later row runs and reports (exit 1)."""
    done, kept = _self_test_with(FAILING_RANK, tmp_path)
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        rows = table(done.stdout)
        assert rows["grad sync fused"] == ("0/2", "FAIL", "rank 0: wrong on purpose; also rank 1")
        assert rows["checkpoint + RNG"] == ("0/2", "FAIL", "rank 0: ValueError: broken on purpose; also rank 1")
        assert "NOT RUN" not in [status for _, status, _ in rows.values()]
        assert [rows[name][1] for name in ("grad sync overlap", "grad sync dataparallel", "export + predict")] == \
            ["PASS"] * 3
        assert re.search(r"^self-test: \d+ passed, 2 failed, \d+ skipped in", done.stdout, re.M)
    finally:
        if kept:
            shutil.rmtree(kept.group(1), ignore_errors=True)
