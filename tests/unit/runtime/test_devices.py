"""Unit tests for paddle_dist.runtime.devices: how many processes a job runs, on which GPUs."""

import pytest

from paddle_dist.errors import DeviceError
from paddle_dist.runtime.devices import resolve_devices


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
