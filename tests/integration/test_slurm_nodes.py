"""A real two-node Slurm cluster (tests/integration/slurm.py's `slurm_two_nodes`: two
slurmds in two network namespaces, tests/integration/netns.py): its nodes are two hosts,
each at its own address, and a requeued job that loses a node runs again on the other.

Root, Slurm's packages and network namespaces are needed, else these tests skip saying why.
"""

import json
import shlex
from types import SimpleNamespace

from paddle_dist.runs.layout import Run

from ..oracles import final_weights, max_difference, rank_statuses
from . import slurm
from .netns import IP_A, IP_B
from .procs import ROOT, check, run
from .slurm import NODE_A, NODE_B
from .test_slurm import _first_checkpoint

slurm_two_nodes_cluster, slurm_two_nodes = slurm.slurm_two_nodes_cluster, slurm.slurm_two_nodes  # fixtures

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "slurm_node.py"


def _records(text):
    """The JSON lines scripts/slurm_node.py printed, in order."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _where(records):
    """(node, address, SLURM_JOB_NUM_NODES) of each record: the srun tasks' by node, then
    the batch script's."""
    tasks = sorted((r for r in records if not r["waits"]), key=lambda r: r["SLURM_NODEID"])
    tasks += [r for r in records if r["waits"]]
    return [(r["SLURMD_NODENAME"], " ".join(r["addresses"]), r["SLURM_JOB_NUM_NODES"]) for r in tasks]


def test_srun_runs_a_task_on_each_node_at_its_own_address(slurm_two_nodes):
    cluster = slurm_two_nodes
    assert cluster.node_states() == {NODE_A: "idle", NODE_B: "idle"}
    result = check(run(cluster.cmd(["srun", "-N", "2", "--ntasks-per-node=1", "python", str(SCRIPT)]),
                       env=cluster.env, timeout=60))
    tasks = sorted(_records(result.stdout), key=lambda task: task["SLURM_NODEID"])
    assert [(t["SLURM_NODEID"], t["SLURMD_NODENAME"], t["addresses"], t["SLURM_JOB_NUM_NODES"])
            for t in tasks] == [("0", NODE_A, [IP_A], "2"), ("1", NODE_B, [IP_B], "2")], result.stdout


def test_a_requeued_job_that_lost_a_node_runs_again_on_the_other(slurm_two_nodes, tmp_path):
    """sbatch -N 1-2 --requeue: it starts on both nodes (Slurm gives as many as are free);
    requeued, with node B DOWN, it starts again (restart 1) on node A alone, and ends well
    once told to. (Without -n: with --ntasks-per-node=1 it got one node.)"""
    cluster, out, go = slurm_two_nodes, tmp_path / "job.out", tmp_path / "go"
    script = f"srun --ntasks-per-node=1 python {SCRIPT}; python {SCRIPT} --wait {go} --limit 60"
    submitted = cluster.client(["sbatch", "--parsable", "-N", "1-2", "--requeue", "--open-mode=append",
                                f"--output={out}", "--wrap", script])
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    def run_number(restart):
        """The records of run `restart` (its srun's tasks', then the batch script's) once
        that script waits, while the job runs."""
        def waiting():
            state = cluster.job(job_id).get("JobState")
            assert state in ("PENDING", "CONFIGURING", "RUNNING"), \
                f"job {job_id} is {state}:\n{out.read_text() if out.exists() else ''}"
            records = _records(out.read_text()) if out.exists() else []
            mine = [r for r in records if r["SLURM_RESTART_COUNT"] == restart]
            return mine if mine and mine[-1]["waits"] else None
        return cluster.wait_for(waiting, f"run {restart} of job {job_id}", timeout=60, poll_s=0.05)

    first = run_number(None)      # Slurm sets SLURM_RESTART_COUNT from the first restart on
    assert _where(first) == [(NODE_A, IP_A, "2"), (NODE_B, IP_B, "2"), (NODE_A, IP_A, "2")], first

    assert cluster.client(["scontrol", "requeue", job_id]).returncode == 0
    cluster.wait_for(lambda: cluster.job(job_id).get("JobState") == "PENDING", "the requeued job")
    cluster.set_node(NODE_B, "DOWN")
    cluster.wait_for(lambda: cluster.node_states().get(NODE_B, "").startswith("down"), f"{NODE_B} down")
    # Slurm holds a requeued job back for about two minutes (its BeginTime); let it go now.
    assert cluster.client(["scontrol", "update", f"JobId={job_id}", "StartTime=now"]).returncode == 0

    second = run_number("1")
    assert _where(second) == [(NODE_A, IP_A, "1"), (NODE_A, IP_A, "1")], second
    go.touch()

    def ended():
        job = cluster.job(job_id)
        return job if job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED") else None
    job = cluster.wait_for(ended, f"job {job_id} to end", timeout=60, poll_s=0.1)
    assert (job["JobState"], job["ExitCode"], job["Restarts"], job["NodeList"]) == \
        ("COMPLETED", "0:0", "1", NODE_A), out.read_text()


