"""Elastic jobs (`dist.nnodes=MIN:MAX`): the config, the machines' meeting going on with
fewer, the job's plan for the machines that met, and the injected loss of a machine.
The whole story across two hosts is tests/integration/test_elastic.py."""

import dataclasses
import json
from pathlib import Path

import pytest

from paddle_dist import config as configlib
from paddle_dist.errors import ConfigError, UserError
from paddle_dist.launch import job, jobspec, launcher, rendezvous
from paddle_dist.runs.topology import Meeting, Node
from paddle_dist.runtime import inject, protocol

from tests.unit.launch.test_rendezvous import _Node, _listening


def _gate(port, node_rank, nnodes=3, min_nodes=2, timeout=5.0, last_call=0.2):
    return rendezvous.MeetingPlace(f"127.0.0.1:{port}", nnodes, node_rank, 2, timeout,
                                   min_nodes=min_nodes, last_call=last_call)


# ---------------------------------------------------------------- config
def test_nnodes_takes_min_colon_max_as_torchrun_does():
    cfg = configlib.with_overrides(["dist.nnodes=1:2", "dist.master=10.0.0.1:6170"])
    assert (cfg.dist.nnodes, cfg.dist.min_nnodes) == (2, 1)
    plain = configlib.with_overrides(["dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    assert (plain.dist.nnodes, plain.dist.min_nnodes) == (2, 0)
    gate = launcher.gate_of(cfg, 2)
    assert (gate.min_nodes, gate.last_call) == (1, 30.0)
    assert launcher.gate_of(plain, 2).min_nodes == 0


@pytest.mark.parametrize("overrides, says", [
    (["dist.nnodes=2:1"], "must be N or MIN:MAX with 1 <= MIN <= MAX, e.g. 1:2"),
    (["dist.nnodes=0:2"], "must be N or MIN:MAX"),
    (["dist.nnodes=2", "dist.min_nnodes=3"], "dist.min_nnodes=3 is above dist.nnodes=2; give dist.nnodes=3:3"),
])
def test_a_wrong_range_is_refused_with_the_fix(overrides, says):
    with pytest.raises(ConfigError) as e:
        configlib.with_overrides(overrides + ["dist.master=10.0.0.1:6170"])
    assert says in str(e.value)


# ---------------------------------------------------------------- meeting
def test_the_machines_that_met_go_on_renumbered_after_the_last_call():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0), keep=True)
    host.start()
    _listening(port)
    third = rendezvous.meet(_gate(port, 2))          # node_rank 1 never comes
    assert host.result() is None
    for met, me in ((host.met, 0), (third, 1)):
        assert met.absent == (1,) and met.node_rank == me and sorted(met.nodes) == [0, 1]
        assert met.world_size == 4 and met.ranks_of(me) == range(2 * me, 2 * me + 2)
    # Paddle's launchers number the machines as they went on: 0 and 1.
    assert sorted(host.met.rendezvous.nodes) == [0, 1]
    host.met.rendezvous.close()


def test_all_the_machines_go_at_once_without_a_last_call():
    port = launcher.free_port("127.0.0.1")
    nodes = [_Node(_gate(port, r, nnodes=2, min_nodes=1, last_call=3600)) for r in (0, 1)]
    for node in nodes:
        node.start()
    assert [node.result() for node in nodes] == [None, None]      # 20 s bound, not 3600
    assert [node.met.absent for node in nodes] == [(), ()]


def test_fewer_than_the_fewest_is_a_missing_node():
    port = launcher.free_port("127.0.0.1")
    with pytest.raises(rendezvous.NodesMissing) as e:
        rendezvous.meet(_gate(port, 0, timeout=0.5))
    assert "1 of 3 nodes" in str(e.value) and "missing node_rank 1, 2" in str(e.value)


def test_meeting_of_renumbers_in_node_rank_order():
    met = Meeting.of("run", {0: Node(2, "a"), 2: Node(1, "c"), 3: Node(2, "d")}, 4, node_rank=3)
    assert (met.node_rank, met.absent, met.world_size) == (2, (1,), 5)
    assert [met.nodes[i].address for i in range(3)] == ["a", "c", "d"]
    assert met.ranks_of(2) == range(3, 5)


