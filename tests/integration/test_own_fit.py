"""A user's own script through `paddle_dist.fit()` runs what the user wrote, records what
it ran, continues only itself, and ends on a signal the same way under every launcher.

The script (scripts/own_fit.py) brings its own model, data and `SGD(0.05)` and overrides
nothing of paddle_dist's config.
"""

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml

from paddle_dist import export, options
from paddle_dist.runs.layout import Run
from paddle_dist.train import train_main

from ..oracles import References, ending, max_difference, module_from
from .procs import ROOT, check, finish, run, start

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "own_fit.py")
LAUNCHERS = {
    "standalone": lambda tmp: [SCRIPT],
    "paddle_dist.launch": lambda tmp: ["-m", "paddle_dist.launch", "--nprocs", "2",
                                       "--log_dir", str(tmp / "log"), SCRIPT],
    "paddle.distributed.launch": lambda tmp: ["-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                                              "--log_dir", str(tmp / "log"), SCRIPT],
    "spawn": lambda tmp: [SCRIPT, "--spawn", "2"],
}
WORLD = {"standalone": 1, "paddle_dist.launch": 2, "paddle.distributed.launch": 2, "spawn": 2}


def _weights(path: Path):
    return dict(np.load(path))


def _job(launcher: str, tmp: Path, *args: str):
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    return LAUNCHERS[launcher](tmp) + ["--out", str(out), "--root", str(tmp / "runs"), *args]


def _only_run(root: Path) -> Path:
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(runs) == 1, runs
    return runs[0]


# ------------------------------------------------------------------ what the user wrote
def _replay(initial, world: int, epochs: int, batch: int, lr: float):
    """One process: the same SGD steps on the union of the ranks' batches of each step
    (Paddle's DistributedBatchSampler, as documented), from the same initial weights."""
    own = module_from(SCRIPT)
    data = own.RandomImages(own.SAMPLES, 0)
    net = own.SmallCNN()
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in initial.items()})
    opt = paddle.optimizer.SGD(lr, parameters=net.parameters())
    samplers = [paddle.io.DistributedBatchSampler(data, batch, num_replicas=world, rank=r, shuffle=True)
                for r in range(world)]
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        for batches in zip(*samplers):
            index = np.concatenate([np.asarray(b) for b in batches])
            loss = paddle.nn.functional.cross_entropy(net(paddle.to_tensor(data.x[index])),
                                                      paddle.to_tensor(data.y[index]))
            loss.backward()
            opt.step()
            opt.clear_grad()
    return {k: v.numpy() for k, v in net.state_dict().items()}


def test_four_ranks_of_a_users_sgd_match_a_one_process_replay(tmp_path):
    """No override: the typed defaults keep the script's SGD(0.05) as it was built
    (constant, unscaled), and the start line says so."""
    args = ["-m", "paddle_dist.launch", "--nprocs", "4", "--log_dir", str(tmp_path / "log"), SCRIPT,
            "--out", str(tmp_path), "--root", str(tmp_path / "runs")]
    result = check(run(args, timeout=300))
    assert "paddle_dist: lr 0.05, constant" in result.stdout
    weights = [_weights(tmp_path / f"rank{r}.npz") for r in range(4)]
    for other in weights[1:]:
        assert all(np.array_equal(weights[0][k], other[k]) for k in weights[0])
    initial = _weights(tmp_path / "initial.npz")
    replay = _replay(initial, world=4, epochs=2, batch=8, lr=0.05)
    trained = {k: weights[0][k] for k in replay}
    diff = max_difference(trained, replay)
    assert diff <= 1e-6, f"4 ranks differ from the replay by {diff}"
    moved = max_difference(trained, {k: initial[k] for k in replay})
    assert moved > 1e-2          # it trained: the comparison is not of two untouched models


