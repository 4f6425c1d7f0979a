"""Several machines: two hosts in network namespaces (198.18.0.1 and 198.18.0.2, joined by
a veth pair), OpenMPI's mpirun, and ranks started by hand.

Every rank records a sha256 of its final weights in <run>/status/rank<N>.json: equal
digests prove the ranks ended in sync. Each job's processes run in their own session and
are checked for leftovers (procs.run).
"""

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .netns import two_hosts  # noqa: F401  (fixture)
from .procs import PY, check, needs_mpirun, run

JOB = ["-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=32", "-o", "train.max_steps=20",
       "-o", "checkpoint.every_epochs=0", "-o", "dist.rendezvous_timeout=60"]


def _digests(run_dir, ranks=2):
    records = [json.loads((run_dir / "status" / f"rank{r}.json").read_text()) for r in range(ranks)]
    assert [r["state"] for r in records] == ["done"] * ranks, records
    return {r["weights_sha256"] for r in records}


def _both(hosts, commands, timeout=180, succeed=True):
    """Run one command per namespace at the same time (each bounded and checked for
    leftover processes by procs.run); both must succeed, unless `succeed` is False."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = [pool.submit(run, hosts.cmd(ns, [PY] + argv), timeout) for ns, argv in commands]
        results = [f.result() for f in futures]
    for result in results if succeed else ():
        check(result)
    return results


def test_paddle_multinode_launch_across_two_hosts(two_hosts, tmp_path):
    master = f"{two_hosts.ip_a}:6170"
    nodes = ["train.py"] + JOB + ["-o", "dist.nnodes=2", "-o", f"dist.master={master}",
                                  "-o", f"output.run_dir={tmp_path}"]
    results = _both(two_hosts, [(two_hosts.a, nodes + ["-o", "dist.node_rank=0"]),
                                (two_hosts.b, nodes + ["-o", "dist.node_rank=1"])])
    assert "-o dist.node_rank=1" in results[0].stdout    # node 0 told us the other command
    assert "starting 1 rank on this machine (2 in all)" in results[0].stdout
    assert len(_digests(tmp_path)) == 1
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["test_samples"] == 1000


def test_hand_started_ranks_across_two_hosts(two_hosts, tmp_path):
    master = f"{two_hosts.ip_a}:6171"
    rank = ["train.py"] + JOB + ["--master", master, "--world-size", "2",
                                 "-o", f"output.run_dir={tmp_path}"]
    _both(two_hosts, [(two_hosts.a, rank + ["--rank", "0"]), (two_hosts.b, rank + ["--rank", "1"])])
    assert len(_digests(tmp_path)) == 1


def _two_by_two(hosts, run_dir, port, sync):
    """2 hosts x 2 ranks, started by train.py's multi-node launch on each host."""
    nodes = ["train.py"] + JOB + ["-o", "dist.nnodes=2", "-o", "dist.nprocs=2",
                                  "-o", f"dist.master={hosts.ip_a}:{port}",
                                  "-o", "checkpoint.every_epochs=1", "-o", f"output.run_dir={run_dir}",
                                  # SGD, as in test_sync_options: Adam's normalisation would
                                  # magnify the float re-association of the two sums' orders.
                                  "-o", "train.optimizer=sgd", "-o", "train.lr=0.05", *sync]
    _both(hosts, [(hosts.a, nodes + ["-o", "dist.node_rank=0", "-o", f"dist.host={hosts.ip_a}"]),
                  (hosts.b, nodes + ["-o", "dist.node_rank=1", "-o", f"dist.host={hosts.ip_b}"])],
          timeout=240)
    return _final(run_dir)


def _final(run_dir):
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return dict(sorted(np.load(run_dir / "checkpoints" / latest / "model.npz").items()))


def test_hierarchical_sync_across_two_hosts_of_two_ranks(two_hosts, tmp_path):
    """Shared memory within each host, gloo between the hosts' leaders: the 4 ranks end
    identical, and equal a flat gloo all-reduce's run within 1e-6."""
    hier = _two_by_two(two_hosts, tmp_path / "hier", 6172, [])
    assert len(_digests(tmp_path / "hier", ranks=4)) == 1
    log = (tmp_path / "hier" / "logs" / "rank0.log").read_text()
    assert "4 rank(s)" in log and "sync overlap (" in log and "over hierarchical" in log
    flat = _two_by_two(two_hosts, tmp_path / "flat", 6173, ["-o", "sync.transport=backend"])
    assert "over backend" in (tmp_path / "flat" / "logs" / "rank0.log").read_text()
    assert hier.keys() == flat.keys()
    assert max(float(np.abs(hier[k] - flat[k]).max()) for k in hier) <= 1e-6


