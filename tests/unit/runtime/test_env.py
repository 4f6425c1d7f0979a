"""Unit tests for paddle_dist.runtime.env: launcher detection, device/backend selection, variables
for child processes, and the conftest guard that keeps tests from leaking os.environ.

Most tests pass `environ=` and `gpu_info=` explicitly, so no GPU and no launcher is needed.
"""

import dataclasses
import os
import re

import pytest

from paddle_dist.runtime import devices as devicelib, engines, env as envlib, protocol, variables as varlib
from paddle_dist.config import load
from paddle_dist.schema import NcclConfig
from paddle_dist.runtime.engines import first_host, tasks_per_node
from paddle_dist.runtime.devices import GpuInfo, check_gpus, parse_gpus
from paddle_dist.runtime.env import DistEnv, check_started_outside, detect
from paddle_dist.runtime.paddle_import import OMP_CHOSEN
from paddle_dist.runtime.variables import paddle_variables
from paddle_dist.errors import DeviceError, UserError

from tests.conftest import environ_diff

CPU_BUILD = GpuInfo(False, 0)
FOUR_GPUS = GpuInfo(True, 4)

# `python -m paddle.distributed.launch` on 2 nodes x 2 processes: the last rank.
LAUNCH_2x2_RANK3 = {
    "PADDLE_TRAINER_ID": "3",
    "PADDLE_LOCAL_RANK": "1",
    "PADDLE_TRAINERS_NUM": "4",
    "PADDLE_LOCAL_SIZE": "2",
    "PADDLE_NNODES": "2",
    "PADDLE_MASTER": "10.0.0.1:8090",
    "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171",
    "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6171",
}

# `paddle.distributed.spawn`, 2 processes: the second one.
SPAWN_RANK1 = {
    "PADDLE_TRAINER_ID": "1",
    "PADDLE_TRAINERS_NUM": "2",
    "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170,127.0.0.1:6171",
    "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:6171",
}

# `mpirun -n 4 -H 10.0.0.1:2,10.0.0.2:2 -x MASTER_ADDR=10.0.0.1 -x MASTER_PORT=29500`: the
# last rank. OMPI_COMM_WORLD_NODE_RANK is a rank among ALL jobs' processes on the node.
MPIRUN_2x2_RANK3 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_UNIVERSE_SIZE": "4",
    "PMIX_RANK": "3",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}

# `srun -N2 --ntasks-per-node=2` in job 123456 on gpu07 and gpu08: the last task.
SRUN_2x2_RANK3 = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOBID": "123456",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURMD_NODENAME": "gpu08",
    "SLURM_GTIDS": "2,3",
}
SRUN_MASTER = f"gpu07:{12000 + 123456 % 20000}"   # gpu07:15456

# The batch script of `sbatch -N2 --ntasks-per-node=2`: Slurm sets task variables for the
# batch step too, but no SLURM_STEP_ID.
SBATCH_SCRIPT = {
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}

# `torchrun --nnodes 2 --nproc_per_node 2 --master_addr 10.0.0.1 --master_port 29500 --node_rank 1`:
# the last worker. Its agent on node 0 serves a TCP store at MASTER_PORT.
TORCHRUN_2x2_RANK3 = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "1",
    "ROLE_RANK": "3",
    "ROLE_NAME": "default",
    "LOCAL_WORLD_SIZE": "2",
    "WORLD_SIZE": "4",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_WORLD_SIZE": "4",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RUN_ID": "none",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}

# `RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python train.py`
BY_HAND_RANK1 = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}

