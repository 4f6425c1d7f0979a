"""The ranks check each other (paddle_dist/trainer/agreement.py): which parameter and which
ranks a difference names, the check itself over a stand-in all-gather, the injected
perturbation, and how a diverged run is recorded, reported and listed (exit 7).
The real 2-rank job is tests/integration/test_weights_check.py."""

import zlib
from types import SimpleNamespace

import numpy as np
import paddle
import paddle.distributed as dist
import pytest

from paddle_dist import errors
from paddle_dist.runtime import inject, monitor as rank_monitor
from paddle_dist.runs import report, status, listing
from paddle_dist.trainer import agreement
from paddle_dist.trainer.agreement import digests, disagreement, rank_words

NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


# ------------------------------------------------------------------ the comparison
def test_ranks_that_agree_say_nothing():
    assert disagreement(NAMES, [[1, 2, 3, 4]] * 4) == ""


def test_two_ranks_name_the_first_parameter_that_differs():
    assert disagreement(NAMES, [[1, 2, 3, 4], [1, 2, 9, 8]]) == \
        "'fc2.weight' is one value on rank 0 and another on rank 1"


def test_three_ranks_name_the_odd_one_out_last():
    assert disagreement(NAMES, [[1, 2, 3, 4], [1, 7, 3, 4], [1, 2, 3, 4]]) == \
        "'fc1.bias' is one value on ranks 0, 2 and another on rank 1"
    # the odd one out is rank 0: the most common value still comes first
    assert disagreement(NAMES, [[5, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]) == \
        "'fc1.weight' is one value on ranks 1, 2 and another on rank 0"


def test_more_values_than_two_are_counted():
    three = [[1], [2], [1], [3]]
    assert disagreement(["w"], three) == \
        "'w' has 3 different values: one on ranks 0, 2, a second on rank 1 and a third on rank 3"
    every = [[r] for r in range(6)]
    assert disagreement(["w"], every) == ("'w' has 6 different values: one on rank 0, a second on "
                                          "rank 1, a third on rank 2 and 3 more on the other ranks")


def test_rank_lists_stay_short_on_many_ranks():
    assert rank_words([3]) == "rank 3"
    assert rank_words([2, 0]) == "ranks 0, 2"
    assert rank_words([0, 1, 2, 3, 5, 6, 8, 9, 10]) == "ranks 0-3, 5, 6, 8-10"
    gathered = [[1]] * 64
    gathered[17] = [2]
    assert disagreement(["w"], gathered) == "'w' is one value on ranks 0-16, 18-63 and another on rank 17"


# ------------------------------------------------------------------ the digests
def test_a_digest_is_the_crc32_of_the_tensors_bytes_in_state_dict_order():
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.BatchNorm1D(3))
    names, values = digests(net)
    state = net.state_dict()
    assert names == list(state) and values.dtype == np.int64
    assert values.tolist() == [zlib.crc32(t.numpy().tobytes()) for t in state.values()]


def test_one_changed_element_changes_its_tensors_digest_only():
    paddle.seed(1)
    net = paddle.nn.Linear(64, 64)
    before = digests(net)[1]
    with paddle.no_grad():
        net.weight[17, 5] = net.weight[17, 5] + 1e-7     # one float32 step or so
    after = digests(net)[1]
    assert after[0] != before[0] and after[1] == before[1]


# ------------------------------------------------------------------ the check
DISTRIBUTED = SimpleNamespace(is_distributed=True, global_rank=0, world_size=2)


def _gathering(peer_values):
    """A stand-in for dist.all_gather: this rank's digests, then a peer's."""
    def all_gather(out, tensor, *args, **kwargs):
        out += [tensor, paddle.to_tensor(peer_values(tensor.numpy()))]
    return all_gather


def test_the_check_raises_diverged_with_the_one_line(monkeypatch):
    net = paddle.nn.Linear(3, 2)
    monkeypatch.setattr(dist, "all_gather", _gathering(lambda mine: mine + [0, 1]))
    with pytest.raises(errors.Diverged) as caught:
        agreement.check(net, DISTRIBUTED, step=12)
    assert str(caught.value) == ("the ranks' weights differ at step 12: 'bias' is one value on rank 0 "
                                 "and another on rank 1; data parallelism broke (docs/faults.md)")
    assert caught.value.code == errors.EXIT_DIVERGED == 7
    assert errors.exit_code_of(caught.value) == 7 and errors.outcome_of(caught.value) == "diverged"


