"""Models as Paddle users bring them (docs/examples/): dict samples, two inputs, their own
metrics and callbacks, DataLoaders with workers, EMA, through fit() on 2 ranks.

What crossed between the ranks is checked against one plain process: the metrics that
fit() reports equal a single-process evaluation of the weights the run evaluated, and
both API levels report the same numbers.
"""

import ast
import json
from pathlib import Path

import pytest

from ..oracles import read_metrics
from .procs import ROOT, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "own_models.py")
EXAMPLES = ROOT / "docs" / "examples"
# Each example, with what paddle_dist is given on top (the segmentation one: built-in EMA).
RUNS = {"segmentation": ["-o", "train.ema_decay=0.9"], "text_classifier": [], "suite_segmentation": [],
        "suite_detection": []}
SEEN = {}       # (example, api) -> metrics.json, shared between the tests of one example


def train(tmp_path_factory, example: str, api: str) -> dict:
    if (example, api) not in SEEN:
        out = tmp_path_factory.mktemp(f"{example}-{api}")
        done = run(["-m", "paddle_dist.launch", "--nprocs", "2", "-o", f"train.api={api}",
                    "-o", f"output.run_dir={out}/run", *RUNS[example], SCRIPT, "train", example, str(out)],
                   timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        metrics = read_metrics(out / "run")
        SEEN[(example, api)] = dict(metrics, out=str(out), stdout=done.stdout)
    return SEEN[(example, api)]


def single_process(weights: str, example: str) -> dict:
    done = run([SCRIPT, "evaluate", example, weights], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def suite_single_process(tmp_path_factory, example: str) -> dict:
    """A suite example's one-process evaluation of the loop run's saved weights, once
    (both levels train the same weights: test_both_api_levels_report_the_same_numbers)."""
    if (example, "one") not in SEEN:
        found = train(tmp_path_factory, example, "loop")
        SEEN[(example, "one")] = single_process(str(Path(found["out"]) / "run"), example)
    return SEEN[(example, "one")]


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_segmentation_metric_equals_one_process(tmp_path_factory, api):
    found = train(tmp_path_factory, "segmentation", api)
    assert found["world_size"] == 2 and found["test_samples"] == 61      # each sample once
    assert [h["epoch"] for h in found["history"]] == [1, 2, 3]
    # train.ema_decay: the run evaluated its moving averages, which load_weights takes.
    one = single_process(str(Path(found["out"]) / "run"), "segmentation")
    assert one["count"] == 61
    assert found["test_metrics"]["miou"] == one["miou"]         # counts: exactly the same
    assert "accuracy" not in found["test_metrics"]             # no task= trick needed
    assert "epoch 3: lr " in found["stdout"]                   # the user's callback ran


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_text_classifier_metrics_equal_one_process(tmp_path_factory, api):
    found = train(tmp_path_factory, "text_classifier", api)
    assert found["test_samples"] == 97
    one = single_process(str(Path(found["out"]) / "evaluated.npz"), "text_classifier")
    metrics = found["test_metrics"]
    for name in ("acc_top1", "acc_top2", "macro_f1"):
        assert metrics[name] == one[name], name
    assert abs(metrics["loss"] - one["loss"]) < 1e-5


@pytest.mark.parametrize("example", sorted(RUNS))
def test_both_api_levels_report_the_same_numbers(tmp_path_factory, example):
    loop, hapi = (train(tmp_path_factory, example, api) for api in ("loop", "hapi"))
    assert loop["history"] == hapi["history"]


@pytest.mark.parametrize("example", ["segmentation", "text_classifier"])     # those with a plain form
def test_the_plain_script_and_the_fit_script_differ_in_five_lines(example):
    """The example's `if plain:` branch is its paddle.Model form, the `else:` branch its
    paddle_dist form: together at most 5 lines."""
    tree = ast.parse((EXAMPLES / f"{example}.py").read_text())
    branch = next(node for node in ast.walk(tree) if isinstance(node, ast.If)
                  and isinstance(node.test, ast.Name) and node.test.id == "plain")
    lines = sum(s.end_lineno - s.lineno + 1 for s in [*branch.body, *branch.orelse])
    assert lines <= 5 and any("paddle.Model" in ast.unparse(s) for s in branch.body)
    assert any("paddle_dist.fit" in ast.unparse(s) for s in branch.orelse)


def test_the_plain_script_runs_unchanged_under_paddle_dist_launch(tmp_path):
    done = run(["-m", "paddle_dist.launch", "--nprocs", "2", str(EXAMPLES / "text_classifier.py"), "--plain"],
               cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_paddleseg_style_script_trains_by_steps_and_its_miou_equals_one_process(tmp_path_factory, api):
    """PaddleSeg's habits (docs/examples/suite_segmentation.py): dict samples with extra
    keys, heads in training only, a loss on training outputs in parts, validation labels
    of another shape, mIoU, iterations and evaluation every N of them."""
    found = train(tmp_path_factory, "suite_segmentation", api)
    assert [h["step"] for h in found["history"] if "step" in h] == [16, 32, 48] and found["steps"] == 48
    assert "paddle_dist: evaluation: the metrics alone, no loss on evaluation batches" in found["stdout"]
    assert "train_loss_aux1" in found["history"][-1] and "test_loss" not in found
    one = suite_single_process(tmp_path_factory, "suite_segmentation")
    assert found["test_metrics"] == {"miou": one["miou"]} and one["miou"] > 0.9


@pytest.mark.compat
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_paddledetection_style_detector_logs_its_loss_parts_and_its_recall_equals_one_process(
        tmp_path_factory, api):
    """PaddleDetection's habits (docs/examples/suite_detection.py): the model's own loss
    in parts in training, detections without a loss in evaluation."""
    found = train(tmp_path_factory, "suite_detection", api)
    assert "no loss in evaluation (loss='model'), so there is no eval loss" in found["stdout"]
    assert all({"train_loss_cls", "train_loss_box", "eval_recall50"} <= set(h) for h in found["history"])
    one = suite_single_process(tmp_path_factory, "suite_detection")
    assert found["test_metrics"] == {"recall50": one["recall50"]}

