"""Which GPUs a Paddle build has code for, and whether this GPU is one of them.

A GPU build carries its CUDA kernels as machine code (cubin) for a list of compute
capabilities, and sometimes as PTX, which the driver compiles for a newer GPU at load
time. A GPU that neither fits runs nothing: `import paddle` works, and so may
`paddle.utils.run_check()`, while the first kernel fails ("no kernel image is available
for execution on the device"). PyPI's paddlepaddle-gpu 2.6.2 is such a build for an
H100/H200 (9.0): its libphi.so has cubins for 6.1, 7.0, 7.5, 8.0 and 8.6, and no PTX.

What the build has: Paddle 3.x says it (`paddle.version.cuda_archs()`); 2.6 does not, so
the kernels' libraries are read. nvcc puts every kernel of a library in the ELF section
`.nv_fatbin`: fat binaries (magic 0xBA55ED50, a 16-byte header whose last field is the
size of what follows), each holding entries whose header gives the entry's kind (1 PTX,
2 cubin), its header's and its payload's size, and at byte 28 the compute capability as
major * 10 + minor. Only headers are read, through mmap.

A cubin runs on GPUs of the same major capability and an equal or higher minor one
(sm_80 code runs on 8.6, never on 9.0); PTX of any capability up to the GPU's is compiled
for it by the driver.

Example:
    code = archs_of_libraries([Path(".../paddle/libs/libphi.so")])
    code.archs(CUBIN)         # (61, 70, 75, 80, 86)
    verdict(code, (9, 0))     # (False, 'this Paddle build has GPU code for compute capability 6.1, ...')
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, FrozenSet, Iterable, List, Optional, Sequence, Tuple

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
SECTION = b".nv_fatbin"
PTX, CUBIN = 1, 2
NO_CODE = "kernel files have no code for"     # in the line of a GPU the build cannot run on
INSTALL = ("install a paddlepaddle-gpu built for {cap} (Paddle's own index has 3.x builds for "
           "CUDA 11.8 to 12.x: https://www.paddlepaddle.org.cn/install/quick; PyPI's 2.6.2 stops at 8.6)")


Entry = Tuple[int, int]          # (PTX or CUBIN, compute capability as major * 10 + minor)


@dataclass(frozen=True)
class Code:
    """A build's fat binaries, each the set of its entries. A capability counts as the
    build's when most of them have it: a library may carry a stray third-party kernel
    for more GPUs than the build (PyPI's 2.6.2 has one kernel of 667 for 9.0)."""

    fatbins: Tuple[FrozenSet[Entry], ...] = ()

    @classmethod
    def of(cls, cubin: Iterable[int], ptx: Iterable[int] = ()) -> "Code":
        """A build that has every kernel for `cubin` and `ptx` (what Paddle 3.x says)."""
        return cls((frozenset({(CUBIN, a) for a in cubin} | {(PTX, a) for a in ptx}),))

    def archs(self, kind: int) -> Tuple[int, ...]:
        counts = Counter(a for fatbin in self.fatbins for k, a in fatbin if k == kind)
        return tuple(sorted(a for a, n in counts.items() if 2 * n > len(self.fatbins)))

    def missing_on(self, capability: Tuple[int, int]) -> int:
        """How many fat binaries have no code a GPU of `capability` can run."""
        return sum(not any(_runs(entry, capability) for entry in fatbin) for fatbin in self.fatbins)


def _runs(entry: Entry, capability: Tuple[int, int]) -> bool:
    kind, arch = entry
    major, minor = capability
    if kind == PTX:
        return arch <= major * 10 + minor
    return arch // 10 == major and arch % 10 <= minor


def _dotted(archs: Iterable[int]) -> str:
    return ", ".join(f"{a // 10}.{a % 10}" for a in sorted(set(archs)))


def verdict(code: Code, capability: Tuple[int, int], gpu: str = "this GPU") -> Tuple[bool, str]:
    """(whether the build runs on a GPU of `capability`, one line saying so): it does when
    most of its fat binaries have code for it."""
    has = f"GPU code for compute capability {_dotted(code.archs(CUBIN)) or 'none'}"
    has += f", PTX for {_dotted(code.archs(PTX))}" if code.archs(PTX) else ", no PTX"
    needs = f"{gpu} is {capability[0]}.{capability[1]}"
    missing = code.missing_on(capability)
    if 2 * missing < len(code.fatbins):       # a few arch-specific kernels are normal
        return True, f"this Paddle build has {has}; {needs}: supported"
    cap = f"{capability[0]}.{capability[1]}"
    return False, (f"this Paddle build has {has}; {needs}, which {missing} of its {len(code.fatbins)} "
                   f"{NO_CODE}: {INSTALL.format(cap=cap)}")


# ---------------------------------------------------------------- reading a library
def archs_of_libraries(paths: Sequence[Path]) -> Code:
    """The fat binaries in the `.nv_fatbin` sections of `paths`."""
    return Code(tuple(fatbin for path in paths for fatbin in fatbins(path)))


def fatbins(path: Path) -> List[FrozenSet[Entry]]:
    """The entries of each of the library's fat binaries; [] without any."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        found = fatbin_section(data)
        if found is None:
            return []
        start, end = found
        return list(_walk(data, start, end))


def fatbin_section(data) -> Optional[Tuple[int, int]]:
    """(offset, end) of an ELF64 little-endian file's `.nv_fatbin` section, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or not shnum:
        return None

    def section(i: int) -> Tuple[int, int, int]:        # (name offset, file offset, size)
        base = shoff + i * shentsize
        name, = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name, offset, size

    _, names, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        if data[names + name:names + name + len(SECTION) + 1] == SECTION + b"\0":
            return offset, offset + size
    return None


def _walk(data, start: int, end: int):
    """Each fat binary's entries, the fat binaries laid end to end (with alignment gaps)
    in [start, end)."""
    at = data.find(FATBIN_MAGIC, start, end)
    while at != -1:
        found = set()
        header_size, = struct.unpack_from("<H", data, at + 6)
        fat_size, = struct.unpack_from("<Q", data, at + 8)
        entry, stop = at + header_size, min(at + header_size + fat_size, end)
        while entry + 32 <= stop:
            kind, = struct.unpack_from("<H", data, entry)
            entry_header, payload = struct.unpack_from("<IQ", data, entry + 4)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if kind not in (PTX, CUBIN) or entry_header < 32:
                break
            found.add((kind, arch))
            entry += entry_header + payload
        if found:
            yield frozenset(found)
        at = data.find(FATBIN_MAGIC, max(stop, at + 4), end)


# ---------------------------------------------------------------- this machine
def build_code(paddle_module) -> Optional[Code]:
    """What the installed build has code for; None for a CPU build. Paddle 3.x lists its
    capabilities (`paddle.version.cuda_archs()`); 2.6's libraries are read."""
    if not paddle_module.is_compiled_with_cuda():
        return None
    listed = getattr(paddle_module.version, "cuda_archs", None)
    archs = [int(a) for a in re.findall(r"\d+", str(listed() if listed else ""))]
    if archs:
        return Code.of(archs)
    root = Path(paddle_module.__file__).parent
    return archs_of_libraries(sorted(root.glob("libs/libphi*.so*")) + sorted(root.glob("base/libpaddle.so")))


def capabilities(paddle_module, count: int, smi: Callable[[], Optional[str]]) -> List[Tuple[str, Tuple[int, int]]]:
    """(name, capability) of each GPU: from Paddle when it sees `count` GPUs, else from
    `smi()`, nvidia-smi's `--query-gpu=name,compute_cap --format=csv,noheader` output."""
    if count:
        cuda = paddle_module.device.cuda
        return [(cuda.get_device_name(i), tuple(cuda.get_device_capability(i))) for i in range(count)]
    found = []
    for line in (smi() or "").splitlines():
        name, _, cap = line.rpartition(",")
        major, dot, minor = cap.strip().partition(".")
        if name and dot and major.isdigit() and minor.isdigit():
            found.append((name.strip(), (int(major), int(minor))))
    return found


def lines(code: Optional[Code], gpus: Sequence[Tuple[str, Tuple[int, int]]]) -> List[Tuple[bool, str]]:
    """One verdict per distinct GPU model: [(runs, line)]; [] for a CPU build or no GPU."""
    if code is None:
        return []
    seen = dict.fromkeys(gpus)
    return [verdict(code, capability, f"the GPU ({name})") for name, capability in seen]
