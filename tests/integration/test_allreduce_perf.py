"""tools/allreduce_perf.py with 2 real ranks: the nccl-tests table, the check, the gate, flags.

The run that must succeed goes through `paddle.distributed.launch`. The runs that must fail
start their two ranks by hand (torchrun-style variables, as `train.py --rank` does):
Paddle's launcher replaces a rank's exit code with its own and waits ~5 s to tear down,
while a rank started by hand exits with exactly the tool's code.
"""

from __future__ import annotations

import json
import sys
from typing import List

import pytest

from ..oracles import free_port
from .procs import PY, ROOT, check, run

TOOL = ROOT / "tools" / "allreduce_perf.py"
SMALL = ["-b", "8", "-e", "64K", "-f", "4", "-n", "3", "-w", "1"]



def _by_hand(flags: List[str]):
    """Both ranks as plain processes; rank 0's output is the result, rank 1's code goes to stderr."""
    script = ('T="$1"; shift; RANK=1 "$PY" "$T" "$@" >/dev/null 2>&1 & R1=$!; '
              'RANK=0 "$PY" "$T" "$@"; R0=$?; wait $R1; echo "rank1 exit $?" >&2; exit $R0')
    env = {"PY": PY, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return run(["bash", "-c", script, "ranks", str(TOOL)] + flags, timeout=120, env=env)


def _rows(stdout: str) -> List[List[str]]:
    """The table's data rows: lines that start with a number (glog lines start with I/W)."""
    return [line.split() for line in stdout.splitlines() if line.split() and line.split()[0].isdigit()]


def _check_table(stdout: str, world: int = 2) -> None:
    rows = _rows(stdout)
    assert rows, stdout
    assert [int(r[0]) for r in rows] == [8 * 4 ** k for k in range(7)]   # 8 .. 32768 (<= 64K)
    factor = 2 * (world - 1) / world
    for r in rows:
        assert len(r) == 13, r
        assert int(r[1]) == int(r[0]) // 4 and r[2:5] == ["float", "sum", "-1"], r
        for time_us, algbw, busbw, wrong in (r[5:9], r[9:13]):
            assert float(time_us) > 0 and wrong == "0", r
            assert abs(float(busbw) - float(algbw) * factor) <= 0.01 + 1e-9, r
    lines = stdout.splitlines()
    assert "#       size         count      type   redop    root     time   algbw   busbw #wrong" \
           "     time   algbw   busbw #wrong" in lines
    assert "# Out of bounds values : 0 OK" in lines
    avg = [line for line in lines if line.startswith("# Avg bus bandwidth")]
    assert len(avg) == 1 and float(avg[0].split(":")[1]) >= 0


def test_launch_prints_the_nccl_tests_table(tmp_path):
    result = check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                        "--log_dir", str(tmp_path / "log"), str(TOOL)] + SMALL, timeout=120))
    _check_table(result.stdout)
    assert "# World size 2, backend gloo" in result.stdout
    assert result.stdout.count("#  Rank ") == 2   # one device line per rank, printed once


def test_shared_memory_transport_through_our_launcher_and_its_json(tmp_path):
    out = tmp_path / "sweep.json"
    result = check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
                        str(TOOL)] + SMALL + ["--transport", "shm", "--json", str(out)], timeout=120))
    _check_table(result.stdout)
    assert "transport shm" in result.stdout
    found = json.loads(out.read_text())
    assert (found["world_size"], found["transport"], found["wrong"]) == (2, "shm", 0)
    assert [r["size"] for r in found["rows"]] == [int(r[0]) for r in _rows(result.stdout)]
    for r in found["rows"]:
        for side in ("out_of_place", "in_place"):
            assert r[side]["wrong"] == 0 and r[side]["busbw"] == pytest.approx(r[side]["algbw"])


def test_shared_memory_check_catches_an_injected_error():
    result = _by_hand(SMALL + ["--transport", "shm", "--inject-error"])
    assert result.returncode == 1 and "wrong values" in result.stderr, result.stdout + result.stderr


def test_injected_error_is_counted_and_fails():
    result = _by_hand(SMALL + ["-c", "1", "--inject-error"])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank1 exit 1" in result.stderr   # every rank agrees on the verdict
    rows = _rows(result.stdout)
    # rank 1 corrupts every element of both results: #wrong == count, out- and in-place
    assert all(r[8] == r[1] and r[12] == r[1] for r in rows), rows
    total = sum(2 * int(r[1]) for r in rows)
    assert f"# Out of bounds values : {total} FAILED" in result.stdout
    assert f"{total} wrong values" in result.stderr


def test_bandwidth_gate_fails_with_one_line():
    result = _by_hand(SMALL + ["-c", "0", "--min-busbw", "1000000"])
    assert result.returncode == 1, result.stdout + result.stderr
    gate = [line for line in result.stderr.splitlines() if "--min-busbw" in line]
    assert len(gate) == 1 and "below" in gate[0], result.stderr
    assert all(r[8] == "N/A" and r[12] == "N/A" for r in _rows(result.stdout))


# The other bad flags, in one process: tests/unit/test_allreduce_perf.py.
@pytest.mark.parametrize("flags", [["-b", "10X"]])
def test_bad_flags_exit_2_with_one_line(flags):
    result = run([str(TOOL)] + flags, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: allreduce_perf: "), result.stderr
    assert result.stdout == ""


def test_spawn_runs_the_tool(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(TOOL.parent)!r})\n"
        "import paddle.distributed as dist\n"
        "import allreduce_perf\n"
        "if __name__ == '__main__':\n"
        f"    dist.spawn(allreduce_perf.run, args=({SMALL!r},), nprocs=2)\n")
    result = check(run([str(driver)], timeout=120))
    _check_table(result.stdout)
    assert "launcher spawn" in result.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
