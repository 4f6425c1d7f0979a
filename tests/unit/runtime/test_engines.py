"""GPU binding under Slurm (and the other engines), through the environment layer alone:
`detect()` on the variables srun gives a task of `sbatch -N2 --ntasks-per-node=8`, with
the CUDA_VISIBLE_DEVICES each binding mode leaves (no GPU needed)."""

import pytest

from paddle_dist.runtime import engines as clusters
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import detect
from paddle_dist.errors import DeviceError

from tests.integration.procs import ROOT

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
    settings = clusters.srun_node_launcher(_node_task(node), 8)
    assert settings == {"nnodes": 2, "node_rank": node, "master": "gpu07:16242"}


def test_a_node_launcher_honours_master_addr_and_port():
    environ = _node_task(1, MASTER_ADDR="10.1.2.3", MASTER_PORT="6170")
    assert clusters.srun_node_launcher(environ, 8)["master"] == "10.1.2.3:6170"


@pytest.mark.parametrize("environ, nprocs", [
    (_node_task(0), None), (_node_task(0), 1),                 # the task is the rank
    (srun_task(0), 8),                                          # 8 tasks per node: ranks already
    ({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, 8),   # a batch script
])
def test_anything_else_is_no_node_launcher(environ, nprocs):
    assert clusters.srun_node_launcher(environ, nprocs) is None


def test_through_as_launcher_a_node_launcher_is_standalone_and_its_ranks_paddle_launched():
    environ = clusters.as_launcher(_node_task(1))
    assert detect(gpu_info=GpuInfo(False, 0), environ=environ).launcher == "standalone"
    rank = dict(_node_task(1), PADDLE_TRAINER_ID="9", PADDLE_TRAINERS_NUM="16", PADDLE_LOCAL_RANK="1",
                PADDLE_NNODES="2", PADDLE_MASTER="gpu07:16242", PADDLE_TRAINER_ENDPOINTS="a:1",
                PADDLE_CURRENT_ENDPOINT="a:1", PADDLE_LOCAL_SIZE="8")
    env = detect(gpu_info=GpuInfo(False, 0), environ=rank)
    assert (env.launcher, env.global_rank) == ("paddle_launch", 9)