# Everything detect() reads, so a test using the real os.environ starts from a standalone
# process (even when pytest itself runs under srun, mpirun or torchrun).
DETECTED_VARIABLES = ("PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK", "PADDLE_TRAINERS_NUM",
                      "PADDLE_LOCAL_SIZE", "PADDLE_NNODES", "PADDLE_MASTER",
                      "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
                      "FLAGS_selected_gpus", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK",
                      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "RANK", "WORLD_SIZE",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def launch_child(local_rank, nprocs=2, **extra):
    """Variables paddle.distributed.launch gives process `local_rank` of a one-node job."""
    ports = ",".join(f"127.0.0.1:{6170 + i}" for i in range(nprocs))
    environ = {"PADDLE_TRAINER_ID": str(local_rank), "PADDLE_LOCAL_RANK": str(local_rank),
               "PADDLE_TRAINERS_NUM": str(nprocs), "PADDLE_LOCAL_SIZE": str(nprocs),
               "PADDLE_NNODES": "1", "PADDLE_MASTER": "127.0.0.1:8090",
               "PADDLE_TRAINER_ENDPOINTS": ports,
               "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{6170 + local_rank}"}
    environ.update(extra)
    return environ


@pytest.fixture
def standalone_process(monkeypatch):
    """The real os.environ, minus anything a launcher or the user could have set for devices."""
    for name in DETECTED_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------- launcher detection
def test_standalone_process():
    env = detect(gpu_info=CPU_BUILD, environ={})
    assert env == DistEnv()
    assert (env.launcher, env.global_rank, env.local_rank, env.world_size) == ("standalone", 0, 0, 1)
    assert (env.backend, env.device, env.master) == ("none", "cpu", "")
    assert env.is_main and env.is_local_main and not env.is_distributed


def test_unrelated_variables_keep_a_process_standalone():
    environ = {"PATH": "/usr/bin", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170",
               "PADDLE_TRAINER_ID": "0"}   # no world size: not a launched process
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "standalone"


def test_paddle_launch_two_nodes_of_two():
    env = detect(gpu_info=CPU_BUILD, environ=LAUNCH_2x2_RANK3)
    assert env.launcher == "paddle_launch"
    assert (env.global_rank, env.local_rank) == (3, 1)
    assert (env.world_size, env.local_world_size) == (4, 2)
    assert (env.node_rank, env.nnodes) == (1, 2)
    assert env.master == "10.0.0.1:8090"
    assert (env.device, env.backend) == ("cpu", "gloo")
    assert not env.is_main
    assert not env.is_local_main
    assert env.is_distributed


@pytest.mark.parametrize("trainer_id, local_rank, node_rank, is_main, is_local_main", [
    ("0", "0", 0, True, True),
    ("1", "1", 0, False, False),
    ("2", "0", 1, False, True),
])
def test_paddle_launch_ranks_on_each_node(trainer_id, local_rank, node_rank, is_main,
                                          is_local_main):
    environ = dict(LAUNCH_2x2_RANK3, PADDLE_TRAINER_ID=trainer_id, PADDLE_LOCAL_RANK=local_rank)
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert env.node_rank == node_rank
    assert (env.is_main, env.is_local_main) == (is_main, is_local_main)


def test_paddle_launch_without_master_uses_the_first_endpoint():
    environ = {k: v for k, v in LAUNCH_2x2_RANK3.items() if k != "PADDLE_MASTER"}
    assert detect(gpu_info=CPU_BUILD, environ=environ).master == "10.0.0.1:6170"


def test_spawn_child():
    env = detect(gpu_info=CPU_BUILD, environ=SPAWN_RANK1)
    assert env.launcher == "spawn"
    assert env.global_rank == env.local_rank == 1
    assert env.world_size == env.local_world_size == 2
    assert (env.node_rank, env.nnodes) == (0, 1)
    assert env.master == "127.0.0.1:6170"
    assert (env.device, env.backend) == ("cpu", "gloo")
    assert not env.is_main and not env.is_local_main


def test_launch_wins_over_spawn_when_both_sets_of_variables_are_present():
    # A launched process carries the legacy spawn variables too.
    assert detect(gpu_info=CPU_BUILD, environ=launch_child(1)).launcher == "paddle_launch"


def test_dist_env_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DistEnv().global_rank = 1


# ---------------------------------------------------------------- devices
def test_gpus_without_cuda_visible_devices_follow_the_local_rank():
    assert detect(gpu_info=FOUR_GPUS, environ={}).device == "gpu:0"
    for rank in range(3):
        env = detect(gpu_info=FOUR_GPUS, environ=launch_child(rank, nprocs=3))
        assert env.device == f"gpu:{rank}"


def test_cuda_visible_devices_renumbers_from_environ_dict():
    env = detect(gpus="5", gpu_info=FOUR_GPUS, environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert (env.launcher, env.device) == ("standalone", "gpu:1")


def test_cuda_visible_devices_renumbers_from_os_environ(standalone_process, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    env = detect(gpus="5", gpu_info=FOUR_GPUS)
    assert (env.launcher, env.device) == ("standalone", "gpu:1")
    assert detect(gpus="4", gpu_info=FOUR_GPUS).device == "gpu:0"
    assert detect(gpu_info=FOUR_GPUS).device == "gpu:0"


def test_launch_child_uses_flags_selected_gpus_as_a_position():
    environ = launch_child(0, FLAGS_selected_gpus="1")
    assert detect(gpu_info=FOUR_GPUS, environ=environ).device == "gpu:1"


def test_launch_child_from_os_environ(standalone_process, monkeypatch):
    for name, value in launch_child(1, FLAGS_selected_gpus="1").items():
        monkeypatch.setenv(name, value)
    env = detect(gpu_info=FOUR_GPUS)
    assert (env.launcher, env.device, env.backend) == ("paddle_launch", "gpu:1", "nccl")


def test_spawn_child_uses_flags_selected_gpus_as_a_physical_id():
    environ = dict(SPAWN_RANK1, CUDA_VISIBLE_DEVICES="4,5", FLAGS_selected_gpus="5")
    env = detect(gpus="4,5", gpu_info=FOUR_GPUS, environ=environ)
    assert (env.launcher, env.device, env.backend) == ("spawn", "gpu:1", "nccl")


def test_spawn_child_from_os_environ(standalone_process, monkeypatch):
    for name, value in dict(SPAWN_RANK1, CUDA_VISIBLE_DEVICES="4,5",
                            FLAGS_selected_gpus="5").items():
        monkeypatch.setenv(name, value)
    assert detect(gpu_info=FOUR_GPUS).device == "gpu:1"


def test_requested_gpus_are_shared_out_by_local_rank():
    environ = launch_child(1, CUDA_VISIBLE_DEVICES="2,3,4")
    assert detect(gpus="3,4", gpu_info=FOUR_GPUS, environ=environ).device == "gpu:2"


@pytest.mark.parametrize("environ, expected", [
    ({}, "nccl"),
    ({"FLAGS_selected_gpus": "0"}, "nccl"),
])
def test_backend_is_nccl_on_gpu(environ, expected):
    assert detect(gpu_info=FOUR_GPUS, environ=launch_child(0, **environ)).backend == expected


def test_backend_is_gloo_on_cpu():
    assert detect(gpu_info=CPU_BUILD, environ=launch_child(0)).backend == "gloo"
    assert detect(gpu_info=GpuInfo(True, 0), environ=launch_child(0)).backend == "gloo"


def test_explicit_backend_is_honoured():
    assert detect(backend="nccl", gpu_info=FOUR_GPUS, environ=launch_child(0)).backend == "nccl"
    assert detect(backend="gloo", gpu_info=FOUR_GPUS, environ=launch_child(0)).backend == "gloo"
    assert detect(backend="gloo", gpu_info=CPU_BUILD, environ=launch_child(0)).backend == "gloo"


def test_nccl_without_gpus_is_a_device_error():
    with pytest.raises(DeviceError, match="dist.backend=nccl needs GPUs"):
        detect(backend="nccl", gpu_info=CPU_BUILD, environ=launch_child(0))


def test_one_process_has_no_backend_whatever_was_asked():
    assert detect(backend="nccl", gpu_info=FOUR_GPUS, environ={}).backend == "none"


@pytest.mark.parametrize("environ", [{}, launch_child(0)])
def test_cpu_build_with_gpus_requested_is_a_device_error(environ):
    with pytest.raises(DeviceError, match="paddlepaddle-gpu"):
        detect(gpus="0,1", gpu_info=CPU_BUILD, environ=environ)


@pytest.mark.parametrize("info", [CPU_BUILD, GpuInfo(True, 0)])
def test_no_gpus_means_cpu(info):
    assert detect(gpu_info=info, environ={}).device == "cpu"
    assert detect(gpu_info=info, environ={"CUDA_VISIBLE_DEVICES": "0,1"}).device == "cpu"


def test_cuda_build_without_gpus_rejects_a_gpu_request():
    with pytest.raises(DeviceError, match="not visible"):
        detect(gpus="0", gpu_info=GpuInfo(True, 0), environ={})


# ---------------------------------------------------------------- parse_gpus / check_gpus
@pytest.mark.parametrize("spec, ids", [
    ("0,1", ["0", "1"]),
    (" 0 , 3 ", ["0", "3"]),
    ("7", ["7"]),
    ("", []),
    ("  ", []),
    (None, []),
])
def test_parse_gpus(spec, ids):
    assert parse_gpus(spec) == ids


@pytest.mark.parametrize("spec", ["a", "0,,1", "-1", "1.5", "0,1,", "gpu0", "0;1"])
def test_parse_gpus_rejects_malformed_ids(spec):
    with pytest.raises(DeviceError, match="malformed"):
        parse_gpus(spec)


@pytest.mark.parametrize("spec, dupe", [("0,0", "0"), ("1,2,1", "1")])
def test_parse_gpus_rejects_duplicates(spec, dupe):
    with pytest.raises(DeviceError, match=f"GPU {dupe} more than once"):
        parse_gpus(spec)


def test_check_gpus_names_the_missing_id_and_the_visible_list():
    with pytest.raises(DeviceError) as err:
        check_gpus("4,7", FOUR_GPUS, {"CUDA_VISIBLE_DEVICES": "4,5"})
    message = str(err.value)
    assert "GPU 7 is not visible" in message
    assert "visible: 4,5" in message
    assert "CUDA_VISIBLE_DEVICES=4,5" in message


def test_check_gpus_without_cuda_visible_devices_counts_the_machine():
    with pytest.raises(DeviceError) as err:
        check_gpus("2", GpuInfo(True, 2), {})
    assert "GPU 2 is not visible" in str(err.value)
    assert "visible: 0,1" in str(err.value)
    assert "2 GPU(s)" in str(err.value)


def test_check_gpus_returns_the_ids():
    assert check_gpus("5,4", FOUR_GPUS, {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["5", "4"]
    assert check_gpus("", CPU_BUILD, {}) == []


def test_check_gpus_reads_os_environ_by_default(standalone_process, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(DeviceError, match="CUDA_VISIBLE_DEVICES=2"):
        check_gpus("0", FOUR_GPUS)


@pytest.mark.parametrize("listed, visible", [
    (None, ["0", "1", "2", "3"]),
    ("all", ["0", "1", "2", "3"]),
    ("6, 7", ["6", "7"]),
    ("1,2,3,4,5,6", ["1", "2", "3", "4"]),   # CUDA can only show what exists
])
def test_visible_gpus(listed, visible):
    environ = {} if listed is None else {"CUDA_VISIBLE_DEVICES": listed}
    assert devicelib.visible_gpus(FOUR_GPUS, environ) == visible


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


# ---------------------------------------------------------------- other engines
def ranks_of(env):
    return (env.global_rank, env.local_rank, env.world_size, env.local_world_size,
            env.node_rank, env.nnodes)


def test_mpirun_two_hosts_of_two_slots():
    env = detect(gpu_info=CPU_BUILD, environ=MPIRUN_2x2_RANK3)
    assert env.launcher == "openmpi"
    assert ranks_of(env) == (3, 1, 4, 2, 1, 2)
    assert env.master == "10.0.0.1:29500"
    assert (env.device, env.backend) == ("cpu", "gloo")
    assert not env.is_main and not env.is_local_main


@pytest.mark.parametrize("rank, local_rank, node_rank", [("0", "0", 0), ("1", "1", 0),
                                                         ("2", "0", 1)])
def test_mpirun_node_rank_is_not_ompis_node_rank(rank, local_rank, node_rank):
    # OMPI_COMM_WORLD_NODE_RANK equals the local rank in a single job: not a node index.
    environ = dict(MPIRUN_2x2_RANK3, OMPI_COMM_WORLD_RANK=rank,
                   OMPI_COMM_WORLD_LOCAL_RANK=local_rank, OMPI_COMM_WORLD_NODE_RANK=local_rank)
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert (env.global_rank, env.local_rank) == (int(rank), int(local_rank))
    assert env.node_rank == node_rank


def test_mpirun_nnodes_rounds_up():
    environ = dict(MPIRUN_2x2_RANK3, OMPI_COMM_WORLD_SIZE="5")   # -n 5 on hosts of 2 slots
    assert detect(gpu_info=CPU_BUILD, environ=environ).nnodes == 3


def test_mpirun_master_falls_back_to_paddle_master_then_nothing():
    no_master = {k: v for k, v in MPIRUN_2x2_RANK3.items() if not k.startswith("MASTER_")}
    with_paddle = dict(no_master, PADDLE_MASTER="10.0.0.9:7000")
    assert detect(gpu_info=CPU_BUILD, environ=with_paddle).master == "10.0.0.9:7000"
    assert detect(gpu_info=CPU_BUILD, environ=no_master).master == ""
    half = dict(no_master, MASTER_ADDR="10.0.0.1")   # no port: no address is invented
    assert detect(gpu_info=CPU_BUILD, environ=half).master == ""


def _bare_mpirun(rank, job="1156907009", size="2", local_size="2"):
    """`mpirun -n 2 python train.py` on one host: no MASTER_* at all."""
    return {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size,
            "OMPI_COMM_WORLD_LOCAL_RANK": rank, "OMPI_COMM_WORLD_LOCAL_SIZE": local_size,
            "OMPI_MCA_ess_base_jobid": job}


def test_bare_mpirun_on_one_host_meets_on_loopback_at_a_port_of_the_job():
    masters = {detect(gpu_info=CPU_BUILD, environ=_bare_mpirun(r)).master for r in ("0", "1")}
    assert len(masters) == 1                              # every rank finds the same one
    host, port = masters.pop().split(":")
    assert host == "127.0.0.1" and 20000 <= int(port) < 32768
    other = detect(gpu_info=CPU_BUILD, environ=_bare_mpirun("0", job="1156972545")).master
    assert other != f"{host}:{port}"                      # two jobs side by side differ
    pmix = {k: v for k, v in _bare_mpirun("0").items() if "jobid" not in k}
    assert detect(gpu_info=CPU_BUILD, environ=dict(pmix, PMIX_NAMESPACE="prterun-h-81@1")).master \
        .startswith("127.0.0.1:")                         # Open MPI 5: PMIx's namespace
    given = dict(_bare_mpirun("0"), MASTER_ADDR="127.0.0.1", MASTER_PORT="6170")
    assert detect(gpu_info=CPU_BUILD, environ=given).master == "127.0.0.1:6170"


def test_bare_mpirun_across_hosts_invents_no_address():
    env = detect(gpu_info=CPU_BUILD, environ=_bare_mpirun("3", size="4", local_size="2"))
    assert env.master == ""
    with pytest.raises(UserError, match="openmpi started 4 ranks but no rendezvous address"):
        paddle_variables(env)


def test_srun_two_nodes_of_two_tasks():
    env = detect(gpu_info=CPU_BUILD, environ=SRUN_2x2_RANK3)
    assert env.launcher == "slurm"
    assert ranks_of(env) == (3, 1, 4, 2, 1, 2)
    assert env.master == SRUN_MASTER == "gpu07:15456"
    assert (env.device, env.backend) == ("cpu", "gloo")


def test_srun_master_variables_win_over_the_node_list():
    environ = dict(SRUN_2x2_RANK3, MASTER_ADDR="10.0.0.7", MASTER_PORT="29400")
    assert detect(gpu_info=CPU_BUILD, environ=environ).master == "10.0.0.7:29400"
    only_port = dict(SRUN_2x2_RANK3, MASTER_PORT="29400")
    assert detect(gpu_info=CPU_BUILD, environ=only_port).master == "gpu07:29400"
    only_addr = dict(SRUN_2x2_RANK3, MASTER_ADDR="10.0.0.7")
    assert detect(gpu_info=CPU_BUILD, environ=only_addr).master == "10.0.0.7:15456"


def test_srun_master_from_the_job_node_list_or_nothing():
    environ = {k: v for k, v in SRUN_2x2_RANK3.items() if k != "SLURM_STEP_NODELIST"}
    environ["SLURM_JOB_NODELIST"] = "cn-a[3-4],cn-b1"
    assert detect(gpu_info=CPU_BUILD, environ=environ).master == "cn-a3:15456"
    no_list = {k: v for k, v in environ.items() if "NODELIST" not in k}
    assert detect(gpu_info=CPU_BUILD, environ=no_list).master == ""


def test_srun_uneven_tasks_per_node():
    # srun -n 5 -N 2: three tasks on the first node, two on the second.
    environ = dict(SRUN_2x2_RANK3, SLURM_PROCID="4", SLURM_NTASKS="5", SLURM_STEP_NUM_TASKS="5",
                   SLURM_STEP_TASKS_PER_NODE="3,2", SLURM_TASKS_PER_NODE="3,2")
    del environ["SLURM_NTASKS_PER_NODE"]
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert (env.world_size, env.local_world_size, env.node_rank) == (5, 2, 1)
    assert detect(gpu_info=CPU_BUILD, environ=dict(environ, SLURM_NODEID="0")).local_world_size == 3


def test_srun_step_sizes_win_over_the_allocation():
    # `srun --preserve-env -n 2 -N 1` inside `sbatch -N2 --ntasks-per-node=2`: SLURM_NTASKS,
    # SLURM_NNODES and SLURM_NTASKS_PER_NODE still describe the allocation.
    environ = dict(SRUN_2x2_RANK3, SLURM_PROCID="1", SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="2",
                   SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="2",
                   SLURM_STEP_NODELIST="gpu07")
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert ranks_of(env) == (1, 1, 2, 2, 0, 1)


def test_srun_without_step_variables_uses_the_plain_ones():
    environ = {k: v for k, v in SRUN_2x2_RANK3.items() if not k.startswith("SLURM_STEP_")}
    environ["SLURM_STEP_ID"] = "3"
    assert ranks_of(detect(gpu_info=CPU_BUILD, environ=environ)) == (3, 1, 4, 2, 1, 2)
    del environ["SLURM_NTASKS_PER_NODE"], environ["SLURM_TASKS_PER_NODE"]
    assert detect(gpu_info=CPU_BUILD, environ=environ).local_world_size == 2   # 4 // 2 nodes


@pytest.mark.parametrize("environ, master", [
    (TORCHRUN_2x2_RANK3, "10.0.0.1:29501"),   # the agent serves its own store at 29500
    (dict(TORCHRUN_2x2_RANK3, TORCHELASTIC_USE_AGENT_STORE="False"), "10.0.0.1:29500"),
])
def test_torchrun_two_nodes_of_two(environ, master):
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert env.launcher == "torchrun"
    assert ranks_of(env) == (3, 1, 4, 2, 1, 2)
    assert env.master == master


def test_ranks_started_by_hand():
    env = detect(gpu_info=CPU_BUILD, environ=BY_HAND_RANK1)
    assert env.launcher == "torchrun"
    assert ranks_of(env) == (1, 0, 2, 1, 1, 2)
    assert env.master == "127.0.0.1:29500"
    assert (env.is_main, env.is_local_main, env.backend) == (False, True, "gloo")
    no_port = {k: v for k, v in BY_HAND_RANK1.items() if k != "MASTER_PORT"}
    # torch's default port
    assert detect(gpu_info=CPU_BUILD, environ=no_port).master == "127.0.0.1:29500"


def test_ranks_by_hand_with_local_sizes():
    environ = dict(BY_HAND_RANK1, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert ranks_of(detect(gpu_info=CPU_BUILD, environ=environ)) == (3, 1, 4, 2, 1, 2)


def test_two_ranks_started_by_hand_on_one_machine_take_their_own_gpus():
    devices = []
    for rank in (0, 1):
        variables = envlib.hand_started("10.0.0.1:6170", 2, rank, local_rank=rank, environ={})
        env = detect(gpu_info=FOUR_GPUS, environ=variables)
        assert (env.global_rank, env.local_rank) == (rank, rank)
        devices.append(env.device)
    assert devices == ["gpu:0", "gpu:1"]


@pytest.mark.parametrize("local_rank, environ, expected", [
    (None, {}, ("0", "1")),
    (1, {}, ("1", "2")),                                        # never "1 rank here" for local rank 1
    (None, {"LOCAL_RANK": "1"}, ("1", "2")),                    # an inherited LOCAL_RANK is the default
    (0, {"LOCAL_RANK": "1"}, ("0", "1")),                       # --local-rank wins
    (1, {"LOCAL_WORLD_SIZE": "4"}, ("1", "4")),                 # an inherited size above the minimum stays
    (2, {"LOCAL_WORLD_SIZE": "1"}, ("2", "3")),
])
def test_hand_started_local_rank_and_size(local_rank, environ, expected):
    variables = envlib.hand_started("10.0.0.1:6170", 4, 3, local_rank=local_rank, environ=environ)
    assert (variables["LOCAL_RANK"], variables["LOCAL_WORLD_SIZE"]) == expected


def test_hand_started_shortage_check_counts_the_local_rank():
    # Local rank 2 on a machine with 2 GPUs: the third rank there has none of its own.
    variables = envlib.hand_started("10.0.0.1:6170", 4, 3, local_rank=2, environ={})
    with pytest.raises(DeviceError, match="3 ranks on this node but only 2 GPUs"):
        detect(gpu_info=GpuInfo(True, 2), environ=variables)


@pytest.mark.parametrize("local_rank, environ, message", [
    (-1, {}, "--local-rank -1 must be in 0 .. 1 for --world-size 2"),
    (2, {}, "--local-rank 2 must be in 0 .. 1 for --world-size 2"),
    (None, {"LOCAL_RANK": "2"}, "LOCAL_RANK=2 (inherited) must be in 0 .. 1"),
    (None, {"LOCAL_RANK": "one"}, "LOCAL_RANK='one' (inherited) is not a local rank; pass --local-rank L"),
])
def test_hand_started_rejects_a_bad_local_rank_in_one_line(local_rank, environ, message):
    with pytest.raises(UserError, match=re.escape(message)) as refused:
        envlib.hand_started("10.0.0.1:6170", 2, 1, local_rank=local_rank, environ=environ)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "MASTER_ADDR"])
def test_torch_variables_need_rank_world_size_and_master(missing):
    environ = {k: v for k, v in BY_HAND_RANK1.items() if k != missing}
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "standalone"


# ---------------------------------------------------------------- which engine wins
def test_paddle_launch_inside_srun_is_paddle_launch():
    env = detect(gpu_info=CPU_BUILD, environ=dict(SRUN_2x2_RANK3, **LAUNCH_2x2_RANK3))
    assert env.launcher == "paddle_launch"
    assert env.master == "10.0.0.1:8090"


def test_paddle_spawn_inside_mpirun_is_spawn():
    environ = dict(MPIRUN_2x2_RANK3, **SPAWN_RANK1)
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "spawn"


def test_mpirun_inside_slurm_is_openmpi():
    # mpirun starts its daemons with srun, one task per node: the ranks inherit that step.
    daemon_step = dict(SRUN_2x2_RANK3, SLURM_STEP_ID="1", SLURM_PROCID="1", SLURM_LOCALID="0",
                       SLURM_NTASKS="2", SLURM_STEP_NUM_TASKS="2",
                       SLURM_STEP_TASKS_PER_NODE="1(x2)")
    env = detect(gpu_info=CPU_BUILD, environ=dict(daemon_step, **MPIRUN_2x2_RANK3))
    assert env.launcher == "openmpi"
    assert ranks_of(env) == (3, 1, 4, 2, 1, 2)


def test_torchrun_inside_srun_is_torchrun():
    # `srun --ntasks-per-node=1 torchrun ...`: SLURM_PROCID numbers the agents (nodes).
    agent_task = dict(SRUN_2x2_RANK3, SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_NTASKS="2",
                      SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)")
    env = detect(gpu_info=CPU_BUILD, environ=dict(agent_task, **TORCHRUN_2x2_RANK3))
    assert env.launcher == "torchrun"
    assert ranks_of(env) == (3, 1, 4, 2, 1, 2)


def test_srun_with_torch_variables_exported_job_wide_is_slurm():
    # A batch script's `export RANK=0 WORLD_SIZE=4 MASTER_ADDR=...` reaches every task alike.
    environ = dict(SRUN_2x2_RANK3, RANK="0", WORLD_SIZE="4", MASTER_ADDR="gpu07",
                   MASTER_PORT="29500")
    env = detect(gpu_info=CPU_BUILD, environ=environ)
    assert (env.launcher, env.global_rank, env.master) == ("slurm", 3, "gpu07:29500")


def test_mpirun_with_torch_variables_is_openmpi():
    environ = dict(MPIRUN_2x2_RANK3, RANK="0", WORLD_SIZE="4")
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "openmpi"


def test_sbatch_batch_script_alone_is_standalone():
    env = detect(gpu_info=CPU_BUILD, environ=SBATCH_SCRIPT)
    assert env == DistEnv()


@pytest.mark.parametrize("step_id", ["4294967290", "4294967291", "4294967292", "4294967294",
                                     "4294967295", "4294967280", "batch", "extern", "-5", ""])
def test_special_slurm_steps_are_not_srun_tasks(step_id):
    # interactive, batch, extern, the pre-20.11 batch and extern ids, the first reserved id,
    # sacct's names, a signed print, and an empty value.
    environ = dict(SBATCH_SCRIPT, SLURM_STEP_ID=step_id)
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "standalone"


def test_highest_normal_slurm_step_is_an_srun_task():
    environ = dict(SRUN_2x2_RANK3, SLURM_STEP_ID=str(0xFFFFFFF0 - 1))
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "slurm"


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"])
def test_slurm_needs_procid_ntasks_and_a_step(missing):
    environ = {k: v for k, v in SRUN_2x2_RANK3.items() if k != missing}
    assert detect(gpu_info=CPU_BUILD, environ=environ).launcher == "standalone"


def test_engine_order():
    names = [c.name for c in engines.CLUSTER_ENVIRONMENTS]
    assert names == ["paddle_launch", "spawn", "torchrun", "openmpi", "slurm", "torchrun",
                     "standalone"]
    assert set(engines.EXTERNAL_ENGINES) == {"openmpi", "slurm", "torchrun"}


# ---------------------------------------------------------------- Slurm lists
@pytest.mark.parametrize("nodelist, host", [
    ("node01", "node01"),
    ("node[01-03,07]", "node01"),
    ("node[07,01-03]", "node07"),
    ("gpu-a[1-2],gpu-b3", "gpu-a1"),
    ("host1,host2", "host1"),
    ("rack[1-2]-node[01-04]", "rack1-node01"),
    ("node[5]", "node5"),
    ("10.0.0.1", "10.0.0.1"),
    ("", ""),
])
def test_first_host(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("spec, counts", [
    ("4", [4]),
    ("4(x2)", [4, 4]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("3,2", [3, 2]),
    ("", []),
    ("two", []),
])
def test_tasks_per_node(spec, counts):
    assert tasks_per_node(spec) == counts


# ---------------------------------------------------------------- devices under other engines
@pytest.mark.parametrize("environ", [MPIRUN_2x2_RANK3, SRUN_2x2_RANK3, TORCHRUN_2x2_RANK3])
def test_other_engines_pick_the_gpu_by_local_rank(environ):
    env = detect(gpu_info=GpuInfo(True, 2), environ=environ)
    assert (env.local_rank, env.device, env.backend) == (1, "gpu:1", "nccl")


def test_local_rank_counts_positions_in_cuda_visible_devices():
    environ = dict(MPIRUN_2x2_RANK3, CUDA_VISIBLE_DEVICES="3,5")
    assert detect(gpu_info=GpuInfo(True, 2), environ=environ).device == "gpu:1"


def test_requested_gpus_are_shared_out_by_local_rank_under_mpirun():
    environ = dict(MPIRUN_2x2_RANK3, CUDA_VISIBLE_DEVICES="2,3,4")
    assert detect(gpus="3,4", gpu_info=FOUR_GPUS, environ=environ).device == "gpu:2"


@pytest.mark.parametrize("environ, where", [
    (MPIRUN_2x2_RANK3, "before mpirun"),
    (SRUN_2x2_RANK3, "in the job script, before srun"),
    (TORCHRUN_2x2_RANK3, "before torchrun"),
    (dict(BY_HAND_RANK1, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2"), "a rank by hand"),
])
def test_an_inherited_flags_selected_gpus_without_the_ranks_gpu_is_refused(environ, where):
    # srun hands the submitting shell's FLAGS_selected_gpus to every task alike; `import
    # paddle` then makes only gpu:0 usable, and local rank 1's gpu:1 would fail.
    with pytest.raises(DeviceError) as refused:
        detect(gpu_info=FOUR_GPUS, environ=dict(environ, FLAGS_selected_gpus="0"))
    message = str(refused.value)
    assert "FLAGS_selected_gpus=0 was inherited" in message and "local rank 1 takes gpu:1" in message
    assert "unset FLAGS_selected_gpus" in message and where in message and "\n" not in message


@pytest.mark.parametrize("flag", ["1", "0,1,2,3", " 1 ", "3,1"])
def test_an_inherited_flags_selected_gpus_listing_the_ranks_gpu_changes_nothing(flag):
    for environ in (MPIRUN_2x2_RANK3, SRUN_2x2_RANK3, TORCHRUN_2x2_RANK3):
        env = detect(gpu_info=FOUR_GPUS, environ=dict(environ, FLAGS_selected_gpus=flag))
        assert env.device == "gpu:1"


def test_an_inherited_flags_selected_gpus_holds_positions_among_the_visible_gpus():
    # Paddle's flag counts the visible GPUs from 0, as CUDA does: physical GPU 5 of
    # CUDA_VISIBLE_DEVICES=4,5 is position 1.
    environ = dict(MPIRUN_2x2_RANK3, CUDA_VISIBLE_DEVICES="4,5")
    assert detect(gpu_info=GpuInfo(True, 2), environ=dict(environ, FLAGS_selected_gpus="1")).device == "gpu:1"
    with pytest.raises(DeviceError, match="only gpu:5 here, but local rank 1 takes gpu:1"):
        detect(gpu_info=GpuInfo(True, 2), environ=dict(environ, FLAGS_selected_gpus="5"))


def test_an_inherited_flags_selected_gpus_naming_a_tasks_only_gpu_is_harmless():
    # `srun --gpus-per-task=1`: the task's one visible GPU is gpu:0, whatever its local rank.
    environ = dict(SRUN_2x2_RANK3, CUDA_VISIBLE_DEVICES="1", FLAGS_selected_gpus="0")
    assert detect(gpu_info=GpuInfo(True, 1), environ=environ).device == "gpu:0"


def test_an_inherited_flags_selected_gpus_is_no_concern_on_cpu():
    environ = dict(SRUN_2x2_RANK3, FLAGS_selected_gpus="0")
    assert detect(gpu_info=CPU_BUILD, environ=environ).device == "cpu"


def test_srun_gpus_per_task_sees_one_gpu():
    # `srun --gpus-per-task=1`: each task sees only its own GPU, whatever its local rank.
    environ = dict(SRUN_2x2_RANK3, CUDA_VISIBLE_DEVICES="1")
    assert detect(gpu_info=GpuInfo(True, 1), environ=environ).device == "gpu:0"


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


# ---------------------------------------------------------------- this machine
def test_real_detect_on_this_machine_is_standalone_cpu(standalone_process):
    if devicelib.probe_gpus().count:
        pytest.skip("this machine has GPUs")
    env = detect()
    assert env.launcher == "standalone"
    assert (env.device, env.backend, env.world_size, env.global_rank) == ("cpu", "none", 1, 0)


def test_probe_gpus_matches_the_paddle_build():
    import paddle

    info = devicelib.probe_gpus()
    assert info.compiled_with_cuda == paddle.is_compiled_with_cuda()
    if not info.compiled_with_cuda:
        assert info == GpuInfo(False, 0)


# ---------------------------------------------------------------- the conftest leak guard
def test_environ_diff_reports_each_kind_of_change():
    before = {"KEEP": "1", "CHANGE": "a", "REMOVE": "x"}
    after = {"KEEP": "1", "CHANGE": "b", "ADD": "y"}
    assert environ_diff(before, after) == ["ADD added", "CHANGE changed", "REMOVE removed"]
    assert environ_diff(before, dict(before)) == []


def test_environ_diff_ignores_pytests_own_variable():
    assert environ_diff({"PYTEST_CURRENT_TEST": "a (setup)"}, {"PYTEST_CURRENT_TEST": "a (call)"}) == []


LEAK_GUARD_TESTS = """
import os
import pytest

NAME = "PADDLE_DIST_LEAK_CHECK"


@pytest.fixture
def patched_by_fixture(monkeypatch):
    monkeypatch.setenv(NAME + "_FIXTURE", "1")


def test_monkeypatch_setenv_is_not_a_leak(monkeypatch):
    monkeypatch.setenv(NAME + "_MP", "1")
    monkeypatch.delenv("PADDLE_DIST_LEAK_PRESET")


def test_monkeypatch_in_a_fixture_is_not_a_leak(patched_by_fixture):
    assert os.environ[NAME + "_FIXTURE"] == "1"


def test_raw_assignment_is_a_leak():
    os.environ[NAME + "_RAW"] = "1"


def test_raw_change_is_a_leak():
    os.environ["PADDLE_DIST_LEAK_PRESET"] = "changed"


def test_raw_delete_is_a_leak():
    del os.environ["PADDLE_DIST_LEAK_PRESET"]


def test_zz_leaks_were_undone():
    assert NAME + "_RAW" not in os.environ
    assert NAME + "_MP" not in os.environ
    assert os.environ["PADDLE_DIST_LEAK_PRESET"] == "preset"
"""


def test_leak_guard_fails_raw_changes_but_not_monkeypatch(pytester, monkeypatch):
    monkeypatch.setenv("PADDLE_DIST_LEAK_PRESET", "preset")
    pytester.makeconftest("from tests.conftest import no_environ_leak  # noqa: F401\n")
    pytester.makepyfile(test_guard=LEAK_GUARD_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=6, errors=3)
    result.stdout.fnmatch_lines([
        "*test_raw_assignment_is_a_leak leaked environment variables: "
        "PADDLE_DIST_LEAK_CHECK_RAW added*",
        "*test_raw_change_is_a_leak leaked environment variables: PADDLE_DIST_LEAK_PRESET changed*",
        "*test_raw_delete_is_a_leak leaked environment variables: PADDLE_DIST_LEAK_PRESET removed*",
    ])
    assert "test_monkeypatch_setenv_is_not_a_leak leaked" not in result.stdout.str()
    assert "test_monkeypatch_in_a_fixture_is_not_a_leak leaked" not in result.stdout.str()
    assert "PADDLE_DIST_LEAK_CHECK_RAW" not in os.environ


def test_the_launchers_config_options_travel_through_the_environment():
    variables = protocol.launch_variables("/x/mlp.yaml", ["train.epochs=1", "train.api=hapi"])
    assert protocol.launch_options(variables) == ("/x/mlp.yaml", ["train.epochs=1", "train.api=hapi"])
    assert protocol.launch_options({}) == (None, [])
    assert protocol.launch_options({protocol.LAUNCH_OVERRIDES: "not json"}) == (None, [])


def test_an_inherited_flags_selected_gpus_that_disagrees_with_dist_gpus_is_one_line():
    with pytest.raises(DeviceError, match=r"dist.gpus=0, but FLAGS_selected_gpus=1, inherited from the "
                                          r"environment, selects GPU 1, which Paddle would use instead"):
        detect(gpus="0", gpu_info=FOUR_GPUS, environ={"FLAGS_selected_gpus": "1"})
    # Agreeing (GPU 5 is position 1 among the visible 4,5): taken as before.
    env = detect(gpus="5", gpu_info=FOUR_GPUS, environ={"CUDA_VISIBLE_DEVICES": "4,5", "FLAGS_selected_gpus": "1"})
    assert env.device == "gpu:1"


@pytest.mark.parametrize("launcher, started, fix", [
    ("slurm", "1 rank(s) on this machine", "srun --ntasks-per-node=8"),
    ("paddle_launch", "1 rank(s) on this machine", "--nproc_per_node 8"),
    ("openmpi", "2 rank(s) in all", "mpirun -n 8")])      # mpirun's -n counts the whole job
def test_a_rank_started_outside_refuses_a_dist_nprocs_it_would_ignore(launcher, started, fix):
    with pytest.raises(UserError, match=re.escape(f"dist.nprocs=8, but {launcher} started this job "
                                                  f"with {started}")) as refused:
        check_started_outside(8, DistEnv(launcher=launcher, world_size=2, local_world_size=1))
    assert fix in str(refused.value)
    check_started_outside(None, DistEnv(launcher=launcher, local_world_size=1))    # not given
    agrees = 4 if launcher == "openmpi" else 2
    check_started_outside(agrees, DistEnv(launcher=launcher, world_size=4, local_world_size=2))