def test_the_check_passes_when_the_ranks_agree_and_is_skipped_alone(monkeypatch):
    net = paddle.nn.Linear(3, 2)
    monkeypatch.setattr(dist, "all_gather", _gathering(lambda mine: mine))
    agreement.check(net, DISTRIBUTED, step=3)
    monkeypatch.setattr(dist, "all_gather", lambda *a, **k: pytest.fail("one process: no collective"))
    agreement.check(net, SimpleNamespace(is_distributed=False), step=3)


# ------------------------------------------------------------------ the injected perturbation
@pytest.mark.parametrize("rank, step, moved", [(1, 3, True), (1, 2, False), (0, 3, False)])
def test_perturb_moves_the_first_trainable_parameter_of_that_rank_at_that_step(rank, step, moved):
    net = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.Linear(2, 1))
    net[0].weight.stop_gradient = True             # frozen: not the one to move
    monitor = rank_monitor.Monitor(SimpleNamespace(global_rank=rank, local_rank=rank), None,
                                   fault="perturb:1:3")
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    monitor.perturb(net, step)
    after = net.state_dict()
    changed = [k for k in before if not np.array_equal(before[k], after[k].numpy())]
    assert changed == (["0.bias"] if moved else [])
    if moved:
        assert np.allclose(after["0.bias"].numpy() - before["0.bias"], inject.PERTURBATION)


# ------------------------------------------------------------------ how a diverged job ends
LINE = ("the ranks' weights differ at step 4: 'fc1.weight' is one value on rank 0 and another "
        "on rank 1; data parallelism broke (docs/faults.md)")


def _diverged_run(run_dir, ranks=2):
    """Every rank's status record as the trainer writes it when the check fails."""
    for rank in range(ranks):
        monitor = rank_monitor.Monitor(SimpleNamespace(global_rank=rank, local_rank=rank), run_dir)
        monitor.step_no = 4
        monitor.finish(errors.outcome_of(errors.Diverged(LINE)), errors.Diverged(LINE))
    (run_dir / "config.yaml").write_text("train: {}\n")
    return run_dir


def test_the_report_is_the_one_line_and_offers_no_command_to_continue(tmp_path):
    run_dir = _diverged_run(tmp_path)
    (run_dir / "run.json").write_text('{"command": ["python", "train.py", "-o", "dist.nprocs=2"], '
                                      '"same_command_continues": true}')
    (run_dir / "checkpoints" / "ckpt_000000002").mkdir(parents=True)
    exits = [report.Exit(0, 7, 10.0), report.Exit(1, 7, 10.01)]
    found = report.with_resume(report.root_cause(status.read_all(run_dir), exits=exits), run_dir,
                               rerun=["python", "-m", "paddle_dist.launch", "x.py"])
    assert found.code == 7 and found.diverged
    assert found.lines[0] == f"paddle_dist: job failed (exit 7). Root cause: {LINE}"
    assert found.lines[1] == (f"paddle_dist: this run is not continued; its checkpoints, each checked "
                              f"before it was written, are in {run_dir / 'checkpoints'} (docs/faults.md, "
                              "\"The ranks' weights differ\", says what to do)")
    assert len(found.lines) == 2 and "to continue" not in found.text and "to run it again" not in found.text


def test_runs_lists_a_diverged_run_without_a_command(tmp_path):
    _diverged_run(tmp_path / "job-1")
    (listed,) = listing.recent(tmp_path, 5)
    assert listed["state"] == "diverged" and listed["resume"] == "" and listed["step"] == 4


def test_a_script_that_exits_7_by_itself_is_no_divergence(tmp_path):
    found = report.with_resume(report.root_cause({}, exits=[report.Exit(0, 7, 1.0), report.Exit(1, 0, 1.1)]),
                               None, rerun=["python", "-m", "paddle_dist.launch", "x.py"])
    assert found.code == 7 and not found.diverged
    assert found.lines[-1] == "paddle_dist: to run it again, run: python -m paddle_dist.launch x.py"
