"""Unit tests for paddle_dist.runtime.engines: which launcher started a process (one engine class
per launcher, in order) and the ranks each engine reads from its variables, through the
environment layer alone (`detect()` on explicit variables, no GPU needed): GPU binding under
Slurm, a task of `sbatch -N2 --ntasks-per-node=8`, with the CUDA_VISIBLE_DEVICES each binding
mode leaves; OpenMPI, torchrun and ranks started by hand; Slurm's node lists."""

import pytest

from paddle_dist.runtime import engines
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import DistEnv, detect
from paddle_dist.errors import DeviceError, UserError
from paddle_dist.runtime.engines import first_host, tasks_per_node
from paddle_dist.runtime.variables import paddle_variables

from tests.integration.procs import ROOT
from tests.unit.runtime.test_env import (BY_HAND_RANK1, CPU_BUILD, LAUNCH_2x2_RANK3, MPIRUN_2x2_RANK3, SBATCH_SCRIPT,
                                         SPAWN_RANK1, SRUN_2x2_RANK3, SRUN_MASTER, TORCHRUN_2x2_RANK3)

EIGHT_GPUS = GpuInfo(True, 8)
ONE_GPU = GpuInfo(True, 1)   # what CUDA counts when CUDA_VISIBLE_DEVICES names one id


def srun_task(local_rank, node=1, **extra):
    """A task of `srun` in a 2 nodes x 8 tasks job (Slurm 22.05's variables)."""
    return dict({
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(8 * node + local_rank),
        "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(node), "SLURM_NTASKS": "16",
        "SLURM_NNODES": "2", "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]",
    }, **extra)


@pytest.mark.parametrize("local_rank", [0, 5, 7])
def test_a_task_bound_to_one_gpu_uses_it(local_rank):
    # `srun --gpus-per-task=1 --gpu-bind=single:1`: Slurm sets each task's
    # CUDA_VISIBLE_DEVICES to its own GPU's id; CUDA calls it device 0.
    env = detect(gpu_info=ONE_GPU, environ=srun_task(local_rank, CUDA_VISIBLE_DEVICES=str(local_rank)))
    assert (env.launcher, env.local_rank, env.local_world_size) == ("slurm", local_rank, 8)
    assert (env.device, env.backend) == ("gpu:0", "nccl")


def test_a_task_confined_to_one_gpu_by_cgroups_uses_it():
    # With ConstrainDevices=yes every task sees its one GPU renumbered as 0.
    env = detect(gpu_info=ONE_GPU, environ=srun_task(6, CUDA_VISIBLE_DEVICES="0"))
    assert env.device == "gpu:0"


@pytest.mark.parametrize("listed", ["0,1,2,3,4,5,6,7", None])
@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_tasks_that_see_every_gpu_pick_theirs_by_local_rank(listed, local_rank):
    # `srun --gpus-per-node=8` (no binding): every task sees all 8.
    extra = {"CUDA_VISIBLE_DEVICES": listed} if listed else {}
    env = detect(gpu_info=EIGHT_GPUS, environ=srun_task(local_rank, **extra))
    assert env.device == f"gpu:{local_rank}"


def test_local_rank_picks_a_position_among_the_visible_ids():
    environ = srun_task(1, SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NTASKS_PER_NODE="2",
                        SLURM_PROCID="3", SLURM_NTASKS="4", SLURM_STEP_NUM_TASKS="4",
                        CUDA_VISIBLE_DEVICES="6,7")
    assert detect(gpu_info=GpuInfo(True, 2), environ=environ).device == "gpu:1"


@pytest.mark.parametrize("local_rank", [0, 7])
def test_more_tasks_than_visible_gpus_is_one_line_saying_how_to_fix_it(local_rank):
    # 8 tasks on a node that gives each of them the same 4 GPUs: every rank refuses (rank
    # 0 too, so none waits for the others at the rendezvous).
    environ = srun_task(local_rank, CUDA_VISIBLE_DEVICES="0,1,2,3")
    with pytest.raises(DeviceError) as err:
        detect(gpu_info=GpuInfo(True, 4), environ=environ)
    message = str(err.value)
    assert "\n" not in message
    assert "8 ranks on this node but only 4 GPUs (0,1,2,3) visible to each rank" in message
    assert "--ntasks-per-node" in message and "srun --gpus-per-task=1 --gpu-bind=single:1" in message


