"""Unit tests for paddle_dist.launch.preflight: the checks before anything starts (the master's
port and route, /dev/shm, proxies, interfaces, GPUs), errors before warnings, each with its fix."""

from __future__ import annotations

import os

import pytest

from paddle_dist.runtime import netcheck
from paddle_dist.launch import preflight as pf
from paddle_dist.config import load
from paddle_dist.launch.preflight import ERROR, Problem, preflight, proxy_problems, refusals, shm_problems
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.errors import UserError

from tests.oracles import free_port
from tests.unit.doctor.test_facts import CPU_BUILD, GiB, MiB, no_shm, shm_of
from tests.unit.doctor.test_facts import taken_port  # noqa: F401  (fixtures)

NO_GPUS = GpuInfo(True, 0)          # a CUDA build on a machine without GPUs


TWO_GPUS = GpuInfo(True, 2)


BIG_SHM = shm_of(8 * GiB, 8 * GiB)


def errors(problems):
    return [p.message for p in problems if p.severity == "error"]


# ---------------------------------------------------------------- the master's port
def test_taken_port_names_this_process(taken_port):
    cfg = load(None, [f"dist.master=127.0.0.1:{taken_port}"])
    problems = preflight(cfg, {}, CPU_BUILD, statvfs=BIG_SHM)
    assert problems == [Problem("error", problems[0].message)]
    message = problems[0].message
    assert message.startswith(f"port {taken_port} of dist.master 127.0.0.1:{taken_port} is taken "
                              f"by pid {os.getpid()} (")
    assert message.endswith("; stop that process or choose another port with "
                            "-o dist.master=HOST:PORT")


def test_free_port_is_no_problem():
    cfg = load(None, [f"dist.master=127.0.0.1:{free_port()}"])
    assert preflight(cfg, {}, CPU_BUILD, statvfs=BIG_SHM) == []


def test_wildcard_and_interface_masters_are_local(taken_port):
    for host in ("0.0.0.0", "localhost", "198.51.100.7"):
        cfg = load(None, [f"dist.master={host}:{taken_port}"])
        found = pf.port_problems(cfg, {"lo": ["127.0.0.1"], "eth9": ["198.51.100.7"]})
        assert len(found) == 1 and f"pid {os.getpid()}" in found[0].message, host


def test_port_is_not_checked_off_this_machine_or_off_node_0(taken_port):
    elsewhere = load(None, [f"dist.master=198.51.100.7:{taken_port}"])
    assert pf.port_problems(elsewhere, {"lo": ["127.0.0.1"]}) == []
    node1 = load(None, [f"dist.master=127.0.0.1:{taken_port}", "dist.nnodes=2", "dist.node_rank=1"])
    assert pf.port_problems(node1, {"lo": ["127.0.0.1"]}) == []


# ---------------------------------------------------------------- /dev/shm
@pytest.mark.parametrize("overrides", [["dist.backend=nccl", "dist.nprocs=2"], ["dist.gpus=0,1"]])
def test_small_shm_is_an_error_for_gpu_jobs(overrides):
    cfg = load(None, overrides)
    [problem] = shm_problems(cfg, TWO_GPUS, {}, statvfs=shm_of(64 * MiB, 64 * MiB))
    assert problem.severity == "error"
    assert problem.message.startswith("/dev/shm has 64.0 MiB free of 64.0 MiB, below 1.0 GiB: NCCL")
    assert "docker run --shm-size=8g" in problem.message


def test_small_shm_with_visible_gpus_and_auto_backend_is_an_error():
    [problem] = shm_problems(load(None, ["dist.nprocs=2"]), TWO_GPUS, {}, statvfs=shm_of(64 * MiB, 64 * MiB))
    assert problem.severity == "error"


def test_small_shm_on_cpu_is_a_warning():
    [problem] = shm_problems(load(), CPU_BUILD, {}, statvfs=shm_of(64 * MiB, 64 * MiB))
    assert problem.severity == "warning" and "bus error" in problem.message


def test_missing_shm(tmp_path):
    missing = str(tmp_path / "no-shm-here")
    [gpu] = shm_problems(load(None, ["dist.backend=nccl", "dist.nprocs=2"]), TWO_GPUS, {}, path=missing)
    [cpu] = shm_problems(load(), CPU_BUILD, {}, statvfs=no_shm)
    assert gpu.severity == "error" and gpu.message.startswith(f"{missing} does not exist: NCCL")
    assert cpu.severity == "warning" and "mount -t tmpfs" in cpu.message


def test_large_shm_is_fine_and_a_full_one_says_to_clean_it():
    assert shm_problems(load(None, ["dist.backend=nccl"]), TWO_GPUS, {}, statvfs=BIG_SHM) == []
    [full] = shm_problems(load(), CPU_BUILD, {}, statvfs=shm_of(8 * GiB, 100 * MiB))
    assert "remove stale files there" in full.message


