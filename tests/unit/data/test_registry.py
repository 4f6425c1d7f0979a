"""data/registry.py is the one list of the built-in job's data sets: the launcher's read of
the data before any rank starts (`verify`) is an entry's, and no other module compares
data.name with a data set's name."""

import re
from pathlib import Path

import pytest

from paddle_dist import config
from paddle_dist.data import registry
from paddle_dist.errors import DataError, UserError

PACKAGE = Path(__file__).resolve().parents[3] / "paddle_dist"


def _toy(monkeypatch, verify=None):
    entry = registry.DataSet("toy", "classification", None, build=lambda cfg: None, verify=verify)
    monkeypatch.setitem(registry.REGISTRY, "toy", entry)
    return config.load(None, ["data.name=toy", "model.name=mlp"])


def test_verify_reads_through_a_new_entrys_own_verify(monkeypatch):
    read = []
    registry.verify(_toy(monkeypatch, verify=lambda cfg: read.append(cfg.data.name)))
    assert read == ["toy"]


def test_an_entry_without_verify_reads_nothing(monkeypatch):
    registry.verify(_toy(monkeypatch))
    registry.verify(config.load(None, ["data.name=synthetic", "model.name=mlp"]))


@pytest.mark.parametrize("overrides, error", [
    (["data.name=mnist", "data.root=/nonexistent/mnist"], "/nonexistent/mnist"),
    (["data.name=imagefolder", "model.name=resnet18", "data.mean=a,b,c"], "data.mean"),
    (["data.name=imagefolder", "model.name=resnet18", "data.root=/nonexistent/images"], "/nonexistent/images"),
])
def test_the_built_in_entries_refuse_missing_or_bad_data(overrides, error):
    with pytest.raises((DataError, UserError), match=error):
        registry.verify(config.load(None, overrides))


def test_no_module_but_data_compares_data_name_with_a_name():
    compared = re.compile(r"data\.name\s*(==|!=|in\b)")
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.parent.name != "data"
             for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert found == []
