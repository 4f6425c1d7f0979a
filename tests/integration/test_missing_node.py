"""A multi-node launch whose machines do not all arrive ends with exit 3 within
dist.rendezvous_timeout, naming the missing node_ranks; a stop request during the wait
ends it at once; a healthy one still trains. Both "machines" are processes on loopback
(the job's processes are bounded and checked for leftovers: procs.run). And doctor --check
says what a job's start says about a master without a route (in a namespace that has none).
"""

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from ..oracles import free_port, rank_statuses
from .netns import two_hosts  # noqa: F401  (fixture)
from .procs import PY, ROOT, check, run, settled_session

JOB = ["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=32",
       "-o", "train.max_steps=10", "-o", "checkpoint.every_epochs=0", "-o", "dist.nnodes=2"]



def _node(rank, port, run_dir, timeout=10):
    return JOB + ["-o", f"dist.master=127.0.0.1:{port}", "-o", f"dist.node_rank={rank}",
                  "-o", f"dist.rendezvous_timeout={timeout}", "-o", f"output.run_dir={run_dir}"]


@pytest.mark.waits
def test_node_0_alone_ends_with_3_naming_the_missing_node(tmp_path):
    result = run(_node(0, free_port(), tmp_path), timeout=25)
    assert result.returncode == 3, result.stderr
    assert "1 of 2 nodes (1 rank: node_rank 0 from 127.0.0.1) arrived within 10 s" in result.stderr
    assert "missing node_rank 1; start it with the command node 0 printed" in result.stderr


@pytest.mark.waits
def test_node_1_alone_ends_with_3_saying_node_0_did_not_answer(tmp_path):
    port = free_port()
    result = run(_node(1, port, tmp_path, timeout=3), timeout=25)
    assert result.returncode == 3, result.stderr
    assert f"node 0 did not answer at dist.master 127.0.0.1:{port} within 3 s (node_rank 0 missing)" \
        in result.stderr


@pytest.mark.waits
def test_paddle_dist_launch_meets_the_same_way(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("raise SystemExit('the ranks must not start')\n")
    result = run(["-m", "paddle_dist.launch", "-o", "dist.nnodes=2", "-o", f"dist.master=127.0.0.1:{free_port()}",
                  "-o", "dist.rendezvous_timeout=5", "--log_dir", str(tmp_path / "log"), str(script)],
                 timeout=25)
    assert result.returncode == 3, result.stderr
    assert "missing node_rank 1" in result.stderr


def test_sigterm_while_waiting_ends_the_node_at_once(tmp_path):
    proc = subprocess.Popen([PY] + _node(0, free_port(), tmp_path, timeout=120), cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:             # the wait has begun
            if "waiting for the other machines" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = settled_session(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    assert proc.returncode == 143, err
    assert "stopped on request while waiting for the other machines (exit 143)" in err


def test_two_nodes_on_loopback_still_train_in_sync(tmp_path):
    port = free_port()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, _node(rank, port, tmp_path, timeout=60), 180) for rank in (0, 1)]
        results = [check(f.result()) for f in futures]
    assert "waiting for the other machines" in results[0].stdout
    records = rank_statuses(tmp_path)
    assert [r["state"] for r in records] == ["done", "done"]
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]


def test_doctor_check_and_a_job_agree_on_a_master_without_route(two_hosts, tmp_path):
    """The namespace has no default route: 198.19.5.5 is unreachable and nothing is sent."""
    options = ["-o", "dist.master=198.19.5.5:6170", "-o", "dist.nnodes=2"]
    doctor = run(two_hosts.cmd(two_hosts.b, [PY, "-m", "paddle_dist.doctor", "--check"] + options),
                 timeout=60)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "pre-flight: ok" not in doctor.stdout
    [error] = [line for line in doctor.stdout.splitlines() if line.startswith("error: ")]
    assert "no route from this machine to master 198.19.5.5" in error
    job = run(two_hosts.cmd(two_hosts.b, [PY, "train.py", "-o", f"output.run_dir={tmp_path}"] + options),
              timeout=60)
    assert job.returncode == 2
    assert error in job.stderr