def test_a_refusal_comes_before_anything_is_on_disk(tmp_path):
    """An optimizer with its own LRScheduler meets a config that asks for a schedule: fit()
    raises ConfigError (the script's to catch) before any run directory exists; uncaught,
    it ends the script with one line and exit 2 (errors.for_scripts)."""
    result = run([SCRIPT, "--out", str(tmp_path), "--root", str(tmp_path / "runs"), "--scheduler",
                  "--override", "train.lr_schedule=cosine"], timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "paddle_dist: error: the optimizer has its own LRScheduler"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ the run's records
def test_the_run_directory_records_the_users_job_and_refuses_to_be_a_built_in_one(tmp_path, capfd):
    check(run([SCRIPT, "--out", str(tmp_path), "--root", str(tmp_path / "runs"), "--epochs", "1"],
              timeout=120))
    run_dir = _only_run(tmp_path / "runs")
    config = yaml.safe_load(Run(run_dir).config.read_text())
    info = json.loads(Run(run_dir).run_file.read_text())
    assert config["fit"] == info["fit"]
    record = config["fit"]
    assert record["model"] == "SmallCNN" and record["parameters"] == 8 * 9 + 8 + 8 * 36 * 10 + 10
    assert len(record["parameters_digest"]) == 16
    assert (record["optimizer"], record["lr"], record["optimizer_from"]) == ("SGD", 0.05, "script")
    assert (record["train_samples"], record["eval_samples"]) == (256, 100)
    # Nothing of the built-in job that did not run: no model, dataset or config optimizer.
    assert "model" not in config and "name" not in config["data"]
    assert "optimizer" not in config["train"] and "lr" not in config["train"]

    # The refusals in this process (train.py's and export's exit-code paths: test_train_cli.py,
    # test_deploy.py).
    again = ending(capfd, lambda: options.run(train_main, ["-c", str(Run(run_dir).config)]))
    assert again.code == 2
    assert len(again.lines) == 1 and "paddle_dist.fit() run" in again.lines[0]
    assert "SmallCNN" in again.lines[0]
    exported = ending(capfd, lambda: options.run(export.main, [str(run_dir)]))
    assert exported.code == 2 and len(exported.lines) == 1
    assert "paddle_dist.export(net, input_spec, out)" in exported.lines[0]
    assert not (run_dir / "export").exists()


def test_a_changed_model_starts_a_new_run_and_says_why(tmp_path):
    """An unfinished run (stopped by SIGTERM) is continued by the same script, not by one
    whose model changed."""
    code, _, _ = _stop_mid_run("standalone", tmp_path, "loop", signal.SIGTERM, epochs="1000")
    assert code == 75
    stopped = _only_run(tmp_path / "runs")
    result = check(run(_job("standalone", tmp_path, "--width", "9", "--epochs", "1"), timeout=120))
    assert f"not continuing the unfinished run {stopped.relative_to(tmp_path)}" in result.stdout \
        or f"not continuing the unfinished run {stopped}" in result.stdout, result.stdout
    assert "parameter names or shapes differ" in result.stdout
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if p.is_dir())
    assert len(runs) == 2 and Run(runs[1]).metrics.exists()
    assert not Run(stopped).metrics.exists()           # the stopped run is left as it was


def test_another_lr_on_the_scripts_command_line_starts_a_new_run_and_says_why(tmp_path):
    """The script's own arguments are part of its run: `--lr 0.5` does not continue the run
    that `--lr 0.05` left unfinished (it would jump the rate inside one run)."""
    code, _, _ = _stop_mid_run("standalone", tmp_path, "loop", signal.SIGTERM, epochs="1000")
    assert code == 75
    stopped = _only_run(tmp_path / "runs")
    result = check(run(_job("standalone", tmp_path, "--epochs", "1000", "--lr", "0.5",
                            "--override", "train.max_steps=1"), timeout=120))
    line = next(line for line in result.stdout.splitlines() if "not continuing the unfinished run" in line)
    assert str(stopped.name) in line and "its lr was 0.05, this one is 0.5" in line
    assert "--lr 0.5" in line.split("this job runs", 1)[1]
    new = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and p != stopped]
    assert len(new) == 1 and json.loads(Run(new[0]).run_file.read_text())["fit"]["lr"] == 0.5


# ------------------------------------------------------------------ stopping by signal
EPOCHS = "30"      # 960 steps on 1 rank, 480 on 2: the stop lands mid-run, well before the end


