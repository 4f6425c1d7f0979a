"""Which Paddle this is: its version, whether paddle_dist supports it, what it was built
for (CPU, or CUDA and cuDNN), and whether the CUDA libraries a GPU build opens load here.

A GPU build of Paddle links CUDA's runtime (PyPI's paddlepaddle-gpu 2.6.2 statically) but
opens cuDNN, cuBLAS, cuRAND, cuSOLVER and NCCL with dlopen at first use
(paddle/phi/backends/dynload/dynamic_loader.cc): `import paddle` works on a machine that
lacks them, and the first convolution or all-reduce fails. The names follow the build's
CUDA and cuDNN major versions (PyPI's 2.6.2, CUDA 11.8 + cuDNN 8.6: libcudnn.so.8,
libcublas.so.11, libcurand.so.10, libcusolver.so.11, libnccl.so.2; CUDA 12: libcublas.so.12).

Where Paddle looks: a build with `paddle.version.with_pip_cuda_libraries == 'ON'` (3.x
from Paddle's own index) first in <site-packages>/nvidia/<lib>/lib, where the
nvidia-*-cuXX pip packages put them (paddle/__init__.py points FLAGS_cudnn_dir and the
others there), then on the system's search path (LD_LIBRARY_PATH, ldconfig); PyPI's
2.6.2 only on the system's search path. cuDNN is also looked for in /usr/local/cuda/lib64.

Every function takes the facts as arguments, so a test can be a CUDA 11.8 build without
cuDNN on a machine that has no GPU.

Example:
    build = current()                      # Build('3.3.1', cuda=None, ...) on a CPU build
    found = probe(libraries(build), site_packages())
    print(fix(build, found, site_packages()))   # None when nothing is missing
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .. import compat

SYSTEM_CUDA = Path("/usr/local/cuda/lib64")      # Paddle's extra place for cuDNN


@dataclass(frozen=True)
class Build:
    """What `paddle.version` says about the build. `cuda` None: a CPU build."""

    version: str
    cuda: Optional[str] = None          # "12.0"
    cudnn: Optional[str] = None         # "8.9.1" (or a number such as "8906")
    pip_libraries: bool = False         # Paddle looks in site-packages/nvidia/*/lib first

    def describe(self) -> str:
        """'CPU' or 'CUDA 12.0, cuDNN 8.9.1'."""
        if self.cuda is None:
            return "CPU"
        return f"CUDA {self.cuda}, cuDNN {self.cudnn or '?'}"


@dataclass(frozen=True)
class Library:
    """A library a GPU build opens: its file name, the pip package that ships it and the
    folder under site-packages/nvidia/ that package puts it in."""

    soname: str
    package: str
    folder: str


def current() -> Build:
    """This process's Paddle build, from `paddle.version`."""
    import paddle

    v = paddle.version
    return Build(v.full_version, version_of(v, "cuda"), version_of(v, "cudnn"),
                 getattr(v, "with_pip_cuda_libraries", "OFF") == "ON")


def version_of(version_module, name: str) -> Optional[str]:
    """`paddle.version.<name>()` as a string, None where the build has none."""
    # A CPU build answers False for cuda()/cudnn() and '0' for nccl(); 2.6 has no nccl().
    value = getattr(version_module, name, lambda: None)()
    return None if value in (None, False, "", "0", "False") else str(value)


def site_packages() -> Optional[Path]:
    """The folder Paddle is installed in (the nvidia-* packages' folder is beside it)."""
    folder = compat.paddle_dir()
    return folder.parent if folder else None


# ---------------------------------------------------------------- CUDA libraries
def libraries(build: Build) -> List[Library]:
    """The libraries `build` opens at run time, named for its CUDA and cuDNN versions
    (none for a CPU build). CUDA's runtime is listed for the builds that ship it as a
    pip package of its own (3.x); 2.6 links it statically."""
    if build.cuda is None:
        return []
    cu = compat.parse_version(build.cuda)[0]
    major, minor = _cudnn_major_minor(build.cudnn)
    libs = [Library(f"libcudnn.so.{major}", f"nvidia-cudnn-cu{cu}=={major}.{minor}.*", "cudnn"),
            Library(f"libcublas.so.{cu}", f"nvidia-cublas-cu{cu}", "cublas"),
            Library("libcurand.so.10", f"nvidia-curand-cu{cu}", "curand"),
            Library(f"libcusolver.so.{min(cu, 11)}", f"nvidia-cusolver-cu{cu}", "cusolver"),
            Library("libnccl.so.2", f"nvidia-nccl-cu{cu}", "nccl")]
    if build.pip_libraries:
        runtime = "libcudart.so.11.0" if cu == 11 else f"libcudart.so.{cu}"
        libs.append(Library(runtime, f"nvidia-cuda-runtime-cu{cu}", "cuda_runtime"))
    return libs


