"""tests/oracles.py, which the other tests compare runs with: a wrong oracle passes wrong runs."""

import json
import socket

import numpy as np
import pytest

from paddle_dist.runs.layout import Run, checkpoint_name
from tests.oracles import (References, checkpoint_arrays, differing, final_weights, free_port, latest_checkpoint,
                           max_difference, rank_status, rank_statuses, read_metrics)


def _checkpoint(root, step, weight):
    folder = root / checkpoint_name(step)
    folder.mkdir(parents=True)
    np.savez(folder / "model.npz", w=np.full(2, weight, "float32"))
    np.savez(folder / "optimizer.npz", m=np.zeros(1))
    return folder


def test_a_reference_is_made_once_per_key_when_first_asked_for(tmp_path_factory):
    made = []

    def make(out, key):
        made.append((out.name, key))
        return key
    refs = References(tmp_path_factory, "clean", make)
    assert made == []
    assert refs["loop"] == "loop" and refs["loop"] == "loop" and refs[1, "hapi"] == (1, "hapi")
    assert [key for _, key in made] == ["loop", (1, "hapi")]
    assert made[0][0].startswith("clean-loop") and made[1][0].startswith("clean-1-hapi")


def test_a_reference_that_failed_fails_again_without_running_again(tmp_path_factory):
    calls = []

    def make(out, key):
        calls.append(key)
        raise AssertionError("exit 1")
    refs = References(tmp_path_factory, "clean", make)
    for _ in range(2):
        with pytest.raises(AssertionError, match="exit 1"):
            refs["loop"]
    assert calls == ["loop"]


def test_the_latest_checkpoint_is_the_one_layout_finds(tmp_path):
    run = Run(tmp_path)
    _checkpoint(run.checkpoints, 5, 1.0)
    newest = _checkpoint(run.checkpoints, 10, 2.0)
    assert latest_checkpoint(tmp_path) == newest                # no `latest` file: the newest
    (run.checkpoints / "latest").write_text(checkpoint_name(5))
    assert latest_checkpoint(tmp_path).name == checkpoint_name(5)
    assert final_weights(tmp_path)["w"].tolist() == [1.0, 1.0]
    best = _checkpoint(run.best, 7, 3.0)
    assert latest_checkpoint(tmp_path, best=True) == best and final_weights(tmp_path, best=True)["w"][0] == 3.0
    with pytest.raises(AssertionError, match="no checkpoint in"):
        latest_checkpoint(tmp_path / "elsewhere")


def test_checkpoint_arrays_key_every_array_by_its_file(tmp_path):
    folder = _checkpoint(tmp_path, 1, 1.0)
    assert sorted(checkpoint_arrays(folder)) == ["model.npz:w", "optimizer.npz:m"]
    assert sorted(checkpoint_arrays(folder, ["model"])) == ["model.npz:w"]


def test_max_difference_is_exact_and_compares_the_same_keys():
    a = {"w": np.array([1.0, 2.0], "float32"), "n": np.array([0], "uint8")}
    b = {"w": np.array([1.0, 2.5], "float32"), "n": np.array([3], "uint8")}
    assert max_difference(a, b) == 3.0                         # uint8 0 - 3 does not wrap to 253
    assert max_difference(a, a) == 0.0
    with pytest.raises(AssertionError):
        max_difference(a, {"w": a["w"]})
    with pytest.raises(AssertionError):
        max_difference({}, {})                                  # nothing compared is no pass


def test_differing_names_the_arrays_that_are_not_bitwise_equal():
    a = {"x": np.array([1.0]), "y": np.array([2.0])}
    assert differing(a, {"x": np.array([1.0]), "y": np.array([2.0 + 1e-15])}) == ["y"]
    with pytest.raises(AssertionError):
        differing(a, {"x": a["x"]})


def test_a_runs_records_are_read_where_layout_puts_them(tmp_path):
    run = Run(tmp_path)
    run.status.mkdir()
    for rank in (0, 1):
        run.rank_status(rank).write_text(json.dumps({"rank": rank}))
    run.metrics.write_text(json.dumps({"steps": 3}))
    assert rank_status(tmp_path, 1) == {"rank": 1}
    assert rank_statuses(tmp_path) == [{"rank": 0}, {"rank": 1}]
    assert read_metrics(tmp_path) == {"steps": 3}


def test_a_free_port_can_be_listened_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
