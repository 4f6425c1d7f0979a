"""Several machines: two hosts in network namespaces (198.18.0.1 and 198.18.0.2, joined by
a veth pair), OpenMPI's mpirun, and ranks started by hand.

Every rank records a sha256 of its final weights in <run>/status/rank<N>.json: equal
digests prove the ranks ended in sync. Each job's processes run in their own session and
are checked for leftovers (procs.run).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from paddle_dist import errors
from paddle_dist.runs.layout import Run

from ..oracles import final_weights, free_port, max_difference, rank_status, rank_statuses, read_metrics
from .netns import two_hosts  # noqa: F401  (fixture)
from .procs import PY, check, needs_mpirun, run

JOB = ["-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=32", "-o", "train.max_steps=20",
       "-o", "checkpoint.every_epochs=0", "-o", "dist.rendezvous_timeout=60"]


def _digests(run_dir, ranks=2):
    records = rank_statuses(run_dir, ranks)
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
    metrics = read_metrics(tmp_path)
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
    return final_weights(run_dir)


def test_hierarchical_sync_across_two_hosts_of_two_ranks(two_hosts, tmp_path):
    """Shared memory within each host, gloo between the hosts' leaders: the 4 ranks end
    identical, and equal a flat gloo all-reduce's run within 1e-6."""
    hier = _two_by_two(two_hosts, tmp_path / "hier", 6172, [])
    assert len(_digests(tmp_path / "hier", ranks=4)) == 1
    log = Run(tmp_path / "hier").rank_log(0).read_text()
    assert "4 rank(s)" in log and "sync overlap (" in log and "over hierarchical" in log
    flat = _two_by_two(two_hosts, tmp_path / "flat", 6173, ["-o", "sync.transport=backend"])
    assert "over backend" in Run(tmp_path / "flat").rank_log(0).read_text()
    assert max_difference(hier, flat) <= 1e-6


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
    for log in (Run(run_a).rank_log(0), Run(run_b).rank_log(1)):
        assert f"resuming from {run_a}/checkpoints/ckpt_000000010" in log.read_text()
    digests = [rank_status(d, r)["weights_sha256"] for d, r in ((run_a, 0), (run_b, 1))]
    assert digests[0] == digests[1]
    clean = tmp_path / "clean"
    check(run(["train.py", "-o", "dist.nprocs=2"] + JOB + ["-o", "checkpoint.every_steps=5",
                                                        "-o", f"output.run_dir={clean}"], timeout=180))
    assert max_difference(final_weights(run_a), final_weights(clean)) <= 1e-6


def _as_host(hosts, ns, name, argv):
    """`argv` run in namespace `ns` under host name `name` (a UTS namespace of its own), so
    that the two hosts' reports can be told apart as on two real machines."""
    return hosts.cmd(ns, ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, PY] + argv)


def _separate(hosts, tmp_path, port, nprocs=1, extra=()):
    """(node 0's command, node 1's command): a multi-node launch with a root of its own on
    each host (no shared storage), under host names nodeA and nodeB."""
    roots = {0: tmp_path / "a", 1: tmp_path / "b"}
    job = ["train.py"] + JOB + ["-o", "dist.nnodes=2", "-o", f"dist.master={hosts.ip_a}:{port}",
                                "-o", f"dist.nprocs={nprocs}", "-o", "train.log_every=5", *extra]
    return roots, [_as_host(hosts, ns, name, job + ["-o", f"dist.node_rank={node}",
                                                    "-o", f"output.root={roots[node]}"])
                   for node, (ns, name) in enumerate(((hosts.a, "nodeA"), (hosts.b, "nodeB")))]


