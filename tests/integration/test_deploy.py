"""From a trained run to use: export, predict, evaluation only, and image folders.

The main job's run (LeNet on the bundled MNIST, 2 ranks: tests/integration/conftest.py)
is shared by the tests of this module; every command runs as a real process on real files.
"""

import json
import math
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml
from PIL import Image

from paddle_dist import checkpoint, compat, export as export_module, models, options, predict
from paddle_dist.data.datasets import mnist_dataset
from paddle_dist.data.mnist import load_mnist
from paddle_dist.runs.layout import Run

from ..oracles import ending, final_weights, latest_checkpoint, max_difference, rank_status, read_metrics
from .procs import ROOT, check, run

MLP = ROOT / "configs" / "mnist_mlp.yaml"


@pytest.fixture(scope="module")
def demo_run(main_job):
    result, run_dir = main_job
    out = result.stdout + result.stderr
    epochs = yaml.safe_load(Run(run_dir).config.read_text())["train"]["epochs"]
    assert f"to deploy it: python -m paddle_dist.export {run_dir}" in out
    assert f"of {epochs} evaluations; its checkpoint is {run_dir / 'best'}" in out and "best eval_accuracy " in out
    status = rank_status(run_dir, 0)
    assert status["epoch"] == epochs                 # 1-based, as "epoch 12/12" was printed
    return run_dir


def _runs(root):
    return [d for d in root.iterdir() if d.is_dir()]


def _snapshot(folder):
    """Every file under `folder` with its size and modification time."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _dygraph(checkpoint_dir, name="lenet", num_classes=0):
    net = models.build(name, num_classes)
    checkpoint.restore(checkpoint.load(checkpoint_dir), net, rng=False)
    net.eval()
    return net


@pytest.mark.compat
def test_export_then_predict_gives_the_models_own_answers(demo_run, tmp_path):
    exported = check(run(["-m", "paddle_dist.export", str(demo_run)]))
    out = demo_run / "export"
    deploy = json.loads((out / "deploy.json").read_text())
    program = "model.json" if compat.program_file(out, "model").suffix == ".json" else "model.pdmodel"
    names = {p.name for p in out.iterdir()}
    assert names - {"model.pdiparams.info"} == {"deploy.json", program, "model.pdiparams"}   # .info: 2.6
    assert deploy["model_file"] == program
    best = latest_checkpoint(demo_run, best=True)
    assert deploy["checkpoint"] == str(best.resolve())                 # best/ first
    assert deploy["inputs"] == [{"name": "image", "shape": [-1, 1, 28, 28], "dtype": "float32"}]
    assert deploy["classes"] == [str(d) for d in range(10)]
    assert deploy["preprocess"]["mean"] == [0.1307] and deploy["preprocess"]["color"] == "L"
    assert f"python -m paddle_dist.predict {out}" in exported.stdout
    # 20 bundled test digits as PNG files, as a user would have them.
    images, labels = load_mnist("", "test")
    paths = []
    for i in range(20):
        paths.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray(images[i]).save(paths[-1])
    predicted = json.loads(check(run(["-m", "paddle_dist.predict", str(out), *paths, "--json", "-k", "2"])).stdout)
    assert [p["image"] for p in predicted] == paths and all(len(p["top"]) == 2 for p in predicted)
    top = np.array([p["top"][0]["index"] for p in predicted])
    # The same weights in dygraph, on the training pipeline's inputs: the same answers.
    with paddle.no_grad():
        logits = _dygraph(best)(paddle.to_tensor(mnist_dataset("", "test").x[:20])).numpy()
    assert (top == logits.argmax(axis=1)).all()
    probability = np.exp(logits - logits.max(1, keepdims=True))
    probability /= probability.sum(1, keepdims=True)
    assert abs(predicted[0]["top"][0]["probability"] - probability[0].max()) < 1e-4
    # 20 samples of a run with test accuracy p: right within 3 standard deviations.
    p = deploy["eval_accuracy"]
    assert abs((top == labels[:20]).mean() - p) <= 3 * math.sqrt(p * (1 - p) / 20) + 0.05
    lines = check(run(["-m", "paddle_dist.predict", str(out), paths[0], "-k", "2"])).stdout.splitlines()
    assert lines == [f"{paths[0]}: " + ", ".join(f"{t['class']} ({t['probability']:.3f})"
                                                   for t in predicted[0]["top"])]


def test_bad_input_is_one_line_and_exit_2_and_nothing_is_lost(demo_run, tmp_path, capfd):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    # One case per command as a real process (the exit-code path), the others in this one.
    processes = {
        "not found": ["-m", "paddle_dist.export", str(tmp_path / "nowhere")],
        "cannot read image": ["-m", "paddle_dist.predict", str(demo_run / "export"), str(a_file)],
    }
    here = {
        "already exists": (export_module.main, [str(demo_run), "--out", str(taken)]),
        "cannot write": (export_module.main, [str(demo_run), "--out", str(a_file / "out")]),
        "does not fit this model": (export_module.main, [str(Run(demo_run).checkpoints), "-c", str(MLP),
                                                         "--out", str(tmp_path / "o")]),
        "no readable deploy.json": (predict.main, [str(tmp_path), str(a_file)]),
    }
    if not (demo_run / "export").exists():
        check(run(["-m", "paddle_dist.export", str(demo_run)]))
    for words, argv in processes.items():
        result = run(argv, timeout=120)
        err = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(err) == 1 and words in err[0], (argv, result.stderr)
    for words, (main, argv) in here.items():
        done = ending(capfd, lambda: options.run(main, argv))
        assert done.code == 2 and len(done.lines) == 1 and words in done.lines[0], (argv, done.lines)
    assert (taken / "keep.txt").read_text() == "mine" and a_file.read_text() == "x"
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.tmp-*"))


def test_a_mixed_precision_runs_16_bit_weights_export_and_load_as_float32(demo_run, tmp_path):
    """An O2 run keeps 16-bit weights; a checkpoint that holds them (as O2 runs wrote them
    before amp.decorate's save_dtype) exports, and its .pdparams load into a float32 model."""
    import shutil

    run_dir = tmp_path / "o2run"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("export"))
    for folder in run_dir.glob("*/ckpt_*"):
        with np.load(folder / "model.npz") as data:
            half = {k: data[k].astype(np.float16) if data[k].dtype == np.float32 else data[k] for k in data.files}
        checkpoint.io._save_npz(folder / "model.npz", half)
    best = latest_checkpoint(run_dir, best=True)
    check(run(["-m", "paddle_dist.export", str(run_dir)]))
    check(run(["-m", "paddle_dist.checkpoint", "export", str(best), str(tmp_path / "w.pdparams")]))
    saved = paddle.load(str(tmp_path / "w.pdparams"))
    assert {str(t.dtype) for t in saved.values()} == {"paddle.float32"}
    net = models.build("lenet", 0)
    checkpoint.load_weights(net, tmp_path / "w.pdparams")
    # the float32 model holds the 16-bit values exactly, and answers as the export does
    assert all(np.array_equal(net.state_dict()[k].numpy(), half[k].astype(np.float32)) for k in half)
    x = paddle.to_tensor(mnist_dataset("", "test").x[:8])
    net.eval()
    exported = paddle.jit.load(str(run_dir / "export" / "model"))
    exported.eval()
    with paddle.no_grad():
        assert np.allclose(exported(x).numpy(), net(x).numpy(), atol=1e-5)


