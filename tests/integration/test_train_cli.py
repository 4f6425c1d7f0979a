"""train.py and tools/spawn_train.py end to end: the main job, its outputs, bad input."""

import pytest
import yaml

from paddle_dist.runs.layout import LATEST, Run

from ..oracles import final_weights, latest_checkpoint, max_difference, read_metrics
from .procs import ROOT, check, run


def _outputs_of(run_dir, ranks=2):
    metrics = read_metrics(run_dir)
    assert (Run(run_dir).checkpoints / LATEST).is_file()
    latest = latest_checkpoint(run_dir)
    assert {p.name for p in latest.iterdir()} == {"model.npz", "optimizer.npz", "rng.npz", "meta.json"}
    assert any(Run(run_dir).vdl.iterdir()), "no VisualDL log written"
    for rank in range(ranks):
        assert Run(run_dir).rank_log(rank).read_text().strip()
    return metrics, yaml.safe_load(Run(run_dir).config.read_text())


def _reached_95_percent(result, run_dir, api):
    metrics, saved = _outputs_of(run_dir)
    assert metrics["test_accuracy"] >= 0.95, metrics
    assert metrics["test_samples"] == 1000
    assert metrics["world_size"] == 2 and metrics["api"] == api
    assert metrics["samples_per_s"] > 0 and metrics["final_loss"] < 0.5
    assert saved["train"]["api"] == api and saved["dist"]["nprocs"] == 2
    assert "test accuracy" in result.stdout and str(run_dir) in result.stdout
    assert "samples/s" in result.stdout and "eta" in result.stdout
    assert "Traceback" not in result.stderr and "Modified FLAGS" not in result.stderr


@pytest.mark.compat
def test_main_job_reaches_95_percent_on_two_ranks(main_job):
    """train.py at the loop level (tests/integration/conftest.py runs it)."""
    _reached_95_percent(*main_job, "loop")


@pytest.mark.compat
def test_main_job_reaches_95_percent_on_two_ranks_under_spawn_at_the_hapi_level(tmp_path):
    run_dir = tmp_path / "run"
    result = check(run(["tools/spawn_train.py", "--nprocs", "2", "-o", "train.api=hapi",
                        "-o", f"output.run_dir={run_dir}"], timeout=300))
    _reached_95_percent(result, run_dir, "hapi")


def test_bare_paddle_launch_runs_train_py(tmp_path):
    run_dir = tmp_path / "run"
    check(run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
               str(tmp_path / "log"), "train.py", "-c", "configs/mnist_mlp.yaml",
               "-o", "train.max_steps=10", "-o", f"output.run_dir={run_dir}"]))
    metrics, saved = _outputs_of(run_dir)
    assert metrics["world_size"] == 2 and metrics["steps"] == 10
    assert saved["model"]["name"] == "mlp" and saved["train"]["max_steps"] == 10


def test_single_process_linear_regression(tmp_path):
    run_dir = tmp_path / "run"
    check(run(["train.py", "-c", "configs/linear.yaml", "-o", f"output.run_dir={run_dir}"]))
    metrics, _ = _outputs_of(run_dir, ranks=1)
    assert metrics["world_size"] == 1 and "test_accuracy" not in metrics      # not a classifier
    assert metrics["test_loss"] < 0.01


# ------------------------------------------------------------------ bad input
def _usage_error(args, *words):
    result = run(args, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]
    return lines[0]