def _both_argv(commands, timeout=180):
    """Run full command lines at the same time, each bounded and checked for leftovers."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return [f.result() for f in [pool.submit(run, argv, timeout) for argv in commands]]


def test_each_job_gets_one_run_of_one_name_on_every_host_and_node_1_prints(two_hosts, tmp_path):
    """Two jobs in a row with the same master: two runs, each named alike on both hosts
    (node 0 names them), each rank log holding one run; node 1 prints its progress and end."""
    roots, commands = _separate(two_hosts, tmp_path, 6175)
    for _ in range(2):
        results = [check(r) for r in _both_argv(commands)]
    runs = {node: sorted(d.name for d in roots[node].iterdir() if d.is_dir()) for node in roots}
    assert len(runs[0]) == 2 and runs[0] == runs[1], runs
    for name in runs[1]:
        log = Run(roots[1] / name).rank_log(1).read_text()
        assert log.count("rank(s) via paddle_launch") == 1, log
    out = results[1].stdout
    assert f"this machine's outputs in {roots[1].resolve() / runs[1][1]}" in out
    assert "[node 1 nodeB] epoch 1/1 step 5/63 loss" in out
    assert "[node 1 nodeB] finished: 20 steps" in out
    assert "[node 0 nodeA] epoch 1/1 step 5/63 loss" in results[0].stdout


def test_a_rank_killed_on_node_1_is_named_by_its_global_rank_and_host_on_both(two_hosts, tmp_path):
    """2 hosts x 2 ranks, rank 3 (node 1's second rank) SIGKILLed: node 1's report names
    rank 3 on nodeB and rank 2 as its consequence; node 0, whose ranks only saw their
    connection break, names node 1 and its ranks and says that machine's report has it."""
    _, commands = _separate(two_hosts, tmp_path, 6176, nprocs=2,
                            extra=["-o", "faults.inject=kill:3:12"])
    node0, node1 = _both_argv(commands, timeout=240)
    # Paddle's launcher, not paddle_dist's, waits for node 1's ranks: when it reports rank 2's
    # exit first, rank 3's own code is never seen, only its unrecorded death.
    seen = "Root cause: rank 3 (host nodeB) killed by SIGKILL" in node1.stderr
    unseen = "Root cause: rank 3 (host nodeB) died without reporting an error" in node1.stderr
    assert (seen and node1.returncode == 137) or (unseen and node1.returncode == 1), node1.stderr
    assert "stopped as a consequence: rank 2 (host nodeB)" in node1.stderr
    assert node0.returncode == errors.EXIT_PEER, node0.stderr
    assert ("Root cause: a rank on another machine, node 1 (host nodeB at 198.18.0.2, ranks 2-3)"
            in node0.stderr), node0.stderr
    assert "that machine's report names the rank and why" in node0.stderr
    assert "stopped as a consequence: rank 0 (host nodeA), rank 1 (host nodeA)" in node0.stderr
    assert "before any rank reported" not in node0.stderr


@pytest.mark.waits
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

@needs_mpirun
def test_mpirun_runs_train_py(tmp_path):
    port = free_port()
    check(run(["mpirun", "-n", "2", "--allow-run-as-root", "-x", "MASTER_ADDR=127.0.0.1",
               "-x", f"MASTER_PORT={port}", PY, "train.py"] + JOB + ["-o", f"output.run_dir={tmp_path}"],
              timeout=180))
    assert len(_digests(tmp_path)) == 1
    metrics = read_metrics(tmp_path)
    assert metrics["world_size"] == 2 and metrics["test_samples"] == 1000   # exact evaluation


@needs_mpirun
def test_bare_mpirun_on_one_host_needs_no_variables(tmp_path):
    """MindSpore's `mpirun -n 8 python train.py`: every rank on this host, no MASTER_*."""
    result = check(run(["mpirun", "-n", "2", "--allow-run-as-root", PY, "train.py"] + JOB
                       + ["-o", f"output.run_dir={tmp_path}"], timeout=180))
    assert len(_digests(tmp_path)) == 1
    assert read_metrics(tmp_path)["world_size"] == 2
    assert "2 rank(s) via openmpi" in result.stdout + result.stderr


@needs_mpirun
def test_mpirun_mode_with_a_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    result = check(run(["train.py"] + JOB + ["-o", "dist.launcher=mpirun", "-o", f"dist.hostfile={hostfile}",
                                             "-o", f"output.run_dir={tmp_path / 'run'}"], timeout=180))
    assert "starting 2 ranks with mpirun" in result.stdout
    assert len(_digests(tmp_path / "run")) == 1
