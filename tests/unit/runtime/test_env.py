"""Unit tests for paddle_dist.runtime.env: detect() and its frozen DistEnv under Paddle's own
launchers, ranks started by hand, and a rank started outside that refuses what it would ignore.
The variables and constants here serve test_engines, test_devices and test_variables too.

Most tests pass `environ=` and `gpu_info=` explicitly, so no GPU and no launcher is needed.
"""

import dataclasses
import re

import pytest

from paddle_dist.runtime import devices as devicelib, env as envlib
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import DistEnv, check_started_outside, detect
from paddle_dist.errors import DeviceError, UserError


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


# ---------------------------------------------------------------- this machine
def test_real_detect_on_this_machine_is_standalone_cpu(standalone_process):
    if devicelib.probe_gpus().count:
        pytest.skip("this machine has GPUs")
    env = detect()
    assert env.launcher == "standalone"
    assert (env.device, env.backend, env.world_size, env.global_rank) == ("cpu", "none", 1, 0)


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