# ---------------------------------------------------------------- the job
def test_the_job_goes_on_with_the_machines_that_met_and_says_which_is_lost(capsys):
    cfg = configlib.with_overrides(["dist.nnodes=2:3", "dist.master=10.0.0.1:6170", "dist.node_rank=2"])
    known = {0: Node(2, "10.0.0.1", "a"), 1: Node(2, "10.0.0.2", "b"), 2: Node(2, "10.0.0.3", "c")}
    met = Meeting.of("run", {0: known[0], 2: known[2]}, 3, node_rank=2)
    spec = jobspec.JobSpec(cfg, None, None, run_dir=Path("/runs/x"))
    job._say_without(met, cfg, dict(known))
    cfg2 = jobspec.attempt_config(spec, 1, met)          # a restart, with the machines that met
    assert (cfg2.dist.nnodes, cfg2.dist.node_rank, cfg2.dist.min_nnodes) == (2, 1, 0)
    assert (cfg2.output.run_dir, cfg2.checkpoint.resume, cfg2.faults.inject) == ("/runs/x", "auto", "")
    assert capsys.readouterr().out == (
        "paddle_dist: going on without node_rank 1 (b, 10.0.0.2): 2 of 3 machines (dist.nnodes=2:3), "
        "4 ranks (were 6); this machine is node_rank 1 now\n")
    every = Meeting.of("run", dict(known), 3, node_rank=2)
    job._say_without(every, cfg, {})
    assert capsys.readouterr().out == ""
    assert jobspec.attempt_config(spec, 0, every).to_dict() == configlib.derived(cfg, {"output.run_dir": "/runs/x"}).to_dict()


class _Closed:
    closed = False

    def close(self):
        self.closed = True


def test_a_machine_left_with_one_rank_starts_it_as_the_launchers_child(monkeypatch, tmp_path):
    """2 machines x 1 rank, node_rank 1 lost: node 0 goes on with 1 rank, which its launcher
    starts itself as any attempt's ranks (a plan of mode none would start nothing)."""
    cfg = configlib.with_overrides(["dist.nnodes=1:2", "dist.master=127.0.0.1:6170", "dist.nprocs=1"])
    spec = dataclasses.replace(jobspec.resolve(cfg, script="train.py", builtin=True), run_dir=tmp_path)
    rendezvous_ = _Closed()
    met = Meeting.of("run", {0: Node(1, "127.0.0.1")}, 2, node_rank=0, rendezvous=rendezvous_)
    monkeypatch.setattr(job, "_meet_and_name_run", lambda gate, cfg, run_dir: (0, met, run_dir))
    planned = []
    monkeypatch.setattr(job.launcher, "launch", lambda p, **kw: planned.append((p, kw)) or 0)
    assert job._start(spec, 1, {0: Node(1, "127.0.0.1"), 1: Node(1, "127.0.0.2")}) == 0
    [(p, kw)] = planned
    assert (p.mode, p.direct, p.nprocs, p.gate, kw["met"]) == ("launch", True, 1, None, None)
    assert rendezvous_.closed        # its ranks meet on its loopback, not at the machines' meeting
    ran = json.loads(p.env[protocol.JOB_CONFIG])
    assert (ran["dist"]["nnodes"], ran["checkpoint"]["resume"]) == (1, "auto")


def test_an_srun_task_on_fewer_nodes_than_the_most_is_an_elastic_jobs_node():
    cfg = configlib.with_overrides(["dist.nnodes=1:2", "dist.master=10.0.0.1:6170", "dist.nprocs=2"])
    node = {"nnodes": 1, "node_rank": 0, "master": "10.0.0.1:6170"}
    assert jobspec._as_node_launcher(cfg, node).dist.nnodes == 1
    fixed = dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, min_nnodes=0))
    with pytest.raises(UserError, match="dist.nnodes=2, but srun started this task as node_rank 0 of 1"):
        jobspec._as_node_launcher(fixed, node)


# ---------------------------------------------------------------- faults.inject=lose
@pytest.mark.parametrize("parent_cmdline, killed", [
    (["python", "-m", "paddle.distributed.launch", "--nnodes", "2", "train.py"], 100),   # its launcher's
    (["python", "train.py"], 200),                                                       # its parent
])
def test_lose_kills_the_machines_paddle_dist_launcher(monkeypatch, parent_cmdline, killed):
    monkeypatch.setattr(inject.os, "getppid", lambda: 200)
    monkeypatch.setattr(inject.procfs, "cmdline", lambda pid: parent_cmdline if pid == 200 else [])
    monkeypatch.setattr(inject.procfs, "parent_of", lambda pid: 100)
    assert inject._machine_launcher() == killed


def test_an_srun_task_of_two_nodes_takes_the_master_slurm_gives():
    cfg = configlib.with_overrides(["dist.nprocs=2"])
    node = jobspec._as_node_launcher(cfg, {"nnodes": 2, "node_rank": 1, "master": "10.0.0.1:12345"})
    assert (node.dist.nnodes, node.dist.node_rank, node.dist.master) == (2, 1, "10.0.0.1:12345")