def test_the_python_api_exports_a_users_own_model(tmp_path):
    net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(12, 3))
    spec = [paddle.static.InputSpec([None, 3, 2, 2], "float32", "x")]
    out = export_module(net, spec, tmp_path / "mine", info={"classes": ["a", "b", "c"]})
    deploy = json.loads((out / "deploy.json").read_text())
    assert deploy["inputs"][0]["shape"] == [-1, 3, 2, 2] and deploy["classes"] == ["a", "b", "c"]
    loaded = paddle.jit.load(str(out / "model"))
    x = paddle.rand([5, 3, 2, 2])
    assert np.allclose(loaded(x).numpy(), net(x).numpy(), atol=1e-6)


@pytest.mark.compat
@pytest.mark.parametrize("how", [["--eval-only", "-o", "dist.nprocs=2"], ["-o", "train.epochs=0"]])
def test_evaluate_only_scores_a_checkpoint_and_changes_nothing(demo_run, tmp_path, how):
    before = _snapshot(demo_run)
    trained = read_metrics(demo_run)
    result = check(run(["train.py", *how, "-o", f"checkpoint.resume={demo_run / 'checkpoints'}",
                        "-o", f"output.root={tmp_path}"]))
    [eval_dir] = _runs(tmp_path)
    metrics = read_metrics(eval_dir)
    # The last checkpoint holds the final weights: the same score, counted exactly once.
    assert metrics["test_accuracy"] == trained["test_accuracy"] and metrics["test_samples"] == 1000
    assert metrics["eval_only"] and metrics["checkpoint"].endswith(f"ckpt_{trained['steps']:09d}")
    assert not Run(eval_dir).checkpoints.exists() and "nothing is trained" in result.stdout + result.stderr
    assert _snapshot(demo_run) == before