# The rest of the matrix runs in one process: tests/unit/test_train.py. Here: a case per command
# for the exit-code path, and those that fail only in a rank (one process: this one).
@pytest.mark.parametrize("args,words", [
    (["tools/spawn_train.py", "--gpus", "0,1"], ["0,1", "paddlepaddle-gpu"]),
    # mixed precision: Paddle runs it on GPUs only (on CPU it would silently do nothing)
    (["train.py", "-o", "train.amp=O2"], ["train.amp=O2", "GPU", "train.amp=off"]),
    (["train.py", "-o", "model.name=resnet18"], ["resnet18", "3x32x32", "1x28x28", "lenet"]),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    _usage_error(args, *words)


def test_data_root_without_mnist_files(tmp_path):
    _usage_error(["train.py", "-o", f"data.root={tmp_path}"], str(tmp_path), "t10k-images-idx3-ubyte")


def test_finished_run_is_never_overwritten(tmp_path):
    Run(tmp_path).metrics.write_text("keep me")
    _usage_error(["train.py", "-o", "train.max_steps=1", "-o", f"output.run_dir={tmp_path}"],
                 str(tmp_path), "finished run")
    assert Run(tmp_path).metrics.read_text() == "keep me"


def _gpu_count():
    import paddle

    return paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0


@pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 GPUs and paddlepaddle-gpu; the CPU "
                    "paths and the GPU selection logic are tested without them")
@pytest.mark.parametrize("command", [["train.py"], ["tools/spawn_train.py"]])
def test_two_gpus(command, tmp_path):
    run_dir = tmp_path / "run"
    check(run(command + ["-o", "dist.gpus=0,1", "-o", "train.max_steps=20",
                         "-o", f"output.run_dir={run_dir}"]))
    metrics, _ = _outputs_of(run_dir)
    assert metrics["world_size"] == 2
    assert "backend nccl" in Run(run_dir).rank_log(0).read_text()


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    _usage_error(["train.py", "-o", f"output.run_dir={tmp_path / 'f'}"], "is a file")
    assert (tmp_path / "f").read_text() == "x"


# ------------------------------------------------------------------ our own launchers
def test_own_launchers_equal_one_process_with_double_batch(tmp_path):
    """train.py's launch mode (loop) and spawn_train.py (hapi) against one process with 2B."""
    common = ["-c", "configs/mnist_mlp.yaml", "-o", "train.max_steps=8", "-o", "train.optimizer=sgd",
              "-o", "train.lr=0.05"]
    runs = {
        "single": ["train.py", "-o", "train.batch_size=64"],
        "launch": ["train.py", "-o", "dist.nprocs=2", "-o", "train.batch_size=32"],
        "spawn": ["tools/spawn_train.py", "--nprocs", "2", "-o", "train.batch_size=32",
                  "-o", "train.api=hapi"],
    }
    weights = {}
    for name, args in runs.items():
        check(run(args + common + ["-o", f"output.run_dir={tmp_path / name}"]))
        weights[name] = final_weights(tmp_path / name)
    for name in ("launch", "spawn"):
        diff = max_difference(weights[name], weights["single"])
        assert diff <= 1e-5, (name, diff)


PRETEND_UNSUPPORTED = ("import sys; sys.path.insert(0, {root!r}); from paddle_dist import compat; "
                       "compat.installed_version = lambda: '2.5.2'\n")


@pytest.mark.parametrize("how", ["launcher", "fit"])
def test_a_paddle_outside_the_range_is_said_once_at_start_up(how, tmp_path):
    """Pretending the installed Paddle is 2.5.2: one line naming the supported range, from
    the process that starts the ranks (train.py's launcher) or from fit() on one process."""
    from paddle_dist import compat

    script = tmp_path / "job.py"
    body = PRETEND_UNSUPPORTED.format(root=str(ROOT)) + {
        "launcher": ("from paddle_dist.train import train_main\n"
                     f"sys.exit(train_main(['-o', 'dist.nprocs=2', '-o', 'train.max_steps=2', "
                     f"'-o', 'output.root={tmp_path / 'runs'}']))\n"),
        "fit": ("import paddle, paddle_dist\n"
                "from paddle_dist.data.datasets import mnist_dataset\n"
                f"cfg = paddle_dist.load_config(overrides=['train.max_steps=2', 'output.root={tmp_path / 'runs'}'])\n"
                "paddle_dist.setup(cfg)\n"
                "net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 10))\n"
                "ds = mnist_dataset(cfg.data.root, 'train')\n"
                "paddle_dist.fit(net, ds, config=cfg)\n")}[how]
    script.write_text(body)
    done = check(run([str(script)], timeout=240))
    said = [line for line in (done.stdout + done.stderr).splitlines() if "outside the range" in line]
    assert said == [f"paddle_dist: warning: {compat.version_problem('2.5.2')}"]


def test_built_in_job_with_clipping_and_moving_averages(tmp_path):
    """train.clip_grad_norm prints the norm it clipped; train.ema_decay's averages are in
    every checkpoint, are what the run evaluated, and are what load_weights and
    --eval-only take."""
    run_dir = tmp_path / "run"
    done = check(run(["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "dist.nprocs=2", "-o", "train.epochs=2",
                      "-o", "train.log_every=5", "-o", "train.clip_grad_norm=0.5", "-o", "train.ema_decay=0.9",
                      "-o", f"output.run_dir={run_dir}"], timeout=300))
    assert "grad norm" in done.stdout
    latest = latest_checkpoint(run_dir)
    assert (latest / "ema.npz").is_file()
    metrics = read_metrics(run_dir)
    again = tmp_path / "again"
    check(run(["train.py", "-c", "configs/mnist_mlp.yaml", "--eval-only", "-o", f"checkpoint.resume={latest}",
               "-o", f"output.run_dir={again}"], timeout=300))
    evaluated = read_metrics(again)
    assert evaluated["test_accuracy"] == metrics["test_accuracy"]     # the averages, evaluated again
    assert evaluated["test_samples"] == 1000
