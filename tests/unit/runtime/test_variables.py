"""Unit tests for paddle_dist.runtime.variables: the variables a rank gets from its launcher."""

from paddle_dist.config import Config
from paddle_dist.runtime import paddle_import
from paddle_dist.runtime import variables as varlib
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import detect
from paddle_dist.runtime.variables import rank_variables

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
