"""Unit tests for paddle_dist.runtime.variables: the variables a rank gets from its launcher, those
for child processes (NCCL, threads), Paddle's variables translated from another launcher's, and
what prepare_process_group exports."""

import dataclasses
import os

import pytest

from paddle_dist.config import Config, load
from paddle_dist.runtime import paddle_import, variables as varlib
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import DistEnv, detect
from paddle_dist.runtime.variables import paddle_variables, rank_variables
from paddle_dist.schema import NcclConfig
from paddle_dist.runtime.paddle_import import OMP_CHOSEN
from paddle_dist.errors import UserError

from tests.conftest import environ_diff
from tests.unit.runtime.test_env import (BY_HAND_RANK1, FOUR_GPUS, LAUNCH_2x2_RANK3, MPIRUN_2x2_RANK3, SBATCH_SCRIPT,
                                         SPAWN_RANK1, SRUN_2x2_RANK3, SRUN_MASTER, TORCHRUN_2x2_RANK3)

NCCL = Config().dist.nccl

CPU_BUILD = GpuInfo(False, 0)


def test_rank_variables_are_what_paddles_launcher_sets():
    first, second = rank_variables(2, (), 6170)
    assert first["PADDLE_MASTER"] == second["PADDLE_MASTER"] == "127.0.0.1:6170"
    assert (first["PADDLE_TRAINER_ID"], second["PADDLE_TRAINER_ID"]) == ("0", "1")
    assert second["PADDLE_LOCAL_RANK"] == second["PADDLE_RANK_IN_NODE"] == "1"
    assert second["PADDLE_TRAINERS_NUM"] == second["PADDLE_GLOBAL_SIZE"] == "2"
    assert second["PADDLE_NNODES"] == "1" and second["PADDLE_DISTRI_BACKEND"] == "gloo"
    endpoints = second["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert endpoints[1] == second["PADDLE_CURRENT_ENDPOINT"] and len(set(endpoints)) == 2
    assert "FLAGS_selected_gpus" not in second
    gpu = rank_variables(2, ("0", "1"), 6170)[1]
    assert gpu["FLAGS_selected_gpus"] == "1" and "PADDLE_DISTRI_BACKEND" not in gpu


def test_ranks_as_detected_from_the_variables_they_get():
    variables = rank_variables(2, (), 6170)[1]
    env = detect(gpu_info=CPU_BUILD, environ=variables)
    assert (env.global_rank, env.local_rank, env.world_size, env.master) == (1, 1, 2, "127.0.0.1:6170")


def test_a_thread_count_the_launcher_chose_is_marked_and_the_users_is_left_alone():
    """The mark lets a rank's paddle import leave out Paddle's warning about a count above 1
    (runtime/paddle_import.py): one rank on 2 cores gets 2 threads, and no warning."""
    chosen = varlib.worker_variables(NCCL, nprocs=1, cpu_count=2, environ={})
    assert chosen["OMP_NUM_THREADS"] == chosen[paddle_import.OMP_CHOSEN] == "2"
    assert varlib.worker_variables(NCCL, nprocs=2, cpu_count=16, environ={})[paddle_import.OMP_CHOSEN] == "8"
    users = varlib.worker_variables(NCCL, nprocs=1, cpu_count=2, environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in users and paddle_import.OMP_CHOSEN not in users


# ---------------------------------------------------------------- variables for children
def test_nccl_variables_maps_every_set_field():
    nccl = NcclConfig(socket_ifname="eth0", ib_hca="mlx5_0,mlx5_1", ib_disable=True,
                      p2p_disable=False, debug="INFO", debug_subsys="INIT,NET",
                      extra={"NCCL_ALGO": "Ring"})
    assert varlib.nccl_variables(nccl) == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_DISABLE": "0",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_ALGO": "Ring",
    }


def test_nccl_variables_omits_unset_fields():
    assert varlib.nccl_variables(NcclConfig()) == {}
    assert varlib.nccl_variables(NcclConfig(ib_disable=False)) == {"NCCL_IB_DISABLE": "0"}
    assert varlib.nccl_variables(NcclConfig(debug="WARN")) == {"NCCL_DEBUG": "WARN"}


def test_nccl_variables_from_a_loaded_config():
    cfg = load(overrides=["dist.nccl.socket_ifname=^lo,docker", "dist.nccl.ib_disable=true"])
    assert varlib.nccl_variables(cfg.dist.nccl) == {"NCCL_SOCKET_IFNAME": "^lo,docker",
                                                    "NCCL_IB_DISABLE": "1"}


@pytest.mark.parametrize("cores, nprocs, threads", [(8, 2, "4"), (8, 3, "2"), (3, 4, "1"),
                                                    (1, 1, "1"), (16, 1, "16")])
def test_worker_variables_shares_cores_between_ranks(cores, nprocs, threads):
    out = varlib.worker_variables(load().dist.nccl, nprocs, cpu_count=cores, environ={})
    assert out == {"OMP_NUM_THREADS": threads, OMP_CHOSEN: threads}     # marked as the launcher's


def test_worker_variables_keeps_the_users_omp_num_threads():
    out = varlib.worker_variables(load().dist.nccl, 2, cpu_count=8, environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in out


def test_worker_variables_includes_nccl_settings():
    cfg = load(overrides=["dist.nccl.debug=INFO", "dist.nccl.extra={NCCL_ALGO: Tree}"])
    out = varlib.worker_variables(cfg.dist.nccl, 2, cpu_count=4, environ={})
    assert out == {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree", "OMP_NUM_THREADS": "2", OMP_CHOSEN: "2"}


def test_worker_variables_shares_cores_when_the_user_did_not_set_omp(environ_before_paddle):
    if "OMP_NUM_THREADS" in environ_before_paddle:
        pytest.skip("OMP_NUM_THREADS was set when the tests started")
    out = varlib.worker_variables(load().dist.nccl, 2, cpu_count=8)   # the real os.environ
    assert out.get("OMP_NUM_THREADS") == "4"


def test_child_environ_adds_to_ours(monkeypatch):
    monkeypatch.setenv("PADDLE_DIST_TEST_KEEP", "y")
    child = varlib.child_environ({"PADDLE_DIST_TEST_NEW": "1"})
    assert child["PADDLE_DIST_TEST_NEW"] == "1"
    assert child["PADDLE_DIST_TEST_KEEP"] == "y"
    assert "PADDLE_DIST_TEST_NEW" not in os.environ


def test_child_environ_leaves_out_an_inherited_flags_selected_gpus(monkeypatch):
    # The launcher places its ranks itself; under mpirun they pick their GPU by local rank.
    monkeypatch.setenv("FLAGS_selected_gpus", "0")
    assert "FLAGS_selected_gpus" not in varlib.child_environ({"PADDLE_DIST_TEST_NEW": "1"})
    assert varlib.child_environ({"FLAGS_selected_gpus": "1"})["FLAGS_selected_gpus"] == "1"


def test_export_and_restore_round_trip(monkeypatch):
    monkeypatch.delenv("PADDLE_DIST_TEST_NEW", raising=False)
    monkeypatch.setenv("PADDLE_DIST_TEST_OLD", "before")
    old = varlib.export({"PADDLE_DIST_TEST_NEW": 3, "PADDLE_DIST_TEST_OLD": "after"})
    assert old == {"PADDLE_DIST_TEST_NEW": None, "PADDLE_DIST_TEST_OLD": "before"}
    assert os.environ["PADDLE_DIST_TEST_NEW"] == "3"
    assert os.environ["PADDLE_DIST_TEST_OLD"] == "after"
    varlib.restore(old)
    assert "PADDLE_DIST_TEST_NEW" not in os.environ
    assert os.environ["PADDLE_DIST_TEST_OLD"] == "before"


PROCESS_GROUP_VARIABLES = ("PADDLE_DISTRI_BACKEND", "FLAGS_selected_gpus", "NCCL_SOCKET_IFNAME",
                           "NCCL_IB_DISABLE", "NCCL_ALGO", "PADDLE_TRAINER_ID",
                           "PADDLE_TRAINERS_NUM", "PADDLE_MASTER", "MASTER_ADDR", "MASTER_PORT",
                           "PADDLE_CURRENT_ENDPOINT", "PADDLE_TRAINER_ENDPOINTS",
                           "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK", "PADDLE_LOCAL_SIZE",
                           "PADDLE_NNODES")


@pytest.fixture
def process_group_variables(monkeypatch):
    """Let prepare_process_group write its variables; monkeypatch puts them back afterwards."""
    for name in PROCESS_GROUP_VARIABLES:
        monkeypatch.setenv(name, "unset-by-test")   # recorded, so undo restores the original
        monkeypatch.delenv(name)


def test_prepare_process_group_on_gpu(process_group_variables):
    cfg = load(overrides=["dist.nccl.socket_ifname=eth0", "dist.nccl.ib_disable=true",
                          "dist.nccl.extra={NCCL_ALGO: Ring}"])
    env = DistEnv(launcher="paddle_launch", global_rank=1, local_rank=1, world_size=2,
                  local_world_size=2, device="gpu:1", backend="nccl")
    varlib.prepare_process_group(env, cfg.dist.nccl)
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "nccl"
    assert os.environ["FLAGS_selected_gpus"] == "1"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "eth0"
    assert os.environ["NCCL_IB_DISABLE"] == "1"
    assert os.environ["NCCL_ALGO"] == "Ring"


def test_prepare_process_group_on_cpu(process_group_variables):
    env = DistEnv(launcher="spawn", global_rank=0, world_size=2, local_world_size=2,
                  device="cpu", backend="gloo")
    varlib.prepare_process_group(env, load().dist.nccl)
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "gloo"
    assert "FLAGS_selected_gpus" not in os.environ
    assert "NCCL_SOCKET_IFNAME" not in os.environ


def test_prepare_process_group_standalone_sets_nothing(process_group_variables):
    before = dict(os.environ)
    varlib.prepare_process_group(DistEnv(), load().dist.nccl)
    assert environ_diff(before, os.environ) == []


# ---------------------------------------------------------------- paddle_variables
def test_paddle_variables_for_mpirun():
    env = detect(gpu_info=CPU_BUILD, environ=MPIRUN_2x2_RANK3)
    assert paddle_variables(env) == {
        "PADDLE_TRAINER_ID": "3",
        "PADDLE_TRAINERS_NUM": "4",
        "PADDLE_MASTER": "10.0.0.1:29500",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "PADDLE_CURRENT_ENDPOINT": "10.0.0.1:29504",
        "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:29504",
        "PADDLE_RANK_IN_NODE": "1",
        "PADDLE_LOCAL_RANK": "1",
        "PADDLE_LOCAL_SIZE": "2",
        "PADDLE_NNODES": "2",
    }


def test_paddle_variables_for_srun():
    out = paddle_variables(detect(gpu_info=CPU_BUILD, environ=SRUN_2x2_RANK3))
    assert out["PADDLE_MASTER"] == SRUN_MASTER
    assert (out["MASTER_ADDR"], out["MASTER_PORT"]) == ("gpu07", "15456")
    assert (out["PADDLE_TRAINER_ID"], out["PADDLE_TRAINERS_NUM"]) == ("3", "4")
    assert out["PADDLE_CURRENT_ENDPOINT"] == out["PADDLE_TRAINER_ENDPOINTS"] == "gpu07:15460"


def test_paddle_variables_for_torchrun_move_off_the_agents_port():
    out = paddle_variables(detect(gpu_info=CPU_BUILD, environ=TORCHRUN_2x2_RANK3))
    # Paddle reads MASTER_ADDR/MASTER_PORT before PADDLE_MASTER: both must name the new port.
    assert (out["MASTER_ADDR"], out["MASTER_PORT"], out["PADDLE_MASTER"]) == (
        "10.0.0.1", "29501", "10.0.0.1:29501")
    assert (out["PADDLE_TRAINER_ID"], out["PADDLE_LOCAL_RANK"]) == ("3", "1")
    assert out["PADDLE_NNODES"] == "2"


def test_paddle_variables_for_ranks_started_by_hand():
    out = paddle_variables(detect(gpu_info=CPU_BUILD, environ=BY_HAND_RANK1))
    assert out["PADDLE_MASTER"] == "127.0.0.1:29500"
    assert out["PADDLE_CURRENT_ENDPOINT"] == "127.0.0.1:29502"
    assert (out["PADDLE_TRAINER_ID"], out["PADDLE_TRAINERS_NUM"], out["PADDLE_LOCAL_SIZE"]) == (
        "1", "2", "1")


def test_paddle_variables_give_every_rank_its_own_well_formed_endpoint():
    endpoints = set()
    for rank in range(4):
        env = DistEnv(launcher="openmpi", global_rank=rank, world_size=4, master="h0:65534")
        endpoint = paddle_variables(env)["PADDLE_CURRENT_ENDPOINT"]
        host, port = endpoint.split(":")
        assert host == "h0" and 0 < int(port) < 65536
        endpoints.add(endpoint)
    assert endpoints == {"h0:65535", "h0:1", "h0:2", "h0:3"}


@pytest.mark.parametrize("environ", [LAUNCH_2x2_RANK3, SPAWN_RANK1, {}, SBATCH_SCRIPT])
def test_paddle_variables_are_empty_for_paddle_launchers_and_standalone(environ):
    assert paddle_variables(detect(gpu_info=CPU_BUILD, environ=environ)) == {}


def test_paddle_variables_are_empty_for_one_rank_without_a_master():
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}   # mpirun -n 1
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert (env.launcher, env.master, paddle_variables(env)) == ("openmpi", "", {})


def test_detect_again_after_the_translation_sees_the_same_ranks():
    # prepare_process_group exports the variables into this process; a later detect() then
    # finds Paddle's variables, and must describe the same ranks.
    for environ in (MPIRUN_2x2_RANK3, SRUN_2x2_RANK3, TORCHRUN_2x2_RANK3, BY_HAND_RANK1):
        env = detect(gpu_info=CPU_BUILD, environ=environ)
        again = detect(gpu_info=CPU_BUILD, environ=dict(environ, **paddle_variables(env)))
        assert again == dataclasses.replace(env, launcher="paddle_launch")


def test_mpirun_without_master_is_a_user_error_that_says_how_to_fix_it():
    environ = {k: v for k, v in MPIRUN_2x2_RANK3.items() if not k.startswith("MASTER_")}
    with pytest.raises(UserError) as err:
        paddle_variables(detect(gpu_info=CPU_BUILD, environ=environ))
    message = str(err.value)
    assert "openmpi started 4 ranks" in message
    assert "mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500" in message


def test_srun_without_master_or_node_list_is_a_user_error():
    environ = {k: v for k, v in SRUN_2x2_RANK3.items() if "NODELIST" not in k}
    with pytest.raises(UserError, match="slurm started 4 ranks.*MASTER_ADDR"):
        paddle_variables(detect(gpu_info=CPU_BUILD, environ=environ))


@pytest.mark.parametrize("master", ["10.0.0.1", "10.0.0.1:", ":29500", "h:port", "h:70000", "h:0"])
def test_malformed_master_is_a_user_error(master):
    env = DistEnv(launcher="openmpi", global_rank=1, world_size=2, master=master)
    with pytest.raises(UserError, match="is not host:port"):
        paddle_variables(env)


def test_prepare_process_group_exports_the_translation(process_group_variables):
    env = detect(gpu_info=FOUR_GPUS, environ=MPIRUN_2x2_RANK3)
    varlib.prepare_process_group(env, load().dist.nccl)
    assert os.environ["PADDLE_TRAINER_ID"] == "3"
    assert os.environ["PADDLE_TRAINERS_NUM"] == "4"
    assert os.environ["PADDLE_MASTER"] == "10.0.0.1:29500"
    assert os.environ["PADDLE_CURRENT_ENDPOINT"] == "10.0.0.1:29504"
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "nccl"
    assert os.environ["FLAGS_selected_gpus"] == "1"


def test_prepare_process_group_exports_nothing_when_the_master_is_missing(process_group_variables):
    environ = {k: v for k, v in MPIRUN_2x2_RANK3.items() if not k.startswith("MASTER_")}
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    before = dict(os.environ)
    with pytest.raises(UserError, match="MASTER_ADDR"):
        varlib.prepare_process_group(env, load().dist.nccl)
    assert environ_diff(before, os.environ) == []


def test_prepare_process_group_under_paddle_launch_adds_no_ranks(process_group_variables):
    env = detect(gpu_info=CPU_BUILD, environ=LAUNCH_2x2_RANK3)
    varlib.prepare_process_group(env, load().dist.nccl)
    assert "PADDLE_TRAINER_ID" not in os.environ
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "gloo"
