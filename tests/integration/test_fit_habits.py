"""fit() with the habits of paddle.Model users: Paddle's own callbacks and metrics on 2
ranks, DataLoaders with workers through a kill and a resume, and input errors shown
before any work, in one line."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from paddle_dist.runs.layout import Run

from ..oracles import read_metrics
from .procs import ROOT, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "fit_habits.py")
EXAMPLES = str(ROOT / "tests" / "integration" / "scripts" / "own_models.py")
LAUNCH = ["-m", "paddle_dist.launch", "--nprocs", "2"]


@pytest.fixture(scope="module")
def with_callbacks(tmp_path_factory):
    """One 2-rank run of the callbacks script per API level."""
    found = {}
    for api in ("loop", "hapi"):
        out = tmp_path_factory.mktemp(f"callbacks-{api}")
        done = run([*LAUNCH, "-o", f"train.api={api}", SCRIPT, "callbacks", str(out)], cwd=out, timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        found[api] = out
    return found


def _events(out: Path, rank: int):
    return json.loads((out / f"events{rank}.json").read_text())


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_callbacks_are_called_as_paddle_model_calls_them_on_every_rank(with_callbacks, api):
    out = with_callbacks[api]
    events = _events(out, 0)["events"]
    assert events == _events(out, 1)["events"]            # the same calls, the same eval logs
    names = [name for name, _ in events]
    assert names[0] == "on_train_begin" and names[-1] == "on_train_end"
    epochs = names.count("on_epoch_begin")
    metrics = read_metrics(out / "run")
    assert epochs == names.count("on_epoch_end") == names.count("on_eval_end") == len(metrics["history"])
    steps = names.count("on_train_batch_end")
    assert steps == metrics["steps"] == epochs * 6        # 96 samples, 8 per rank: 6 steps an epoch
    first = names.index("on_epoch_end")           # paddle.Model's order: epoch end, then evaluation
    assert names[first - 1] == "on_train_batch_end" and names[first + 1] == "on_eval_begin"
    # The eval logs carry the exact evaluation of every metric by its name, loss as a list.
    logs = [value for name, value in events if name == "on_eval_end"]
    for epoch, entry in zip(metrics["history"], logs):
        assert entry["loss"] == [epoch["eval_loss"]] and entry["auc"] == epoch["eval_auc"]
    assert dict(events)["on_train_batch_end"] == ["batch_size", "loss", "lr"]


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_paddles_own_callbacks_act(with_callbacks, api):
    out = with_callbacks[api]
    metrics = read_metrics(out / "run")
    history = metrics["history"]
    # EarlyStopping("acc", patience=1): the run ends after the first epoch without a better acc.
    accs = [h["eval_acc"] for h in history]
    stale = next(i for i in range(1, len(accs)) if accs[i] <= max(accs[:i]))
    assert len(history) == stale + 1 < 6
    # ReduceLROnPlateau("loss", patience=0): the lr halves after each epoch whose eval loss
    # is no better; the lr of the next epoch's steps says so.
    lrs = _epoch_lrs(out)
    losses, expected, best = [h["eval_loss"] for h in history], [], None
    lr = 0.5
    for loss in losses:
        if best is not None and loss >= best:
            lr *= 0.5
        best = loss if best is None else min(best, loss)
        expected.append(lr)
    assert lrs[1:] == expected[:-1]
    assert (out / "saved" / "final.pdparams").is_file() and (out / "saved" / "0.pdparams").is_file()
    assert list((out / "vdl").glob("vdlrecords.*.log"))                # Paddle's VisualDL callback


def _epoch_lrs(out: Path):
    """The lr each epoch's steps used, from the epoch lines of rank 0's log (the events
    file keeps the train logs' keys only)."""
    log = Run(out / "run").rank_log(0).read_text()
    return [float(r) for r in re.findall(r"epoch \d+/\d+ step \d+/\d+ loss \S+ lr (\S+)", log)]


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_accuracy_precision_recall_auc_equal_one_process(with_callbacks, api):
    out = with_callbacks[api]
    metrics = read_metrics(out / "run")["test_metrics"]
    done = run([SCRIPT, "evaluate", str(out)], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    one = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("acc", "precision", "recall", "auc"):
        assert metrics[name] == one[name], name
    assert abs(metrics["loss"] - one["loss"]) < 1e-6


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_dict_samples_two_inputs_and_workers_train_as_one_process_on_the_union(api, tmp_path):
    """2 ranks of 8 (dict samples, a two-input model, a DataLoader with 2 workers,
    parameter groups with their own rate, clipping) end with the same weights, and with
    those of one process (the loop level) trained on batches of 16: the union of the
    ranks' batches."""
    one, two = tmp_path / "one", tmp_path / "two"
    for out, command in ((one, [SCRIPT, "replay", str(one), "16"]),
                         (two, [*LAUNCH, "-o", f"train.api={api}", SCRIPT, "replay", str(two), "8"])):
        out.mkdir()
        done = run(command, cwd=tmp_path, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    ranks = [np.load(two / f"rank{r}.npz") for r in range(2)]
    reference = np.load(one / "rank0.npz")
    for name in reference.files:
        assert np.array_equal(ranks[0][name], ranks[1][name]), name
        np.testing.assert_allclose(ranks[0][name], reference[name], rtol=0, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("command", [[SCRIPT, "hwc"], [*LAUNCH, SCRIPT, "hwc"]])
def test_a_sample_in_the_wrong_layout_is_one_line_before_epoch_1(command, tmp_path):
    done = run(command, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("paddle_dist:")
             and "Warning" not in line]
    assert "Traceback" not in done.stderr and "epoch 1/" not in done.stdout + done.stderr
    said = "\n".join(lines)
    assert "the model's forward on the first training batch" in said
    assert "32, 32, 3]; labels int64" in said and "channels" in said     # what it got, what it expected
    assert "to continue this run" not in done.stdout + done.stderr


def test_a_dataloader_paddle_dist_cannot_shard_is_refused_at_the_call(tmp_path):
    done = run([SCRIPT, "own_sampler"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SubsetRandomSampler" in done.stderr
    assert not (tmp_path / "runs").exists()                  # refused before anything is on disk


def _left_in_shm():
    """Paddle's shared-memory segments (paddle_<pid>_...) whose maker is gone: what a
    killed process left (a live process's segments are its own business)."""
    found = set()
    for name in os.listdir("/dev/shm"):
        maker = re.match(r"paddle_(\d+)_", name)
        if maker and not os.path.exists(f"/proc/{maker.group(1)}"):
            found.add(name)
    return found


# Its check sees every process's leftovers in /dev/shm: under pytest-xdist (make test) it
# shares a worker with the tests whose killed ranks leave DataLoader segments until their
# launcher removes them (test_launch_failures.py), so none of those is ever half done then.
@pytest.mark.xdist_group("dev-shm")
def test_workers_through_a_kill_and_a_resume_end_bitwise_and_leave_no_shared_memory(tmp_path):
    """The segmentation example (DataLoader with 2 workers, train.ema_decay): rank 1 is
    killed mid-epoch; the same command continues from the mid-epoch checkpoint and ends
    with the weights and moving averages of an uninterrupted run."""
    common = ["-o", "train.ema_decay=0.9", "-o", "checkpoint.every_steps=5"]

    def job(out, *extra):
        return run([*LAUNCH, *common, "-o", f"output.run_dir={out}/run", *extra,
                    EXAMPLES, "train", "segmentation", str(out)], cwd=tmp_path, timeout=240)

    clean = tmp_path / "clean"
    clean.mkdir()
    assert job(clean).returncode == 0
    before = _left_in_shm()
    killed = tmp_path / "killed"
    killed.mkdir()
    stopped = job(killed, "-o", "faults.inject=kill:1:23")
    assert stopped.returncode != 0 and "rank 1" in stopped.stderr
    assert _left_in_shm() <= before                          # nothing left in /dev/shm
    done = job(killed)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in Run(killed / "run").rank_log(0).read_text()
    for name in ("evaluated.npz",):
        a, b = np.load(clean / name), np.load(killed / name)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    last = sorted(Run(clean / "run").checkpoints.glob("ckpt_*"))[-1].name
    a, b = (np.load(Run(out / "run").checkpoints / last / "ema.npz") for out in (clean, killed))
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


@pytest.mark.compat
def test_the_check_before_epoch_1_runs_training_batches_in_training_mode(tmp_path):
    """A model with heads in training only and a loss that takes them all, as PaddleSeg's
    BiSeNetV2 and its loss: the check runs the training batch as training runs it, and
    evaluation, with train.eval_loss=false, computes the metrics alone. (On 2 ranks at
    both levels: test_own_models.py's suite_segmentation.)"""
    done = run(["-m", "paddle_dist.launch", "--nprocs", "1", "-o", "train.eval_loss=false", SCRIPT, "aux_heads",
                str(tmp_path)], cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "!= 3 heads" not in done.stderr
    said = done.stdout + done.stderr
    assert "paddle_dist: evaluation: the metrics alone, no loss on evaluation batches (train.eval_loss=false)" in said
    history = read_metrics(tmp_path / "run")["history"]
    assert "eval_acc" in history[0] and "eval_loss" not in history[0]


@pytest.mark.compat
def test_an_evaluation_loss_that_cannot_take_evaluations_outputs_says_the_option(tmp_path):
    done = run([SCRIPT, "aux_heads", str(tmp_path)], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert ("the model's forward and the loss on the first evaluation batch (inputs float32 [8, 4]; labels "
            "int64 [8, 1]; in evaluation mode) failed: ValueError: 1 != 3 heads (fit_habits.py:") in done.stderr
    assert "in aux_loss); a loss that cannot take evaluation's outputs or labels" in done.stderr
    assert "-o train.eval_loss=false: the metrics alone" in done.stderr


@pytest.mark.compat
def test_dict_samples_split_by_position_say_their_keys_and_the_inputspec_fix(tmp_path):
    done = run([SCRIPT, "dict_keys"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "in training mode" in done.stderr     # it failed in evaluation mode too
    assert ("the samples are dicts with keys img: float32 [4, 4]; label: int64 [4, 1]; trans_info: list, "
            "none named after forward's arguments (x), so they were split by position") in done.stderr
    fix = re.search(r"e\.g\. fit\(\.\.\., (.*?)\)(?: \(|$)", done.stderr, re.M).group(1)
    assert fix == ("inputs=[paddle.static.InputSpec([None, 4], 'float32', 'img')], "
                   "labels=[paddle.static.InputSpec([None, 1], 'int64', 'label')]")
    pasted = run([SCRIPT, "dict_keys", fix], cwd=tmp_path, timeout=120)     # the fix runs as given
    assert pasted.returncode == 0, pasted.stderr[-3000:]


@pytest.mark.compat
def test_a_one_logit_classifier_gets_no_accuracy_and_one_line_says_why(tmp_path):
    """An argmax over one column names class 0 for every sample: a constant "accuracy"
    while the loss falls. Two columns keep the built-in accuracy."""
    said = {}
    for columns in ("1", "2"):
        done = run([SCRIPT, "one_logit", str(tmp_path / columns), columns], cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        said[columns] = done.stdout + done.stderr
    history = {c: read_metrics(tmp_path / c)["history"] for c in said}
    assert all("eval_accuracy" not in h and "eval_loss" in h for h in history["1"])
    assert "test accuracy" not in said["1"]
    assert said["1"].count("no built-in accuracy: the model's scores have one column (float32 [8, 1])") == 1
    assert all("eval_accuracy" in h for h in history["2"]) and "no built-in accuracy" not in said["2"]


@pytest.mark.compat
def test_a_sync_batch_norm_on_a_cpu_runs_as_batch_norm_on_one_rank(tmp_path):
    """Paddle has no CPU kernel for SyncBatchNorm. On one rank its math is a BatchNorm's:
    it trains as one, to the same weights."""
    for norm in ("sync", "bn"):
        done = run([SCRIPT, "sync_bn", str(tmp_path), norm], cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    assert "SyncBatchNorm layers ('1') run as BatchNorm: Paddle has no CPU kernel for them" in done.stderr + \
        Run(tmp_path / "sync").rank_log(0).read_text()
    sync, plain = np.load(tmp_path / "sync.npz"), np.load(tmp_path / "bn.npz")
    assert sorted(sync.files) == sorted(plain.files) and all(np.array_equal(sync[k], plain[k]) for k in sync.files)
    # On two ranks: refused before anything runs (tests/unit/sync/test_batchstats.py).


@pytest.mark.compat
def test_a_schedule_sized_from_len_dataloader_is_named_and_steps_gives_the_run(tmp_path):
    done = run([*LAUNCH, SCRIPT, "schedule", str(tmp_path)], cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for rank in (0, 1):      # 64 samples, 4 a batch: 16 batches in the loader, 8 a rank
        assert json.loads((tmp_path / f"steps{rank}.json").read_text()) == {
            "len": 16, "per_epoch": 8, "total": 16, "world_size": 2, "micro_batches": 1}
    said = done.stdout + done.stderr
    assert said.count("the optimizer's CosineAnnealingDecay runs for T_max=32 steps, but this run takes "
                      "16 (8 optimizer steps an epoch on each rank); size it from paddle_dist.steps") == 1


@pytest.mark.compat
def test_a_parameter_no_rank_trained_in_the_first_epoch_is_named_once(tmp_path):
    done = run([*LAUNCH, "-o", "train.api=hapi", SCRIPT, "untrained"], cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert said.count("2 of 6 trainable parameters got no gradient on any rank in the whole first "
                      "epoch, so they keep their initial values: unused.weight, unused.bias.") == 1, said
    assert "use_reentrant=False" in said


@pytest.mark.compat
def test_loss_parts_are_logged_beside_the_total_as_exactly_as_the_total(tmp_path):
    """A detector-like model whose own loss is {loss, loss_cls, loss_box} in training and
    which returns detections without a loss in evaluation: the parts are in the progress
    lines, metrics.json, VisualDL and the callbacks' logs, and the detections go to the
    metric, on 2 ranks, equal to one process on the union of the batches."""
    runs = {"loop": [*LAUNCH, SCRIPT], "one": [SCRIPT]}     # the hapi level: test_own_models' detector
    history = {}
    for name, command in runs.items():
        out = tmp_path / name
        out.mkdir()
        done = run(command + ["loss_parts", str(out), "16" if name == "one" else "8"], cwd=out, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        said = done.stdout + done.stderr
        assert re.search(r"step 2/4 loss [\d.]+ \(loss_box [\d.]+, loss_cls [\d.]+\) lr", said), said
        assert re.search(r"epoch 2/2 done: train loss [\d.]+ \(loss_box [\d.]+, loss_cls [\d.]+\) \| eval acc",
                         said), said
        assert ("paddle_dist: evaluation: the metrics on all the model's outputs: it returns no loss in "
                "evaluation (loss='model'), so there is no eval loss") in said
        metrics = read_metrics(out / "run")
        assert "test_accuracy" not in metrics and "test_loss" not in metrics     # no such numbers: left out
        assert metrics["test_metrics"] == {"acc": metrics["history"][-1]["eval_acc"]}
        history[name] = metrics["history"]
        for epoch in history[name]:
            assert epoch["train_loss"] == pytest.approx(epoch["train_loss_cls"] + epoch["train_loss_box"], rel=1e-6)
        events = json.loads((out / "parts0.json").read_text())
        assert dict(events)["on_train_batch_end"] == ["batch_size", "loss", "loss_box", "loss_cls", "lr"]
        assert b"train/loss_cls" in b"".join(p.read_bytes() for p in (out / "run" / "vdl").iterdir())
    for two, one in zip(history["loop"], history["one"]):
        assert two.keys() == one.keys()
        assert all(two[k] == pytest.approx(one[k], rel=1e-6) for k in two)


@pytest.mark.compat
@pytest.mark.parametrize("workers, where, says", [
    (2, "item", "reading sample 37 of Broken failed: ValueError: label of sample 37 is out of range "
                "(fit_habits.py:"),
    (0, "collate", "collating samples 32..39 with collate_points failed: ValueError: a box with negative "
                   "width (fit_habits.py:"),
])
def test_a_bad_sample_names_itself_with_and_without_workers(workers, where, says, tmp_path):
    """A sample's __getitem__ in a worker, a collate function in the rank (the other two
    pairs take the same paths: tests/unit/trainer/test_loading.py reads in the rank too)."""
    done = run([SCRIPT, "bad_sample", str(workers), where], cwd=tmp_path, timeout=180)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    said = done.stdout + done.stderr
    assert f"paddle_dist: error: {says}" in said, said[-3000:]
    assert "Blocking queue is killed" not in said.split("paddle_dist: error:")[-1]
    assert "to continue this run" not in said and "Root cause: rank 0 raised SystemError" not in said
