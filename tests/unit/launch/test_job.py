"""Unit tests for paddle_dist.launch.job: an elastic job (`dist.nnodes=MIN:MAX`) goes on with the
machines that met, says which machine is lost, and plans their ranks. The whole story across two
hosts is tests/integration/test_elastic.py."""

import dataclasses
import json
from pathlib import Path

from paddle_dist import config as configlib
from paddle_dist.launch import job, jobspec
from paddle_dist.runs.topology import Meeting, Node
from paddle_dist.runtime import protocol


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
    monkeypatch.setattr(job, "_meet_and_name_run", lambda gate, cfg, run_dir, kept=None: (0, met, run_dir))
    planned = []
    monkeypatch.setattr(job.launcher, "launch", lambda p, **kw: planned.append((p, kw)) or 0)
    assert job._start(spec, 1, {0: Node(1, "127.0.0.1"), 1: Node(1, "127.0.0.2")}) == 0
    [(p, kw)] = planned
    assert (p.mode, p.direct, p.nprocs, p.gate, kw["met"]) == ("launch", True, 1, None, None)
    assert rendezvous_.closed        # its ranks meet on its loopback, not at the machines' meeting
    ran = json.loads(p.env[protocol.JOB_CONFIG])
    assert (ran["dist"]["nnodes"], ran["checkpoint"]["resume"]) == (1, "auto")