def _stop_mid_run(launcher: str, tmp: Path, api: str, sig: int, epochs: str = EPOCHS):
    """Start the job; once rank 0 has logged its second step, send `sig`: to the launcher
    alone, or to every process of the job for Paddle's spawn (whose parent has no handler:
    as a scheduler does) and for SIGINT (as Ctrl+C in a terminal does). Returns (exit
    code, stdout, stderr)."""
    proc, killer = start(_job(launcher, tmp, "--api", api, "--epochs", epochs))
    logs = tmp / "runs"
    while proc.poll() is None and not any(
            "step 2/" in p.read_text() for p in logs.glob("*/logs/rank0.log")):
        time.sleep(0.01)    # polling for the job's own progress: the event
    if proc.poll() is not None:
        out, err = finish(proc, killer)
        raise AssertionError(f"the job ended (exit {proc.returncode}) before its second step:\n{out[-2000:]}\n{err[-3000:]}")
    if launcher == "spawn" or sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = finish(proc, killer, timeout=150)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights of clean runs, per (world size, API level): one process, or two
    under paddle_dist.launch."""
    def make(tmp: Path, key) -> dict:
        world, api = key
        launcher = "standalone" if world == 1 else "paddle_dist.launch"
        check(run(_job(launcher, tmp, "--api", api, "--epochs", EPOCHS), timeout=240))
        return _weights(tmp / "out" / "rank0.npz")
    return References(tmp_path_factory, "clean", make)


@pytest.mark.parametrize("launcher, api", [
    ("standalone", "loop"), pytest.param("paddle_dist.launch", "hapi", marks=pytest.mark.compat),
    ("paddle.distributed.launch", "hapi"), ("spawn", "hapi")])
def test_sigterm_saves_exits_75_and_the_same_command_continues_bitwise(launcher, api, uninterrupted,
                                                                      tmp_path):
    code, out, err = _stop_mid_run(launcher, tmp_path, api, signal.SIGTERM)
    run_dir = _only_run(tmp_path / "runs")
    records = [json.loads(p.read_text()) for p in sorted(Run(run_dir).status.glob("rank*.json"))]
    assert len(records) == WORLD[launcher]
    assert {(r["state"], r["exit_code"]) for r in records} == {("preempted", 75)}, records
    assert len({r["step"] for r in records}) == 1          # every rank stopped at the same step
    assert records[0]["step"] < int(EPOCHS) * 256 // (8 * WORLD[launcher])    # mid-run
    # No Python traceback from any process. (Paddle's spawn parent, which has no handler,
    # prints Paddle's own "C++ Traceback" report of the SIGTERM that ends it.)
    assert not [line for line in (out + err).splitlines() if line.startswith("Traceback")]
    if launcher in ("standalone", "paddle_dist.launch"):
        assert code == 75, err
    # Paddle's own launchers end with their own code (launch: the signal's number; spawn's
    # parent: killed by SIGTERM); each rank's 75 is in its status record above.
    if launcher == "paddle.distributed.launch":
        logs = "".join(p.read_text() for p in (tmp_path / "log").glob("workerlog.*"))
        assert "Traceback" not in logs
    check(run(_job(launcher, tmp_path, "--api", api, "--epochs", EPOCHS), timeout=240))
    assert _only_run(tmp_path / "runs") == run_dir            # the same run, continued
    final = _weights(tmp_path / "out" / "rank0.npz")
    reference = uninterrupted[WORLD[launcher], api]
    assert all(np.array_equal(final[k], reference[k]) for k in reference), "not bitwise equal"


@pytest.mark.parametrize("launcher, api", [("standalone", "loop"), ("paddle_dist.launch", "hapi")])
def test_ctrl_c_of_a_fit_script_is_130_and_one_line(launcher, api, tmp_path):
    code, out, err = _stop_mid_run(launcher, tmp_path, api, signal.SIGINT, epochs="1000")
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    said = [line for line in (out + err).splitlines() if "interrupted" in line]
    assert len(said) == 1, out + err
