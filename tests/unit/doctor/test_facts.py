"""Unit tests for paddle_dist.doctor.facts: the environment report and `python -m paddle_dist.doctor`'s
command line. The build, port and /dev/shm helpers here serve test_preflight.py too.

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
from paddle_dist.doctor.facts import format_report, gather, mask_credentials
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.errors import UserError

from tests.conftest import REPO_ROOT
from tests.oracles import free_port

CPU_BUILD = GpuInfo(False, 0)
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


@pytest.fixture
def taken_port():
    """A port this test process listens on (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def run_doctor(*args):
    return subprocess.run([sys.executable, "-m", "paddle_dist.doctor", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT)


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


@pytest.mark.parametrize("version, supported", [
    ("2.6.2", True), ("3.0.0", True), ("3.1.1", True), ("3.2.2", True), ("3.3.1", True),
    ("3.0.0rc1", True), ("2.5.2", False), ("3.4.0", False), ("0.0.0", False)])
def test_supported_versions(version, supported):
    assert doctor_facts.paddle_facts(buildinfo.Build(version), None)["paddle_supported"] is supported


def test_the_numpy_fix_is_a_row_only_when_there_is_something_to_fix():
    assert doctor_facts._version_rows("numpy_fix", None) == []
    line = compat.numpy_problem("2.6.2", "2.4.6")
    assert doctor_facts._version_rows("numpy_fix", line) == [("numpy_fix", line)]
    assert doctor_facts.versions()["numpy_fix"] == compat.numpy_problem(paddle.__version__, np.__version__)


def test_doctor_check_reports_a_master_without_route(monkeypatch, capsys):
    def route_to(host):
        raise netcheck.NetworkError(f"no route from this machine to master {host}: unreachable; "
                                    "check dist.master and this node's network configuration")
    monkeypatch.setattr(netcheck, "route_to", route_to)
    assert doctor_facts.main(["--check", "-o", "dist.master=198.19.5.5:6170", "-o", "dist.nnodes=2"]) == 1
    out = capsys.readouterr().out
    assert "error: no route from this machine to master 198.19.5.5" in out
    assert "pre-flight: ok" not in out