@pytest.mark.parametrize("overrides", [[], ["dist.gpus=1"], ["dist.backend=nccl"], ["dist.nprocs=1"],
                                       ["dist.launcher=mpirun", "dist.nprocs=1", "dist.hostfile={hosts}"]])
def test_small_shm_is_only_a_warning_for_one_gpu_rank_in_all(overrides, tmp_path):
    # One rank has no process group, so no NCCL: a container's 64 MiB /dev/shm matters only
    # to DataLoader workers, as on CPU.
    cfg = load(None, [o.format(hosts=_hostfile(tmp_path)) for o in overrides])
    [problem] = shm_problems(cfg, TWO_GPUS, {}, statvfs=shm_of(64 * MiB, 64 * MiB))
    assert problem.severity == "warning" and "bus error" in problem.message
    assert "NCCL" not in problem.message
    assert errors(preflight(cfg, {}, TWO_GPUS, interfaces={}, statvfs=shm_of(64 * MiB, 64 * MiB))) == []


def _hostfile(folder):
    (folder / "hosts").write_text("node1 slots=2\nnode2 slots=2\n")
    return folder / "hosts"


SRUN_TASK_OF_4 = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                  "SLURM_NODEID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "1"}


@pytest.mark.parametrize("overrides, environ", [
    (["dist.gpus=0", "dist.nnodes=2", "dist.master=10.0.0.1:6170"], {}),   # one GPU on each of 2 machines
    (["dist.launcher=mpirun", "dist.hostfile={hosts}"], {}),               # as many ranks as the hostfile's slots
    ([], SRUN_TASK_OF_4),                                                  # doctor --check in each of 4 srun tasks
])
def test_small_shm_stays_an_error_for_one_gpu_per_rank_but_several_ranks(overrides, environ, tmp_path):
    cfg = load(None, [o.format(hosts=_hostfile(tmp_path)) for o in overrides])
    [problem] = shm_problems(cfg, TWO_GPUS, environ, statvfs=shm_of(64 * MiB, 64 * MiB))
    assert problem.severity == "error" and "NCCL" in problem.message


def test_shm_threshold_is_a_parameter(tmp_path):
    """A real file system (tmp_path) against thresholds above and below its size."""
    [above] = shm_problems(load(), CPU_BUILD, {}, path=str(tmp_path), minimum=1 << 62)
    assert above.message.startswith(f"{tmp_path} has ") and "enlarge it" in above.message
    assert shm_problems(load(), CPU_BUILD, {}, path=str(tmp_path), minimum=1) == []


# ---------------------------------------------------------------- proxies
MULTI = ["dist.nnodes=2", "dist.master=10.0.0.1:6170"]