def test_a_second_slurmd_that_exits_at_its_start_is_named_with_its_errors(tmp_path):
    """Where slurmd refuses a second daemon on one host, slurm_two_nodes_cluster skips with
    this line (start raises Unavailable); where the first died too, it is a failure."""
    cluster = slurm.Cluster(root=tmp_path, host="h", env={}, nodes={NODE_A: IP_A, NODE_B: IP_B})
    (tmp_path / f"slurmd.{NODE_B}.log").write_text("[t] error: port in use\n[t] info\n[t] error: init failed\n")
    cluster.daemons = {f"slurmd.{NODE_A}": SimpleNamespace(poll=lambda: None),
                       f"slurmd.{NODE_B}": SimpleNamespace(poll=lambda: 1)}
    assert slurm._refused(cluster) == ("slurmd would not run a second daemon (nodeb) on this host: "
                                       "[t] error: port in use; [t] error: init failed")
    cluster.daemons[f"slurmd.{NODE_A}"] = SimpleNamespace(poll=lambda: 1)
    assert slurm._refused(cluster) == ""


# paddle_dist's own job, srun's task on each node its launcher (dist.nprocs=2 ranks a node).
TRAIN = ["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=16", "-o", "train.max_steps=60",
         "-o", "checkpoint.every_steps=5", "-o", "checkpoint.every_epochs=0", "-o", "train.log_samples=true",
         "-o", "dist.rendezvous_timeout=60",
         # SGD, as in test_elastic: Adam's normalisation magnifies float re-association.
         "-o", "train.optimizer=sgd", "-o", "train.lr=0.05"]


def _last_samples(run_dir):
    """global step -> the digest of its samples that the run logged last (a step redone
    after the requeue counts as it ran the second time)."""
    found = {}
    for line in Run(run_dir).samples.read_text().splitlines():
        if line.startswith("#"):      # an attempt's mark
            continue
        step, _, _, digest = line.split("\t")
        found[int(step)] = digest
    return found


def test_a_requeued_paddle_dist_job_that_lost_a_node_continues_on_the_other(slurm_two_nodes, tmp_path):
    """sbatch -N 1-2 --requeue of `srun --ntasks-per-node=1 python train.py -o dist.nprocs=2`:
    4 ranks on both nodes until the first checkpoint; requeued with node B DOWN, its 2 ranks
    on node A continue that run with 2 micro-batches a step, to the end, on the same samples
    in every step as an uninterrupted 4-rank run, and within float rounding of its weights."""
    cluster, run_dir, clean, out = slurm_two_nodes, tmp_path / "run", tmp_path / "clean", tmp_path / "job.out"
    train = shlex.join(["srun", "--ntasks-per-node=1", "python"] + TRAIN +
                       ["-o", "dist.nprocs=2", "-o", f"output.run_dir={run_dir}"])
    # The first host of the node list is a name (nodea) the namespaces do not resolve:
    # MASTER_ADDR says where node 0 is, as on a cluster without DNS for its nodes.
    script = f"export MASTER_ADDR={IP_A}; cd {shlex.quote(str(ROOT))}; {train}"
    submitted = cluster.client(["sbatch", "--parsable", "-N", "1-2", "--requeue", "--open-mode=append",
                                f"--output={out}", "--wrap", script])
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    _first_checkpoint(cluster, job_id, run_dir, out, timeout=120)
    assert cluster.job(job_id).get("NumNodes") == "2", cluster.job(job_id)

    assert cluster.client(["scontrol", "requeue", job_id]).returncode == 0
    cluster.wait_for(lambda: cluster.job(job_id).get("JobState") == "PENDING", "the requeued job")
    cluster.set_node(NODE_B, "DOWN")
    cluster.wait_for(lambda: cluster.node_states().get(NODE_B, "").startswith("down"), f"{NODE_B} down")
    # Slurm holds a requeued job back for about two minutes (its BeginTime); let it go now.
    assert cluster.client(["scontrol", "update", f"JobId={job_id}", "StartTime=now"]).returncode == 0

    # Meanwhile the uninterrupted run: 4 ranks on one host, no Slurm.
    check(run(TRAIN + ["-o", "dist.nprocs=4", "-o", f"output.run_dir={clean}"], timeout=300))

    def ended():
        job = cluster.job(job_id)
        return job if job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED") else None
    job = cluster.wait_for(ended, f"job {job_id} to end", timeout=300, poll_s=0.2)
    log = out.read_text()
    assert (job["JobState"], job["ExitCode"], job["Restarts"], job["NodeList"]) == \
        ("COMPLETED", "0:0", "1", NODE_A), log
    assert "srun task of node 1 of 2: it starts this node's 2 ranks" in log, log      # run 0: both nodes
    assert "srun task of node 0 of 1: it starts this node's 2 ranks" in log, log      # run 1: node A
    rank0 = Run(run_dir).rank_log(0).read_text()
    assert "continuing on 2 ranks (was 4): 2 micro-batches per step keep the global batch of 64" in rank0, rank0

    ran, went_on = _last_samples(clean), _last_samples(run_dir)
    assert sorted(ran) == sorted(went_on) == list(range(1, 61))
    assert went_on == ran
    assert max_difference(final_weights(clean), final_weights(run_dir)) <= 1e-6
    status = rank_statuses(run_dir)
    assert [(s["state"], s["step"]) for s in status] == [("done", 60), ("done", 60)]
    assert status[0]["weights_sha256"] == status[1]["weights_sha256"]