def test_a_checkpoint_written_on_a_gpu_is_evaluated_on_a_cpu_and_its_resume_refused_in_one_line(demo_run, tmp_path):
    """A checkpoint holds the random state of the GPU it was written on. Evaluating needs
    no random numbers, so --eval-only on a CPU (or another count of GPUs) scores it; going
    on training there cannot continue that GPU's generator: one line, exit 2."""
    import shutil

    run_dir = tmp_path / "gpurun"
    shutil.copytree(demo_run, run_dir, ignore=shutil.ignore_patterns("export"))
    for meta_file in run_dir.glob("checkpoints/ckpt_*/meta.json"):
        meta = json.loads(meta_file.read_text())
        meta["rng"]["paddle"] = [[0, *meta["rng"]["paddle"][0][1:]]]      # gpu:0's generator
        meta_file.write_text(json.dumps(meta))
    trained = read_metrics(run_dir)
    evaluated = check(run(["train.py", "--eval-only", "-o", f"checkpoint.resume={run_dir / 'checkpoints'}",
                           "-o", f"output.root={tmp_path / 'eval'}"]))
    [eval_dir] = _runs(tmp_path / "eval")
    assert read_metrics(eval_dir)["test_accuracy"] == trained["test_accuracy"]
    assert "nothing is trained" in evaluated.stdout + evaluated.stderr
    resumed = run(["train.py", "-o", "dist.nprocs=2", "-o", "train.epochs=13", "-o",
                   f"checkpoint.resume={run_dir / 'checkpoints'}", "-o", f"output.root={tmp_path / 'more'}"],
                  timeout=300)
    said = [line for line in resumed.stderr.splitlines() if "holds a GPU's generator" in line]
    assert resumed.returncode == 2 and len(said) == 1 and "--eval-only" in said[0], resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr


def _image_tree(root, sizes=((20, 24), (24, 20))):
    """3 colour classes of small noisy PNG and JPEG images: 12 per class to train on, 4 to
    evaluate."""
    rng = np.random.default_rng(0)
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    for split, count in (("train", 12), ("val", 4)):
        for name, colour in colours.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                h, w = sizes[i % 2]
                pixels = np.clip(np.array(colour) + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / (f"{i}.png" if i % 2 else f"{i}.jpg"), quality=95)
    return root


def test_an_image_folder_trains_resumes_exports_and_predicts(tmp_path):
    tree = _image_tree(tmp_path / "shapes")
    job = ["train.py", "-o", "dist.nprocs=2", "-o", "data.name=imagefolder", "-o", f"data.root={tree}",
           "-o", "model.name=resnet18", "-o", "data.image_size=8", "-o", "train.batch_size=6",
           "-o", "train.epochs=2", "-o", "train.api=hapi", "-o", "output.name=shapes",
           "-o", "checkpoint.every_steps=2"]
    runs = tmp_path / "runs"
    check(run(job + ["-o", f"output.root={runs}"], timeout=240))
    [run_dir] = _runs(runs)
    # Interrupted at step 4 of 6, then the same command: the uninterrupted run's weights.
    again = tmp_path / "again"
    failed = run(job + ["-o", f"output.root={again}", "-o", "faults.inject=raise:1:4"], timeout=240)
    assert failed.returncode == 1, failed.stderr
    resumed = check(run(job + ["-o", f"output.root={again}"], timeout=240))
    assert "continuing the unfinished run" in resumed.stdout
    [resumed_dir] = _runs(again)
    assert max_difference(final_weights(run_dir), final_weights(resumed_dir)) <= 1e-6
    assert json.loads(Run(run_dir).classes.read_text()) == ["blue", "green", "red"]
    metrics = read_metrics(run_dir)
    assert metrics["test_samples"] == 12 and metrics["world_size"] == 2     # every val image, once
    digests = {rank_status(run_dir, r)["weights_sha256"] for r in (0, 1)}
    assert len(digests) == 1
    check(run(["-m", "paddle_dist.export", str(run_dir)]))
    deploy = json.loads((run_dir / "export" / "deploy.json").read_text())
    assert deploy["classes"] == ["blue", "green", "red"] and deploy["inputs"][0]["shape"] == [-1, 3, 8, 8]
    paths = sorted(str(p) for p in (tree / "val").rglob("*.*"))
    predicted = json.loads(check(run(["-m", "paddle_dist.predict", str(run_dir / "export"), *paths,
                                      "--json"])).stdout)
    # The dygraph model on the training pipeline's own val batches (its decoding, resizing
    # and normalisation; the same order: class, then file) gives the same answers.
    from paddle_dist import config
    from paddle_dist.data import datasets

    cfg = config.load(str(Run(run_dir).config))
    _, val, classes = datasets.imagefolder_datasets(cfg.data, cfg.train.seed)
    assert [classes.index(Path(p).parent.name) for p in paths] == val.labels.ravel().tolist()
    with paddle.no_grad():
        logits = _dygraph(deploy["checkpoint"], "resnet18", 3)(paddle.to_tensor(val.batch(range(12))[0]))
    assert [p["top"][0]["index"] for p in predicted] == logits.numpy().argmax(1).tolist()


def test_an_unusable_image_folder_is_one_line_and_exit_2(tmp_path):
    tree = _image_tree(tmp_path / "shapes")
    (tree / "train" / "purple").mkdir()
    result = run(["train.py", "-o", "dist.nprocs=2", "-o", "data.name=imagefolder", "-o", f"data.root={tree}",
                  "-o", "model.name=resnet18", "-o", f"output.root={tmp_path / 'runs'}"], timeout=120)
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr
    assert f"class folder {tree / 'train' / 'purple'} holds no images" in err[0]
    assert not (tmp_path / "runs").exists()
