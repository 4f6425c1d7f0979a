"""Unit tests for paddle_dist.launch.jobspec: what a job resolves once, here for an srun task of
an elastic job."""

import dataclasses

import pytest

from paddle_dist import config as configlib
from paddle_dist.errors import UserError
from paddle_dist.launch import jobspec


def test_an_srun_task_on_fewer_nodes_than_the_most_is_an_elastic_jobs_node():
    cfg = configlib.with_overrides(["dist.nnodes=1:2", "dist.master=10.0.0.1:6170", "dist.nprocs=2"])
    node = {"nnodes": 1, "node_rank": 0, "master": "10.0.0.1:6170"}
    assert jobspec._as_node_launcher(cfg, node).dist.nnodes == 1
    fixed = dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, min_nnodes=0))
    with pytest.raises(UserError, match="dist.nnodes=2, but srun started this task as node_rank 0 of 1"):
        jobspec._as_node_launcher(fixed, node)


def test_an_srun_task_of_two_nodes_takes_the_master_slurm_gives():
    cfg = configlib.with_overrides(["dist.nprocs=2"])
    node = jobspec._as_node_launcher(cfg, {"nnodes": 2, "node_rank": 1, "master": "10.0.0.1:12345"})
    assert (node.dist.nnodes, node.dist.node_rank, node.dist.master) == (2, 1, "10.0.0.1:12345")
