"""Unit tests for paddle_dist.runtime.variables: the variables a rank gets from its launcher."""

from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import detect
from paddle_dist.runtime.variables import rank_variables

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
