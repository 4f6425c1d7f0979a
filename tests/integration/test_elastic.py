"""Elastic restart across two hosts in network namespaces (198.18.0.1 and 198.18.0.2): a
job of 2 machines x 2 ranks that may go on with one (`dist.nnodes=1:2`) loses host B's
launcher mid-epoch (faults.inject=lose: SIGKILL of the launcher at an exact step, its ranks
with it). Host A's ranks fail, its launcher restarts them (dist.max_restarts), meets again,
goes on alone after dist.last_call seconds, and its 2 ranks continue the 4-rank checkpoint
with 2 micro-batches a step: the uninterrupted 4-rank run within float rounding, on the
same samples in every step.
"""

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from paddle_dist.runs.layout import Run

from ..oracles import checkpoint_arrays, latest_checkpoint, max_difference, rank_status, rank_statuses, read_metrics
from .netns import two_hosts  # noqa: F401  (fixture)
from .procs import PY, check, finish, run, start

JOB = ["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=16", "-o", "train.max_steps=24",
       "-o", "checkpoint.every_steps=5", "-o", "checkpoint.every_epochs=0", "-o", "dist.nprocs=2",
       "-o", "dist.rendezvous_timeout=60", "-o", "train.log_samples=true",
       # SGD, as in test_multinode: Adam's normalisation magnifies float re-association.
       "-o", "train.optimizer=sgd", "-o", "train.lr=0.05"]


def _both(hosts, run_dir: Path, port: int, *extra: str):
    """The job on both hosts at once, each bounded and checked for leftovers (procs.run)."""
    job = JOB + ["-o", f"dist.master={hosts.ip_a}:{port}", "-o", f"output.run_dir={run_dir}", *extra]
    commands = [(hosts.a, job + ["-o", "dist.node_rank=0", "-o", f"dist.host={hosts.ip_a}"]),
                (hosts.b, job + ["-o", "dist.node_rank=1", "-o", f"dist.host={hosts.ip_b}"])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, hosts.cmd(ns, [PY] + argv), 300) for ns, argv in commands]
        return [f.result() for f in futures]


def _latest(run_dir: Path) -> dict:
    return checkpoint_arrays(latest_checkpoint(run_dir), ["model", "optimizer"])


def _samples(run_dir: Path) -> dict:
    """global step -> the digests of its samples that the run's attempts logged."""
    found: dict = {}
    for line in Run(run_dir).samples.read_text().splitlines():
        if line.startswith("#"):      # an attempt's mark
            continue
        step, _, _, digest = line.split("\t")
        found.setdefault(int(step), set()).add(digest)
    return found


def test_a_lost_host_leaves_the_other_to_finish_the_run_alone(two_hosts, tmp_path):
    clean = tmp_path / "clean"
    for result in _both(two_hosts, clean, 6181, "-o", "dist.nnodes=2"):
        check(result)
    # The loop level: the launcher's part is the same at both; a hapi run continued on
    # another number of ranks is tests/integration/test_whole_state.py's.
    _lose_host_b(two_hosts, clean, tmp_path / "loop", 6182, "loop")


def _lose_host_b(two_hosts, clean: Path, out: Path, port: int, api: str) -> None:
    a, b = _both(two_hosts, out, port, "-o", "dist.nnodes=1:2", "-o", "dist.max_restarts=1",
                 "-o", "dist.last_call=2", "-o", "faults.inject=lose:2:12", "-o", f"train.api={api}")
    assert b.returncode == -9, (b.returncode, b.stderr[-2000:])          # host B's launcher: SIGKILL
    check(a)
    assert "paddle_dist: restart 1/1 from the latest checkpoint" in a.stdout, a.stdout
    assert (f"paddle_dist: going on without node_rank 1 ({socket.gethostname()}, {two_hosts.ip_b}): 1 of 2 machines "
            "(dist.nnodes=1:2), 2 ranks (were 4)") in a.stdout, a.stdout
    log = Run(out).rank_log(0).read_text()
    assert "continuing on 2 ranks (was 4): 2 micro-batches per step keep the global batch of 64" in log
    assert f"api {api}" in log and "resuming from" in log and "ckpt_000000010" in log

    # The same samples in every optimizer step, the steps redone after the loss included.
    ran, went_on = _samples(clean), _samples(out)
    assert sorted(ran) == sorted(went_on) == list(range(1, 25))
    assert all(len(ran[s]) == 1 and went_on[s] == ran[s] for s in ran)
    # Weights and optimizer state within float rounding of the uninterrupted 4-rank run.
    want, got = _latest(clean), _latest(out)
    assert max_difference(want, got) <= 1e-6
    status = rank_statuses(out)
    assert [s["state"] for s in status] == ["done", "done"]
    assert not Run(out).rank_status(2).exists()      # host B's old records went
    assert status[0]["weights_sha256"] == status[1]["weights_sha256"]


# Another user of host A (uid 65534) who, once node 0 listens at dist.master, tries to
# listen there too every millisecond, and holds the port once it has it.
TAKER = """
import socket, sys, time
ip, port = sys.argv[1], int(sys.argv[2])
def listening():
    rows = open("/proc/net/tcp").read().splitlines()[1:]
    return any(r.split()[1].endswith(":%04X" % port) and r.split()[3] == "0A" for r in rows)
while not listening():
    time.sleep(0.01)
print("armed", flush=True)
while True:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((ip, port))
        s.listen(1)
    except OSError:
        s.close()
        time.sleep(0.001)
        continue
    print("took the port", flush=True)
    time.sleep(3600)
"""


def test_a_machine_of_one_rank_lost_leaves_the_other_to_finish_on_one_rank(two_hosts, tmp_path):
    """2 machines x 1 rank: host A's launcher goes on with its one rank, started as its child
    like any attempt's ranks, which finishes the run with 2 micro-batches a step. Meanwhile
    another user of host A tries to take dist.master's port (issue 53, finding 7: node 0
    listened again for each attempt, and whoever took the port in between ended the job):
    node 0 keeps it for the whole job, and the job is unaffected."""
    out, port = tmp_path / "one", 6183
    taker, killer = start(two_hosts.cmd(two_hosts.a, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                                      "--", PY, "-S", "-c", TAKER, two_hosts.ip_a, str(port)]), 300)
    try:
        a, b = _both(two_hosts, out, port, "-o", "dist.nprocs=1", "-o", "dist.nnodes=1:2",
                     "-o", "dist.max_restarts=1", "-o", "dist.last_call=2", "-o", "faults.inject=lose:1:12")
    finally:
        taker.kill()
        said, _ = finish(taker, killer)
    assert said.startswith("armed"), said      # it tried from node 0's first listen (and got the port once the job ended)
    assert b.returncode == -9, (b.returncode, b.stderr[-2000:])
    check(a)
    assert (f"paddle_dist: going on without node_rank 1 ({socket.gethostname()}, {two_hosts.ip_b}): 1 of 2 machines "
            "(dist.nnodes=1:2), 1 rank (were 2)") in a.stdout, a.stdout
    log = Run(out).rank_log(0).read_text()
    assert "continuing on 1 rank (was 2): 2 micro-batches per step keep the global batch of 32" in log, log
    assert sorted(_samples(out)) == list(range(1, 25))
    assert read_metrics(out)["steps"] == 24
    assert rank_status(out, 0)["state"] == "done"
    assert not Run(out).rank_status(1).exists()
