"""doctor: the environment report, the pre-flight checks and the command line.

Ports are real sockets of this test process, interfaces and /proc are this machine's;
only /dev/shm's size is injected (a statvfs result), and the environment is a plain
mapping, so nothing here depends on, or changes, the shell's variables.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddle_dist.doctor import buildinfo, facts as doctor_facts
from paddle_dist import compat
from paddle_dist.runtime import netcheck
from paddle_dist.launch import preflight as pf
from paddle_dist.config import load
from paddle_dist.doctor.facts import format_report, gather, mask_credentials
from paddle_dist.launch.preflight import Problem, preflight, proxy_problems, refusals, shm_problems
from paddle_dist.launch.proxies import bypasses_proxy
from paddle_dist.procfs import port_holder
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.errors import UserError

from tests.conftest import REPO_ROOT
from tests.oracles import free_port

CPU_BUILD = GpuInfo(False, 0)
NO_GPUS = GpuInfo(True, 0)          # a CUDA build on a machine without GPUs
TWO_GPUS = GpuInfo(True, 2)
GiB, MiB = 1 << 30, 1 << 20
TIMEOUT = 120                       # seconds for a `python -m paddle_dist.doctor` subprocess


def shm_of(size: int, free: int):
    """A statvfs stand-in for a /dev/shm of `size` bytes with `free` bytes available."""
    def statvfs(path):
        return os.statvfs_result((4096, 4096, size // 4096, free // 4096, free // 4096,
                                  0, 0, 0, 0, 255))
    return statvfs


def no_shm(path):
    raise FileNotFoundError(2, "No such file or directory", path)


BIG_SHM = shm_of(8 * GiB, 8 * GiB)


@pytest.fixture
def taken_port():
    """A port this test process listens on (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def errors(problems):
    return [p.message for p in problems if p.severity == "error"]


def run_doctor(*args):
    return subprocess.run([sys.executable, "-m", "paddle_dist.doctor", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT)


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


def test_port_holder_finds_this_process(taken_port):
    pid, cmdline = port_holder(taken_port)
    assert pid == os.getpid()
    own = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode()
    assert cmdline.startswith(own)
    assert port_holder(free_port()) is None


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


@pytest.mark.parametrize("host, no_proxy", [
    ("10.0.0.1", "10.0.0.1"), ("10.0.0.1", "10.0.0.0/8"), ("10.0.0.1", ".0.0.1"),
    ("10.0.0.1", "10.0.0.1:80"), ("10.0.0.1", "10.0.0.1:6170"), ("10.0.0.11", "10.0.0.1"),
    ("node0.lab", ".lab"), ("lab", ".lab"), ("node0.lab", "lab"), ("node0.xlab", "lab"),
    ("node0.lab", "*"), ("node0.lab", "other,*"), ("node0.lab", ""), ("localhost", "localhost"),
    ("10.0.0.1", "http://10.0.0.1"), ("10.0.0.1", "https://10.0.0.1"), ("10.0.0.1", " 10.0.0.1 "),
])
def test_no_proxy_rules_agree_with_httpx(monkeypatch, host, no_proxy):
    """Paddle's launcher talks to the master with httpx: our reading must be its reading."""
    httpx = pytest.importorskip("httpx")
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", no_proxy)
    with httpx.Client() as client:
        direct = client._transport_for_url(httpx.URL(f"http://{host}:6170/")) is client._transport
    assert bypasses_proxy(host, 6170, no_proxy) == direct


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


# ---------------------------------------------------------------- the report
SECRET_ENV = {
    "http_proxy": "http://bob:s3cret@proxy.corp:3128",
    "HTTPS_PROXY": "bob:p@ss@proxy.corp:3128",
    "no_proxy": "localhost,10.0.0.1",
    "NCCL_DEBUG": "INFO",
    "PADDLE_TRAINER_ID": "0",
    "MASTER_ADDR": "10.0.0.1",
    "HOME": "/root",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "PATH": "/nonexistent",
}


def test_report_has_every_section_and_masks_passwords():
    d = gather(SECRET_ENV, CPU_BUILD, 2, statvfs=shm_of(64 * MiB, 60 * MiB))
    assert list(d) == ["versions", "cpu", "gpus", "variables", "network", "shm", "proxies"]
    assert {"python", "kernel", "paddle", "paddle_commit", "paddle_with_cuda", "cuda", "cudnn",
            "nccl", "visualdl", "numpy", "pyyaml", "paddle_dist", "paddle_supported",
            "paddle_supported_versions", "paddle_build", "cuda_libraries", "cuda_fix"} <= set(d["versions"])
    assert d["versions"]["paddle"] == paddle.version.full_version
    assert d["versions"]["paddle_supported"] is True          # the tested versions only
    if not paddle.is_compiled_with_cuda():
        assert d["versions"]["paddle_build"] == "CPU" and d["versions"]["cuda_libraries"] == {}
    assert d["cpu"]["logical_cores"] == 2 and d["cpu"]["usable_cores"] >= 1
    assert d["cpu"]["memory_total"] > 0
    assert d["gpus"] == {"count": 0, "names": [], "nvidia_smi": None, "CUDA_VISIBLE_DEVICES": "0,1",
                         "code": [], "code_fits": True}       # a CPU build: no GPU code to check
    assert list(d["variables"]) == ["CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "NCCL_DEBUG",
                                    "PADDLE_TRAINER_ID"]
    assert d["network"]["lo"] == ["127.0.0.1"]
    assert d["shm"] == {"path": "/dev/shm", "present": True, "size": 64 * MiB, "free": 60 * MiB}
    assert d["proxies"] == {"http_proxy": "http://***@proxy.corp:3128",
                            "HTTPS_PROXY": "***@proxy.corp:3128", "no_proxy": "localhost,10.0.0.1"}
    text = json.dumps(d)
    assert "s3cret" not in text and "p@ss" not in text


def test_mask_credentials():
    assert mask_credentials("socks5://u:p@h:1080") == "socks5://***@h:1080"
    assert mask_credentials("http://proxy:3128") == "http://proxy:3128"
    assert mask_credentials("a:b@h1:1,c:d@h2:2") == "***@h1:1,***@h2:2"


def test_format_report_has_the_sections():
    text = format_report(gather(SECRET_ENV, CPU_BUILD, 2, statvfs=no_shm))
    assert text.startswith("### paddle_dist environment\n```text\nversions\n")
    assert text.endswith("\n```")
    for section in ("cpu", "gpus", "variables", "network", "shm", "proxies"):
        assert f"\n\n{section}\n" in text
    assert "  path  /dev/shm (missing)" in text
    assert "  http_proxy   http://***@proxy.corp:3128" in text
    assert "s3cret" not in text


# ---------------------------------------------------------------- the command line
def test_cli_json():
    done = run_doctor("--json")
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["versions"]["paddle_dist"] and "lo" in d["network"]


def test_cli_check_names_the_holder_of_a_taken_port(taken_port):
    done = run_doctor("--check", "-o", f"dist.master=127.0.0.1:{taken_port}")
    assert done.returncode == 1, done.stderr
    assert f"\nerror: port {taken_port} of dist.master 127.0.0.1:{taken_port} is taken by pid " \
           f"{os.getpid()} (" in done.stdout
    assert done.stdout.endswith("pre-flight: 1 error(s)\n")


def test_cli_check_ok():
    done = run_doctor("--check", "-c", "mnist_lenet", "-o", f"dist.master=127.0.0.1:{free_port()}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith("pre-flight: ok\n")


def test_cli_bad_config_is_one_line_and_exit_2():
    done = run_doctor("--check", "-c", "nonexistent.yaml")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: config file 'nonexistent.yaml' not found")
    assert done.stderr.count("\n") == 1


def test_main_refuses_config_options_without_check():
    with pytest.raises(UserError, match="add --check"):
        doctor_facts.main(["-o", "train.epochs=1"])


def test_main_refuses_self_test_options_without_test_and_test_with_check():
    with pytest.raises(UserError, match="add --test"):
        doctor_facts.main(["--nprocs", "2"])
    with pytest.raises(UserError, match="add --test"):
        doctor_facts.main(["--gpus", "0"])
    with pytest.raises(UserError, match="give one of them"):
        doctor_facts.main(["--test", "--check"])
    with pytest.raises(UserError, match="--nprocs must be >= 1"):
        doctor_facts.main(["--test", "--nprocs", "0"])


# ---------------------------------------------------------------- Paddle's build
SITE = Path("/venv/lib/python3.11/site-packages")
PYPI_GPU = buildinfo.Build("2.6.2", cuda="11.8", cudnn="8.6.0")              # PyPI's paddlepaddle-gpu
PIP_LIBS = buildinfo.Build("3.2.2", cuda="12.6", cudnn="9.5.1", pip_libraries=True)


class Loader:
    """A dlopen stand-in: every library loads from /usr/local/cuda/lib64 but the `missing`
    ones; the names tried are kept, in order."""

    def __init__(self, *missing):
        self.missing, self.tried = missing, []

    def __call__(self, name):
        self.tried.append(name)
        if any(Path(name).name.startswith(m) for m in self.missing):
            raise OSError(f"{name}: cannot open shared object file")
        return "/usr/local/cuda/lib64/" + Path(name).name


def test_pypis_cuda_11_8_build_without_cudnn_says_what_to_install():
    facts = doctor_facts.paddle_facts(PYPI_GPU, SITE, Loader("libcudnn"))
    assert facts["paddle_build"] == "CUDA 11.8, cuDNN 8.6.0" and facts["paddle_supported"] is True
    assert facts["cuda_libraries"] == {
        "libcudnn.so.8": None,
        "libcublas.so.11": "/usr/local/cuda/lib64/libcublas.so.11",
        "libcurand.so.10": "/usr/local/cuda/lib64/libcurand.so.10",
        "libcusolver.so.11": "/usr/local/cuda/lib64/libcusolver.so.11",
        "libnccl.so.2": "/usr/local/cuda/lib64/libnccl.so.2"}      # 2.6 links cudart statically
    fix = facts["cuda_fix"]
    assert fix.startswith('pip install "nvidia-cudnn-cu11==8.6.*" and export LD_LIBRARY_PATH='
                          f'{SITE}/nvidia/cudnn/lib:$LD_LIBRARY_PATH (Paddle 2.6.2 searches '
                          "LD_LIBRARY_PATH only)")
    assert fix.endswith("or install CUDA 11.8 and cuDNN 8.6 from NVIDIA and add their lib64 folder "
                        "to LD_LIBRARY_PATH")
    assert "\n" not in fix and "cublas" not in fix


def test_the_report_text_lists_each_library_and_the_fix():
    facts = doctor_facts.paddle_facts(PYPI_GPU, SITE, Loader("libcudnn", "libnccl"))
    text = doctor_facts._section("versions", doctor_facts._rows("versions", facts))
    assert "  cuda_libraries             libcudnn.so.8      missing\n" in text
    assert "\n                             libcublas.so.11    /usr/local/cuda/lib64/libcublas.so.11\n" in text
    assert '  cuda_fix                   pip install "nvidia-cudnn-cu11==8.6.*" nvidia-nccl-cu11 and ' in text


def test_the_docs_show_what_doctor_prints_for_pypis_build():
    # docs/environment.md quotes the report of PyPI's 2.6.2 without cuDNN and NCCL.
    facts = doctor_facts.paddle_facts(PYPI_GPU, SITE, Loader("libcudnn", "libnccl"))
    text = doctor_facts._section("versions", doctor_facts._rows("versions", facts))
    doc = (REPO_ROOT / "docs" / "environment.md").read_text()
    quoted = doc.split("tests/unit/doctor/test_facts.py):\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert quoted.splitlines() == text.splitlines()[1:]


def test_a_build_with_pip_cuda_libraries_is_looked_for_in_site_packages_first():
    loader = Loader("libcudnn")
    facts = doctor_facts.paddle_facts(PIP_LIBS, SITE, loader)
    assert list(facts["cuda_libraries"]) == ["libcudnn.so.9", "libcublas.so.12", "libcurand.so.10",
                                             "libcusolver.so.11", "libnccl.so.2", "libcudart.so.12"]
    # Paddle's order: the pip package's folder, the system's search path, /usr/local/cuda/lib64.
    assert loader.tried[:3] == [f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9", "libcudnn.so.9",
                                "/usr/local/cuda/lib64/libcudnn.so.9"]
    assert loader.tried[3] == f"{SITE}/nvidia/cublas/lib/libcublas.so.12"
    assert facts["cuda_fix"].startswith('pip install "nvidia-cudnn-cu12==9.5.*" (Paddle 3.2.2 finds '
                                        "them in site-packages/nvidia), or install CUDA 12.6")


def test_cpu_builds_and_complete_installs_need_nothing():
    cpu = doctor_facts.paddle_facts(buildinfo.Build("3.3.1"), SITE, Loader("lib"))
    assert (cpu["paddle_build"], cpu["cuda_libraries"], cpu["cuda_fix"]) == ("CPU", {}, None)
    assert [key for key, _ in doctor_facts._rows("versions", cpu)] == [
        "paddle", "paddle_supported", "paddle_supported_versions", "paddle_build", "cuda", "cudnn"]
    assert doctor_facts.paddle_facts(PYPI_GPU, SITE, Loader())["cuda_fix"] is None


@pytest.mark.parametrize("cuda, cudnn, names, cudnn_package", [
    ("11.8", "8906", ["libcudnn.so.8", "libcublas.so.11", "libcurand.so.10", "libcusolver.so.11"],
     "nvidia-cudnn-cu11==8.9.*"),                       # cuDNN's own number: 8.9.6
    ("12.3", "90100", ["libcudnn.so.9", "libcublas.so.12", "libcurand.so.10", "libcusolver.so.11"],
     "nvidia-cudnn-cu12==9.1.*"),                       # cuDNN 9's: 9.1.0
    ("11.8", "8.6.0", ["libcudnn.so.8", "libcublas.so.11", "libcurand.so.10", "libcusolver.so.11"],
     "nvidia-cudnn-cu11==8.6.*"),
])
def test_library_names_follow_the_cuda_and_cudnn_versions(cuda, cudnn, names, cudnn_package):
    libs = buildinfo.libraries(buildinfo.Build("3.0.0", cuda, cudnn, pip_libraries=True))
    assert [lib.soname for lib in libs][:4] == names
    assert libs[0].package == cudnn_package
    assert libs[-1].soname == ("libcudart.so.11.0" if cuda.startswith("11") else "libcudart.so.12")


@pytest.mark.parametrize("version, supported", [
    ("2.6.2", True), ("3.0.0", True), ("3.1.1", True), ("3.2.2", True), ("3.3.1", True),
    ("3.0.0rc1", True), ("2.5.2", False), ("3.4.0", False), ("0.0.0", False)])
def test_supported_versions(version, supported):
    assert doctor_facts.paddle_facts(buildinfo.Build(version), None)["paddle_supported"] is supported


def test_load_library_returns_the_file_or_raises():
    path = buildinfo.load_library("libc.so.6")
    assert Path(path).name.startswith("libc.so.6") or Path(path).name.startswith("libc-")
    assert Path(path).is_file()
    with pytest.raises(OSError):
        buildinfo.load_library("libnosuchlibrary.so.7")


def test_the_numpy_fix_is_a_row_only_when_there_is_something_to_fix():
    assert doctor_facts._version_rows("numpy_fix", None) == []
    line = compat.numpy_problem("2.6.2", "2.4.6")
    assert doctor_facts._version_rows("numpy_fix", line) == [("numpy_fix", line)]
    assert doctor_facts.versions()["numpy_fix"] == compat.numpy_problem(paddle.__version__, np.__version__)
