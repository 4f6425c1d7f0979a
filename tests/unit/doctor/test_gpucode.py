"""doctor's check that the Paddle build has code for the GPU (paddle_dist/doctor/gpucode.py):
a library's `.nv_fatbin` section read from a small ELF file written here with PyPI's
paddlepaddle-gpu 2.6.2 layout (cubins for 6.1 to 8.6 in every kernel file, no PTX, one
stray third-party kernel for more), the verdict for an H100 and an A100, Paddle 3.x's
own list, nvidia-smi's answer, and the doctor's report and exit code."""

import struct
from pathlib import Path
from types import SimpleNamespace

from paddle_dist.doctor import facts, gpucode
from paddle_dist.runtime.devices import GpuInfo

PYPI_262 = (61, 70, 75, 80, 86)


def _fatbin(entries) -> bytes:
    """A fat binary: the 16-byte header, then entries of 64-byte headers and payloads."""
    body = b""
    for kind, arch in entries:
        payload = b"\x90" * 24
        header = struct.pack("<HHIQII HH I", kind, 0x0101, 64, len(payload), 0, 0, 0, 0, arch).ljust(64, b"\0")
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _library(path: Path, fatbins) -> Path:
    """An ELF64 file with a .shstrtab and a .nv_fatbin section holding `fatbins` (8-aligned)."""
    section = b"".join(f + b"\0" * (-len(f) % 8) for f in fatbins)
    names = b"\0.shstrtab\0.nv_fatbin\0"
    names_at, section_at = 64, 64 + len(names) + (-(64 + len(names)) % 8)
    headers_at = section_at + len(section)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, headers_at)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)

    def section_header(name: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, offset, size, 0, 0, 1, 0)

    data = bytes(header) + names + b"\0" * (section_at - names_at - len(names)) + section
    data += bytes(64) + section_header(1, names_at, len(names)) + section_header(11, section_at, len(section))
    path.write_bytes(data)
    return path


def _pypi_262(tmp_path: Path) -> Path:
    kernels = [_fatbin([(gpucode.CUBIN, a) for a in PYPI_262]) for _ in range(20)]
    stray = _fatbin([(gpucode.CUBIN, a) for a in (35, 50, 60, 70, 80, 90)])
    return _library(tmp_path / "libphi.so", kernels + [stray])


def test_the_capabilities_of_every_kernel_file_are_read(tmp_path):
    code = gpucode.archs_of_libraries([_pypi_262(tmp_path)])
    assert len(code.fatbins) == 21
    assert code.archs(gpucode.CUBIN) == PYPI_262            # the stray kernel's 9.0 is not the build's
    assert code.archs(gpucode.PTX) == ()


def test_an_h100_is_refused_in_one_line_and_an_a100_accepted(tmp_path):
    code = gpucode.archs_of_libraries([_pypi_262(tmp_path)])
    fits, line = gpucode.verdict(code, (9, 0), "the GPU (NVIDIA H100 80GB HBM3)")
    assert not fits
    assert line.startswith("this Paddle build has GPU code for compute capability 6.1, 7.0, 7.5, 8.0, 8.6, no PTX;")
    assert "the GPU (NVIDIA H100 80GB HBM3) is 9.0, which 20 of its 21 kernel files have no code for" in line
    assert "install a paddlepaddle-gpu built for 9.0" in line and "\n" not in line
    assert gpucode.verdict(code, (8, 0))[0] and gpucode.verdict(code, (8, 9))[0]   # sm_86 code runs on 8.9
    assert not gpucode.verdict(code, (6, 0))[0]                                     # but not on an older minor


def test_ptx_runs_on_newer_gpus_and_cubins_only_within_their_major():
    assert gpucode.verdict(gpucode.Code.of([80], ptx=[80]), (9, 0))[0]
    assert not gpucode.verdict(gpucode.Code.of([80, 86]), (9, 0))[0]


def test_a_file_without_kernels_and_a_non_elf_file_have_none(tmp_path):
    assert gpucode.fatbins(_library(tmp_path / "empty.so", [])) == []
    (tmp_path / "text.so").write_bytes(b"not an ELF file" * 10)
    assert gpucode.fatbins(tmp_path / "text.so") == []


def _paddle(cuda: bool, archs=None, libs: Path = None, gpus=()):
    version = SimpleNamespace(**({"cuda_archs": lambda: archs} if archs is not None else {}))
    cuda_api = SimpleNamespace(get_device_name=lambda i: gpus[i][0], get_device_capability=lambda i: gpus[i][1])
    return SimpleNamespace(is_compiled_with_cuda=lambda: cuda, version=version,
                           __file__=str((libs or Path("/nowhere")) / "__init__.py"),
                           device=SimpleNamespace(cuda=cuda_api))


def test_the_build_is_read_from_paddle_3s_list_or_from_its_libraries(tmp_path):
    assert gpucode.build_code(_paddle(False)) is None
    assert gpucode.build_code(_paddle(True, archs=[70, 80, 90])).archs(gpucode.CUBIN) == (70, 80, 90)
    (tmp_path / "libs").mkdir()
    _pypi_262(tmp_path / "libs")
    assert gpucode.build_code(_paddle(True, libs=tmp_path)).archs(gpucode.CUBIN) == PYPI_262


def test_gpus_come_from_paddle_or_from_nvidia_smi():
    paddle = _paddle(True, gpus=[("NVIDIA A100-SXM4-40GB", (8, 0))])
    assert gpucode.capabilities(paddle, 1, lambda: None) == [("NVIDIA A100-SXM4-40GB", (8, 0))]
    smi = "NVIDIA H200, 9.0\nNVIDIA H200, 9.0\n[Insufficient Permissions], [N/A]\n"
    assert gpucode.capabilities(paddle, 0, lambda: smi) == [("NVIDIA H200", (9, 0))] * 2
    assert len(gpucode.lines(gpucode.Code.of([90]), gpucode.capabilities(paddle, 0, lambda: smi))) == 1


def test_the_doctor_reports_a_build_without_code_for_the_gpu_and_exits_1(tmp_path, monkeypatch, capsys):
    (tmp_path / "libs").mkdir()
    _pypi_262(tmp_path / "libs")
    fake, read = _paddle(True, libs=tmp_path), gpucode.build_code
    monkeypatch.setattr(gpucode, "build_code", lambda paddle: read(fake))
    monkeypatch.setattr(gpucode, "capabilities", lambda paddle, count, smi: [("NVIDIA H200", (9, 0))])
    monkeypatch.setattr(facts, "gather", lambda environ, gpus, cores: {
        "gpus": facts.gpu_facts(GpuInfo(compiled_with_cuda=True, count=1), environ)})
    monkeypatch.setattr(facts, "format_report", lambda data: "\n".join(data["gpus"]["code"]))
    monkeypatch.setattr(facts.exposure, "rows", lambda cfg: [])
    assert facts.main([]) == 1
    out = capsys.readouterr().out
    assert out.count("the GPU (NVIDIA H200) is 9.0, which 20 of its 21 kernel files have no code for") == 2
    assert "error: this Paddle build has GPU code for compute capability 6.1" in out

