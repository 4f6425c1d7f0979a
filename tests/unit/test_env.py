"""Unit tests for paddle_dist.env: launcher detection, device/backend selection, variables
for child processes, and the conftest guard that keeps tests from leaking os.environ.

Most tests pass `environ=` and `gpu_info=` explicitly, so no GPU and no launcher is needed.
"""

import dataclasses
import os

import pytest

from paddle_dist import env as envlib
from paddle_dist.config import NcclConfig, load
from paddle_dist.env import DistEnv, GpuInfo, check_gpus, detect, parse_gpus
from paddle_dist.errors import DeviceError

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

# Everything detect() reads, so a test using the real os.environ starts from a standalone process.
DETECTED_VARIABLES = ("PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK", "PADDLE_TRAINERS_NUM",
                      "PADDLE_LOCAL_SIZE", "PADDLE_NNODES", "PADDLE_MASTER",
                      "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
                      "FLAGS_selected_gpus", "CUDA_VISIBLE_DEVICES")


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
    assert envlib.visible_gpus(FOUR_GPUS, environ) == visible


# ---------------------------------------------------------------- variables for children
def test_nccl_variables_maps_every_set_field():
    nccl = NcclConfig(socket_ifname="eth0", ib_hca="mlx5_0,mlx5_1", ib_disable=True,
                      p2p_disable=False, debug="INFO", debug_subsys="INIT,NET",
                      extra={"NCCL_ALGO": "Ring"})
    assert envlib.nccl_variables(nccl) == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_DISABLE": "0",
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_ALGO": "Ring",
    }


def test_nccl_variables_omits_unset_fields():
    assert envlib.nccl_variables(NcclConfig()) == {}
    assert envlib.nccl_variables(NcclConfig(ib_disable=False)) == {"NCCL_IB_DISABLE": "0"}
    assert envlib.nccl_variables(NcclConfig(debug="WARN")) == {"NCCL_DEBUG": "WARN"}


def test_nccl_variables_from_a_loaded_config():
    cfg = load(overrides=["dist.nccl.socket_ifname=^lo,docker", "dist.nccl.ib_disable=true"])
    assert envlib.nccl_variables(cfg.dist.nccl) == {"NCCL_SOCKET_IFNAME": "^lo,docker",
                                                    "NCCL_IB_DISABLE": "1"}


@pytest.mark.parametrize("cores, nprocs, threads", [(8, 2, "4"), (8, 3, "2"), (3, 4, "1"),
                                                    (1, 1, "1"), (16, 1, "16")])
def test_worker_variables_shares_cores_between_ranks(cores, nprocs, threads):
    out = envlib.worker_variables(load(), nprocs, cpu_count=cores, environ={})
    assert out == {"OMP_NUM_THREADS": threads}


def test_worker_variables_keeps_the_users_omp_num_threads():
    out = envlib.worker_variables(load(), 2, cpu_count=8, environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in out


def test_worker_variables_includes_nccl_settings():
    cfg = load(overrides=["dist.nccl.debug=INFO", "dist.nccl.extra={NCCL_ALGO: Tree}"])
    out = envlib.worker_variables(cfg, 2, cpu_count=4, environ={})
    assert out == {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree", "OMP_NUM_THREADS": "2"}


def test_worker_variables_shares_cores_when_the_user_did_not_set_omp(environ_before_paddle):
    if "OMP_NUM_THREADS" in environ_before_paddle:
        pytest.skip("OMP_NUM_THREADS was set when the tests started")
    out = envlib.worker_variables(load(), 2, cpu_count=8)   # the real os.environ
    assert out.get("OMP_NUM_THREADS") == "4"


def test_child_environ_adds_to_ours(monkeypatch):
    monkeypatch.setenv("PADDLE_DIST_TEST_KEEP", "y")
    child = envlib.child_environ({"PADDLE_DIST_TEST_NEW": "1"})
    assert child["PADDLE_DIST_TEST_NEW"] == "1"
    assert child["PADDLE_DIST_TEST_KEEP"] == "y"
    assert "PADDLE_DIST_TEST_NEW" not in os.environ


def test_export_and_restore_round_trip(monkeypatch):
    monkeypatch.delenv("PADDLE_DIST_TEST_NEW", raising=False)
    monkeypatch.setenv("PADDLE_DIST_TEST_OLD", "before")
    old = envlib.export({"PADDLE_DIST_TEST_NEW": 3, "PADDLE_DIST_TEST_OLD": "after"})
    assert old == {"PADDLE_DIST_TEST_NEW": None, "PADDLE_DIST_TEST_OLD": "before"}
    assert os.environ["PADDLE_DIST_TEST_NEW"] == "3"
    assert os.environ["PADDLE_DIST_TEST_OLD"] == "after"
    envlib.restore(old)
    assert "PADDLE_DIST_TEST_NEW" not in os.environ
    assert os.environ["PADDLE_DIST_TEST_OLD"] == "before"


PROCESS_GROUP_VARIABLES = ("PADDLE_DISTRI_BACKEND", "FLAGS_selected_gpus", "NCCL_SOCKET_IFNAME",
                           "NCCL_IB_DISABLE", "NCCL_ALGO")


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
    envlib.prepare_process_group(env, cfg)
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "nccl"
    assert os.environ["FLAGS_selected_gpus"] == "1"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "eth0"
    assert os.environ["NCCL_IB_DISABLE"] == "1"
    assert os.environ["NCCL_ALGO"] == "Ring"


def test_prepare_process_group_on_cpu(process_group_variables):
    env = DistEnv(launcher="spawn", global_rank=0, world_size=2, local_world_size=2,
                  device="cpu", backend="gloo")
    envlib.prepare_process_group(env, load())
    assert os.environ["PADDLE_DISTRI_BACKEND"] == "gloo"
    assert "FLAGS_selected_gpus" not in os.environ
    assert "NCCL_SOCKET_IFNAME" not in os.environ


def test_prepare_process_group_standalone_sets_nothing(process_group_variables):
    before = dict(os.environ)
    envlib.prepare_process_group(DistEnv(), load())
    assert environ_diff(before, os.environ) == []


# ---------------------------------------------------------------- this machine
def test_real_detect_on_this_machine_is_standalone_cpu(standalone_process):
    if envlib.probe_gpus().count:
        pytest.skip("this machine has GPUs")
    env = detect()
    assert env.launcher == "standalone"
    assert (env.device, env.backend, env.world_size, env.global_rank) == ("cpu", "none", 1, 0)


def test_probe_gpus_matches_the_paddle_build():
    import paddle

    info = envlib.probe_gpus()
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