@pytest.mark.parametrize("name", ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"])
def test_proxy_on_the_way_to_the_master_is_an_error(name):
    [problem] = proxy_problems(load(None, MULTI), {name: "http://proxy:3128"})
    assert problem == Problem("error", f"{name} is set and dist.master host 10.0.0.1 is not in "
                                       "no_proxy: the rendezvous would go through the proxy and "
                                       f"hang; export no_proxy=10.0.0.1 or unset {name}")


def test_fix_keeps_the_existing_no_proxy_list():
    environ = {"http_proxy": "http://proxy:3128", "NO_PROXY": "localhost,.corp"}
    [problem] = proxy_problems(load(None, MULTI), environ)
    assert "export no_proxy=10.0.0.1,$NO_PROXY or unset http_proxy" in problem.message


@pytest.mark.parametrize("master, no_proxy", [
    ("10.0.0.1", "10.0.0.1"),
    ("10.0.0.1", "localhost, 127.0.0.1,10.0.0.1"),
    ("10.0.0.1", "*"),
    ("10.0.0.1", "10.0.0.1:6170"),
    ("node0.lab", ".lab"),
    ("node0.lab", "lab"),
    ("node0.lab", "NODE0.LAB"),
])
def test_master_in_no_proxy_is_fine(master, no_proxy):
    cfg = load(None, ["dist.nnodes=2", f"dist.master={master}:6170"])
    assert proxy_problems(cfg, {"http_proxy": "http://p:3128", "no_proxy": no_proxy}) == []
    assert proxy_problems(cfg, {"HTTP_PROXY": "http://p:3128", "NO_PROXY": no_proxy}) == []


def test_address_range_in_no_proxy_does_not_cover_the_master():
    environ = {"http_proxy": "http://p:3128", "no_proxy": "10.0.0.0/8"}
    [problem] = proxy_problems(load(None, MULTI), environ)
    assert "ignores address ranges such as 10.0.0.0/8" in problem.message


def test_proxies_that_do_not_apply():
    assert proxy_problems(load(None, MULTI), {"https_proxy": "http://p:3128"}) == []
    cancelled = {"HTTP_PROXY": "http://p:3128", "http_proxy": ""}
    assert proxy_problems(load(None, MULTI), cancelled) == []
    one_node = load(None, ["dist.master=10.0.0.1:6170"])
    assert proxy_problems(one_node, {"http_proxy": "http://p:3128"}) == []


# ---------------------------------------------------------------- interfaces
def interface_problems(cfg, environ, table):
    return refusals(cfg, environ, CPU_BUILD, interfaces=table)


def test_missing_interface_names_the_existing_ones():
    real = netcheck.interfaces()
    cfg = load(None, ["dist.nccl.socket_ifname=nosuchnic"])
    [message] = errors(preflight(cfg, {}, CPU_BUILD, statvfs=BIG_SHM))
    assert message.startswith("dist.nccl.socket_ifname=nosuchnic selects no interface on this "
                              f"machine (interfaces: {', '.join(real)}); set -o ")


def test_exclusions_that_leave_an_interface_are_fine():
    assert preflight(load(None, ["dist.nccl.socket_ifname=^docker,virbr"]), {}, CPU_BUILD,
                     statvfs=BIG_SHM) == []
    two = {"lo": ["127.0.0.1"], "eth0": ["198.51.100.7"]}
    assert interface_problems(load(None, ["dist.nccl.socket_ifname=^lo"]), {}, two) == []
    [only_lo] = interface_problems(load(None, ["dist.nccl.socket_ifname=^lo"]), {},
                                   {"lo": ["127.0.0.1"]})
    assert "(interfaces: lo)" in only_lo.message


def test_exact_match_and_the_environment_variable():
    table = {"lo": ["127.0.0.1"], "eth0": ["198.51.100.7"]}
    [exact] = interface_problems(load(None, ["dist.nccl.socket_ifname==eth"]), {}, table)
    assert exact.message.startswith("dist.nccl.socket_ifname==eth selects no interface")
    assert "socket_ifname=eth0 " in exact.message
    [inherited] = interface_problems(load(), {"NCCL_SOCKET_IFNAME": "ib"}, table)
    assert inherited.message.startswith("NCCL_SOCKET_IFNAME=ib selects no interface")
    assert interface_problems(load(None, ["dist.nccl.socket_ifname=eth"]),
                              {"NCCL_SOCKET_IFNAME": "ib"}, table) == []   # the config wins


# ---------------------------------------------------------------- GPUs
def test_gpus_asked_for_on_a_machine_without_gpus():
    [message] = errors(preflight(load(None, ["dist.gpus=0"]), {}, NO_GPUS, statvfs=BIG_SHM))
    assert message.startswith("GPU 0 is not visible (visible: none; 0 GPU(s) on this machine)")
    [cpu_build] = errors(preflight(load(None, ["dist.gpus=0,1"]), {}, CPU_BUILD, statvfs=BIG_SHM))
    assert "no CUDA" in cpu_build


def test_gpus_hidden_by_cuda_visible_devices():
    problems = preflight(load(None, ["dist.gpus=0"]), {"CUDA_VISIBLE_DEVICES": "1"}, TWO_GPUS,
                         statvfs=BIG_SHM)
    assert errors(problems) == ["GPU 0 is not visible (visible: 1; CUDA_VISIBLE_DEVICES=1); pick "
                                "--gpus from the visible ids"]


def test_errors_come_before_warnings():
    cfg = load(None, ["dist.gpus=0,1"])
    problems = preflight(cfg, {}, NO_GPUS, statvfs=no_shm)
    cpu = preflight(load(), {}, CPU_BUILD, statvfs=no_shm)
    assert [p.severity for p in problems] == ["error", "error"]
    assert [p.severity for p in cpu] == ["warning"]
    assert str(cpu[0]).startswith("warning: /dev/shm does not exist")


# ---------------------------------------------------------------- check()
def test_check_raises_the_first_error_and_counts_the_rest(taken_port):
    cfg = load(None, [f"dist.master=127.0.0.1:{taken_port}", "dist.nccl.socket_ifname=nosuchnic"])
    with pytest.raises(UserError) as caught:
        pf.check(cfg)
    text = str(caught.value)
    assert text.startswith("dist.nccl.socket_ifname=nosuchnic selects no interface")
    assert text.endswith(" (and 1 more; run python -m paddle_dist.doctor --check)")
    assert "\n" not in text


def test_check_passes_a_good_config():
    assert pf.check(load(None, [f"dist.master=127.0.0.1:{free_port()}"])) is None


# ---------------------------------------------------------------- doctor --check's route check
def _no_route(master, ifname):
    raise netcheck.NetworkError(f"no route from this machine to master {master.split(':')[0]} "
                                "(198.19.5.5): [Errno 101] Network is unreachable; check dist.master")


def test_the_route_is_checked_for_a_multi_node_master_only():
    def route_problems(cfg, route):
        return refusals(cfg, {}, GpuInfo(), route)

    cfg = load(overrides=["dist.master=198.19.5.5:6170", "dist.nnodes=2"])
    [problem] = route_problems(cfg, _no_route)
    assert problem.severity == ERROR and "no route from this machine" in problem.message
    assert route_problems(load(overrides=["dist.master=198.19.5.5:6170"]), _no_route) == []
    assert route_problems(cfg, lambda master, ifname: "eth0") == []
