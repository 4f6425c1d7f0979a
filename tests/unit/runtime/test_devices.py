"""Unit tests for paddle_dist.runtime.devices: how many processes a job runs, on which GPUs; the
device and backend a rank selects (under every launcher), GPU lists and their checks."""

import pytest

from paddle_dist.errors import DeviceError
from paddle_dist.runtime.devices import GpuInfo, check_gpus, parse_gpus, resolve_devices
from paddle_dist.runtime import devices as devicelib
from paddle_dist.runtime.env import detect

from tests.unit.runtime.test_env import (BY_HAND_RANK1, CPU_BUILD, FOUR_GPUS, MPIRUN_2x2_RANK3, SPAWN_RANK1,
                                         SRUN_2x2_RANK3, TORCHRUN_2x2_RANK3, launch_child)
from tests.unit.runtime.test_env import standalone_process  # noqa: F401  (fixtures)


@pytest.mark.parametrize("nprocs, gpus, visible, backend, expected", [
    (None, [], [], "auto", (1, ())),
    (3, [], [], "auto", (3, ())),
    (None, ["0", "1"], ["0", "1"], "auto", (2, ("0", "1"))),
    (2, ["0", "1"], ["0", "1"], "auto", (2, ("0", "1"))),
    (None, ["5"], ["4", "5"], "auto", (1, ("5",))),
    (2, [], ["0", "1", "2"], "auto", (2, ("0", "1"))),   # next visible GPUs
    (3, [], ["0", "1"], "gloo", (3, ())),                # gloo on a GPU machine: CPU ranks
])
def test_resolve_devices(nprocs, gpus, visible, backend, expected):
    assert resolve_devices(nprocs, gpus, visible, backend) == expected


@pytest.mark.parametrize("nprocs", [1, 3])
def test_resolve_devices_rejects_a_mismatch(nprocs):
    with pytest.raises(DeviceError, match="one process runs per GPU"):
        resolve_devices(nprocs, ["0", "1"], ["0", "1"], "auto")


def test_more_processes_than_visible_gpus_is_an_error():
    with pytest.raises(DeviceError, match="3 processes need 3 GPUs but 2 are visible"):
        resolve_devices(3, [], ["0", "1"], "auto")


@pytest.mark.parametrize("args, expected", [
    ((None, "", "auto", CPU_BUILD, {}), devicelib.JobDevices(1, (), (), "none")),
    ((2, "", "auto", CPU_BUILD, {}), devicelib.JobDevices(2, (), (), "gloo")),
    ((None, "1,2", "auto", FOUR_GPUS, {"CUDA_VISIBLE_DEVICES": "1,2,3"}),
     devicelib.JobDevices(2, ("1", "2"), ("1", "2", "3"), "nccl")),
    ((None, "", "auto", CPU_BUILD, {}, 4), devicelib.JobDevices(4, (), (), "gloo")),       # mpirun's slots
    ((1, "", "auto", CPU_BUILD, {}, None, 2), devicelib.JobDevices(1, (), (), "gloo")),   # one rank on each of 2
])
def test_a_jobs_devices_are_resolved_in_one_call(args, expected):
    assert devicelib.job_devices(*args) == expected


def test_a_jobs_devices_refuse_what_the_machine_cannot_give():
    with pytest.raises(DeviceError, match="not visible"):
        devicelib.job_devices(None, "7", "auto", FOUR_GPUS, {})
    with pytest.raises(DeviceError, match="dist.backend=nccl needs GPUs"):
        devicelib.job_devices(2, "", "nccl", CPU_BUILD, {})


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


def test_probe_gpus_matches_the_paddle_build():
    import paddle

    info = devicelib.probe_gpus()
    assert info.compiled_with_cuda == paddle.is_compiled_with_cuda()
    if not info.compiled_with_cuda:
        assert info == GpuInfo(False, 0)
