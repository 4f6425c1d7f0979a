"""sync/transports.py is the one list of transports: an entry added there is checked,
chosen and opened by everything that names a transport (GradSync, reducers.open_reducer,
allreduce_perf's --transport), and no other module compares a transport's name."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from paddle_dist import allreduce_perf
from paddle_dist.errors import ConfigError, UserError
from paddle_dist.sync import reducers, transports

PACKAGE = Path(__file__).resolve().parents[3] / "paddle_dist"
CPU_RANK = SimpleNamespace(is_distributed=True, global_rank=0, world_size=2, backend="gloo", device="cpu")


class Opened:
    """A reducer that only says how it was opened."""

    def __init__(self, entry, how):
        self.transport, self.how = entry, how


def _toy(monkeypatch, name="toy", compresses=False):
    """Register a transport `name` for this test only; its reducers record their opening."""
    opened = []

    def opener(env, count, phase, **compress):
        opened.append((count, compress))
        return Opened(entry, compress)
    entry = transports.Transport(name, auto_mode="fused", fused=True, compresses=compresses, opener=opener)
    monkeypatch.setitem(transports.REGISTRY, name, entry)
    return entry, opened


def test_a_new_entry_is_a_value_of_sync_transport_and_of_allreduce_perf(monkeypatch):
    with pytest.raises(ConfigError, match="must be one of auto, shm, hierarchical, backend"):
        transports.check("toy")
    _toy(monkeypatch)
    transports.check("toy")
    assert transports.names()[-1] == "toy"
    assert allreduce_perf.parse_args(["--transport", "toy"]).transport == "toy"


def test_open_reducer_opens_the_named_entry_and_compresses_only_through_one_that_can(monkeypatch):
    entry, opened = _toy(monkeypatch)
    assert reducers.open_reducer(CPU_RANK, "toy", 10).transport is entry
    assert opened == [(10, {})]                    # an opener of three arguments suffices
    with pytest.raises(ConfigError, match="sync.transport=toy exchanges float32"):
        reducers.open_reducer(CPU_RANK, "toy", 10, compress="bf16")


def test_auto_with_compress_takes_the_first_entry_that_compresses(monkeypatch):
    assert transports.carrier("auto", "bf16") is transports.BACKEND
    assert transports.carrier("auto") is None      # by where the ranks are (open_reducer)
    monkeypatch.setitem(transports.REGISTRY, "backend",
                        transports.Transport("backend", "overlap", False, False, "reducers:open_backend"))
    entry, opened = _toy(monkeypatch, compresses=True)
    assert transports.carrier("auto", "bf16") is entry
    assert reducers.open_reducer(CPU_RANK, "auto", 7, compress="bf16").how == {"compress": "bf16"}


def test_grad_sync_opens_a_compressed_cpu_exchange_through_the_registry(monkeypatch):
    import paddle

    from paddle_dist.sync.grad_sync import GradSync

    entry, opened = _toy(monkeypatch, "backend", compresses=True)
    sync = GradSync(CPU_RANK, mode="fused", compress="bf16")
    sync._setup([paddle.create_parameter([3], "float32")])
    assert sync.reducer.transport is entry and opened == [(3 + 1 + 1, {"compress": "bf16"})]


def test_fp16_over_gloo_is_refused_by_the_registrys_check():
    with pytest.raises(ConfigError, match="sync.compress=fp16 does not work with gloo"):
        transports.check("auto", "fp16", "gloo")
    transports.check("auto", "fp16", "nccl")
    from paddle_dist import config

    assert not hasattr(config, "check_compress")   # one place says what can carry sync.compress


def test_allreduce_perf_opens_its_transport_through_the_entry(monkeypatch):
    entry, opened = _toy(monkeypatch)
    assert allreduce_perf.open_reducer(CPU_RANK, "toy", 64).transport is entry
    assert allreduce_perf.open_reducer(CPU_RANK, "backend", 64) is None   # the process group's own
    monkeypatch.setitem(transports.REGISTRY, "toy", transports.Transport(
        "toy", "fused", True, False, lambda env, count, phase: reducers.open_shm_only(env, count, phase)))
    monkeypatch.setattr(reducers, "_gather", lambda env, value, phase: ["host-a", "host-b"])
    with pytest.raises(UserError, match=r"^--transport toy: sync.transport=shm needs every rank on this "
                                        r"machine .*; use --transport backend$"):
        allreduce_perf.open_reducer(CPU_RANK, "toy", 64)


# Files whose "shm" is no transport: the doctor's facts about /dev/shm.
NOT_TRANSPORTS = {"transports.py", "doctor/facts.py"}


def test_no_module_but_the_registry_compares_a_transports_name():
    names = "|".join(transports.REGISTRY)
    compared = re.compile(rf"""(==|!=)\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*.py"))
             if not any(str(path).endswith(name) for name in NOT_TRANSPORTS)
             for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert found == []