def _cudnn_major_minor(cudnn: Optional[str]) -> Tuple[int, int]:
    """(8, 9) from '8.9.1', and from cuDNN's own number ('8906'; 9.x: '90100')."""
    numbers = compat.parse_version(cudnn or "")
    if len(numbers) >= 2:
        return numbers[0], numbers[1]
    number = numbers[0] if numbers else 0
    if number >= 10000:                              # cuDNN 9: major * 10000 + minor * 100
        return number // 10000, number // 100 % 100
    return number // 1000, number // 100 % 10        # cuDNN 8: major * 1000 + minor * 100


def load_library(name: str) -> str:
    """dlopen `name` (a path, or a file name for the system's search path) as Paddle
    does; return the file that was loaded. OSError when it does not load."""
    ctypes.CDLL(name)
    return name if "/" in name else (_mapped(name) or name)


def _mapped(soname: str) -> Optional[str]:
    """The path of a loaded library whose file name starts with `soname` (the real file
    behind a libcudnn.so.8 link is libcudnn.so.8.9.1), from /proc/self/maps."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = (line.split(None, 5)[-1] for line in lines if line.count(" ") >= 5)
    return next((p for p in paths if Path(p).name.startswith(soname)), None)


def probe(libs: List[Library], site: Optional[Path],
          loader: Callable[[str], str] = load_library) -> Dict[str, Optional[str]]:
    """soname -> where it loads from, or None where it does not, trying the places Paddle
    tries in its order. `loader(name)` returns what it loaded or raises OSError.

    Example:
        probe(libraries(Build("2.6.2", "11.8", "8.6.0")), None)
        # {'libcudnn.so.8': None, 'libcublas.so.11': '/usr/local/cuda/lib64/libcublas.so.11', ...}
    """
    found = {}
    for lib in libs:
        places = [str(site / "nvidia" / lib.folder / "lib" / lib.soname)] if site else []
        places.append(lib.soname)
        if lib.folder == "cudnn":
            places.append(str(SYSTEM_CUDA / lib.soname))
        found[lib.soname] = _first_loading(places, loader)
    return found


def _first_loading(places: List[str], loader: Callable[[str], str]) -> Optional[str]:
    for place in places:
        try:
            return loader(place)
        except OSError:
            continue
    return None


def fix(build: Build, found: Dict[str, Optional[str]], site: Optional[Path]) -> Optional[str]:
    """One line saying what to install for the libraries that did not load (None when
    every one did).

    Example:
        fix(Build("2.6.2", "11.8", "8.6.0"), {"libcudnn.so.8": None}, Path("/venv/site"))
        # 'pip install "nvidia-cudnn-cu11==8.6.*" and export LD_LIBRARY_PATH=/venv/site/nvidia/cudnn/lib:...'
    """
    missing = [lib for lib in libraries(build) if found.get(lib.soname) is None]
    if not missing:
        return None
    packages = " ".join(f'"{lib.package}"' if "*" in lib.package else lib.package for lib in missing)
    system = (f"or install CUDA {build.cuda} and cuDNN {'.'.join(map(str, _cudnn_major_minor(build.cudnn)))} "
              "from NVIDIA and add their lib64 folder to LD_LIBRARY_PATH")
    if build.pip_libraries:
        return f"pip install {packages} (Paddle {build.version} finds them in site-packages/nvidia), {system}"
    root = site or Path("<site-packages>")
    folders = ":".join(str(root / "nvidia" / lib.folder / "lib") for lib in missing)
    return (f"pip install {packages} and export LD_LIBRARY_PATH={folders}:$LD_LIBRARY_PATH "
            f"(Paddle {build.version} searches LD_LIBRARY_PATH only), {system}")