def test_one_requested_gpu_for_two_tasks_is_an_error():
    environ = srun_task(0, SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NTASKS_PER_NODE="2")
    with pytest.raises(DeviceError, match="2 ranks on this node but only 1 GPUs \\(3\\) requested"):
        detect(gpus="3", gpu_info=EIGHT_GPUS, environ=environ)


@pytest.mark.parametrize("environ, hint", [
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, "mpirun -npernode N"),
    ({"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h0", "LOCAL_RANK": "2",
      "LOCAL_WORLD_SIZE": "4"}, "torchrun --nproc-per-node N"),
])
def test_the_shortage_names_each_engines_fix(environ, hint):
    with pytest.raises(DeviceError, match=hint):
        detect(gpu_info=GpuInfo(True, 2), environ=dict(environ, CUDA_VISIBLE_DEVICES="0,1"))


def test_paddle_launch_inside_an_srun_task_uses_its_selected_gpu():
    # One paddle.distributed.launch per node under `srun --ntasks-per-node=1`: its ranks
    # inherit the task's SLURM_* but take the GPU Paddle's launcher names.
    environ = srun_task(0, PADDLE_TRAINER_ID="9", PADDLE_LOCAL_RANK="1", PADDLE_TRAINERS_NUM="16",
                        PADDLE_LOCAL_SIZE="8", PADDLE_NNODES="2", PADDLE_MASTER="gpu07:6170",
                        FLAGS_selected_gpus="1")
    env = detect(gpu_info=EIGHT_GPUS, environ=environ)
    assert (env.launcher, env.global_rank, env.device) == ("paddle_launch", 9, "gpu:1")


def test_docs_show_the_sbatch_template_the_tests_run():
    template = (ROOT / "tools" / "slurm_cpu.sbatch").read_text()
    assert template.strip() in (ROOT / "docs" / "slurm.md").read_text()


# ------------------------------------------------------------------ a launcher per node
def _node_task(node, nnodes=2, **extra):
    """The one task on node `node` of `srun -N2 --ntasks-per-node=1`."""
    return dict({
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node), "SLURM_NTASKS": str(nnodes), "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_TASKS": str(nnodes), "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nnodes})", "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[07-08]"}, **extra)


@pytest.mark.parametrize("node", [0, 1])
def test_the_one_task_of_each_node_asked_for_8_ranks_launches_them(node):
    settings = engines.srun_node_launcher(_node_task(node), 8)
    assert settings == {"nnodes": 2, "node_rank": node, "master": "gpu07:16242"}


def test_a_node_launcher_honours_master_addr_and_port():
    environ = _node_task(1, MASTER_ADDR="10.1.2.3", MASTER_PORT="6170")
    assert engines.srun_node_launcher(environ, 8)["master"] == "10.1.2.3:6170"


@pytest.mark.parametrize("environ, nprocs", [
    (_node_task(0), None), (_node_task(0), 1),                 # the task is the rank
    (srun_task(0), 8),                                          # 8 tasks per node: ranks already
    ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, 8),   # a batch script
])
def test_anything_else_is_no_node_launcher(environ, nprocs):
    assert engines.srun_node_launcher(environ, nprocs) is None


def test_through_as_launcher_a_node_launcher_is_standalone_and_its_ranks_paddle_launched():
    environ = engines.as_launcher(_node_task(1))
    assert detect(gpu_info=GpuInfo(False, 0), environ=environ).launcher == "standalone"
    rank = dict(_node_task(1), PADDLE_TRAINER_ID="9", PADDLE_TRAINERS_NUM="16", PADDLE_LOCAL_RANK="1",
                PADDLE_NNODES="2", PADDLE_MASTER="gpu07:16242", PADDLE_TRAINER_ENDPOINTS="a:1",
                PADDLE_CURRENT_ENDPOINT="a:1", PADDLE_LOCAL_SIZE="8")
    env = detect(gpu_info=GpuInfo(False, 0), environ=rank)
    assert (env.launcher, env.global_rank) == ("paddle_launch", 9)


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