def test_resume_across_hosts_with_separate_run_directories(two_hosts, tmp_path):
    """No shared storage: each host writes under a root of its own. After rank 1 (host b)
    is killed, the same commands continue the run: rank 0 reads the checkpoint and sends
    the state, and host b, which never had a checkpoint, ends with rank 0's weights, equal
    to an uninterrupted run's."""
    roots = {two_hosts.a: tmp_path / "a", two_hosts.b: tmp_path / "b"}
    job = ["train.py"] + JOB + ["-o", "dist.nnodes=2", "-o", f"dist.master={two_hosts.ip_a}:6174",
                                "-o", "checkpoint.every_steps=5"]

    def commands(extra=()):
        return [(ns, job + ["-o", f"dist.node_rank={node}", "-o", f"output.root={roots[ns]}", *extra])
                for node, ns in enumerate((two_hosts.a, two_hosts.b))]

    killed = _both(two_hosts, commands(["-o", "faults.inject=kill:1:12"]), succeed=False)
    assert killed[0].returncode != 0 and killed[1].returncode == 137, killed[0].stderr
    _both(two_hosts, commands())
    [run_a] = [d for d in roots[two_hosts.a].iterdir() if d.is_dir()]
    [run_b] = [d for d in roots[two_hosts.b].iterdir() if d.is_dir()]
    assert not list(roots[two_hosts.b].rglob("ckpt_*"))      # host b never had a checkpoint
    for log in (run_a / "logs" / "rank0.log", run_b / "logs" / "rank1.log"):
        assert f"resuming from {run_a}/checkpoints/ckpt_000000010" in log.read_text()
    digests = [json.loads((d / "status" / f"rank{r}.json").read_text())["weights_sha256"]
               for d, r in ((run_a, 0), (run_b, 1))]
    assert digests[0] == digests[1]
    clean = tmp_path / "clean"
    check(run(["train.py", "-o", "dist.nprocs=2"] + JOB + ["-o", "checkpoint.every_steps=5",
                                                        "-o", f"output.run_dir={clean}"], timeout=180))
    assert max(float(np.abs(a - b).max()) for a, b in
               zip(_final(run_a).values(), _final(clean).values())) <= 1e-6


def test_master_nobody_serves_fails_within_the_timeout(two_hosts, tmp_path):
    argv = two_hosts.cmd(two_hosts.b, [PY, "train.py"] + JOB + [
        "--master", f"{two_hosts.ip_a}:6172", "--world-size", "2", "--rank", "1",
        "-o", "dist.rendezvous_timeout=5", "-o", f"output.run_dir={tmp_path}"])
    result = run(argv, timeout=120)
    assert result.returncode != 0
    assert "not all 2 ranks arrived within 5 s" in result.stderr


def test_missing_interface_is_named_with_the_fix(two_hosts, tmp_path):
    argv = two_hosts.cmd(two_hosts.b, [PY, "train.py"] + JOB + [
        "--master", f"{two_hosts.ip_a}:6173", "--world-size", "2", "--rank", "1",
        "-o", "dist.nccl.socket_ifname=ens9", "-o", f"output.run_dir={tmp_path}"])
    result = run(argv, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ens9" in lines[0]
    assert f"socket_ifname={two_hosts.iface_b}" in lines[0]


# ------------------------------------------------------------------ OpenMPI
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_mpirun
def test_mpirun_runs_train_py(tmp_path):
    port = _free_port()
    check(run(["mpirun", "-n", "2", "--allow-run-as-root", "-x", "MASTER_ADDR=127.0.0.1",
               "-x", f"MASTER_PORT={port}", PY, "train.py"] + JOB + ["-o", f"output.run_dir={tmp_path}"],
              timeout=180))
    assert len(_digests(tmp_path)) == 1
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["test_samples"] == 1000   # exact evaluation


@needs_mpirun
def test_bare_mpirun_on_one_host_needs_no_variables(tmp_path):
    """MindSpore's `mpirun -n 8 python train.py`: every rank on this host, no MASTER_*."""
    result = check(run(["mpirun", "-n", "2", "--allow-run-as-root", PY, "train.py"] + JOB
                       + ["-o", f"output.run_dir={tmp_path}"], timeout=180))
    assert len(_digests(tmp_path)) == 1
    assert json.loads((tmp_path / "metrics.json").read_text())["world_size"] == 2
    assert "2 rank(s) via openmpi" in result.stdout + result.stderr


@needs_mpirun
def test_mpirun_mode_with_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    result = check(run(["train.py"] + JOB + ["-o", "dist.launcher=mpirun", "-o", f"dist.hostfile={hostfile}",
                                             "-o", f"output.run_dir={tmp_path / 'run'}"], timeout=180))
    assert "starting 2 ranks with mpirun" in result.stdout
    assert len(_digests(tmp_path / "run")) == 1
