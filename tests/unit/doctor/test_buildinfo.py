"""Unit tests for paddle_dist.doctor.buildinfo: the libraries a Paddle build needs, and loading one."""

from __future__ import annotations

from pathlib import Path

import pytest

from paddle_dist.doctor import buildinfo


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


def test_load_library_returns_the_file_or_raises():
    path = buildinfo.load_library("libc.so.6")
    assert Path(path).name.startswith("libc.so.6") or Path(path).name.startswith("libc-")
    assert Path(path).is_file()
    with pytest.raises(OSError):
        buildinfo.load_library("libnosuchlibrary.so.7")
