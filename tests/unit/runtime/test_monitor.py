"""A rank whose stop was saved ends with 75 whatever signal reaches it afterwards: srun and
mpirun end the other ranks (SIGTERM) once the first has exited, and a second scancel may
come; 143 there would keep the job from being requeued."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

RANK = textwrap.dedent("""
    import sys
    from types import SimpleNamespace
    sys.path.insert(0, {root!r})
    from paddle_dist.runtime import monitor as rank_monitor
    monitor = rank_monitor.Monitor(SimpleNamespace(global_rank=0, local_rank=0), {run_dir!r})
    with monitor.running():
        monitor.finish({state!r})
    print("ended", flush=True)
    sys.stdin.read()          # on its way out: until the signal
""")


@pytest.mark.parametrize("state, code", [("preempted", 75), ("failed", -signal.SIGTERM)])
def test_a_signal_after_a_saved_stop_still_ends_with_75(tmp_path, state, code):
    proc = subprocess.Popen([sys.executable, "-c", RANK.format(root=str(ROOT), run_dir=str(tmp_path), state=state)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ended"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == code
    finally:
        proc.kill()
        proc.wait(timeout=60)
