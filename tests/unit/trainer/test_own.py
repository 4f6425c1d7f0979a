"""What a script of one's own gets from paddle_dist: the typed defaults, its optimizer's
rate as built, a config.yaml that says what ran (and refuses to be a built-in job), and
endings by signal that are exit codes, not tracebacks."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml

from paddle_dist import errors
import paddle_dist
from paddle_dist import config as configlib
from paddle_dist.runtime import monitor
from paddle_dist.runtime.env import DistEnv
from paddle_dist.errors import ConfigError
from paddle_dist.trainer.prepare import lr_policy as _lr_policy

RECORD = {"model": "SmallCNN", "parameters": 10, "parameters_digest": "0" * 16, "optimizer": "SGD",
          "lr": 0.05, "lr_scheduler": "", "optimizer_from": "script", "train_samples": 8,
          "eval_samples": 0}


def test_load_config_without_a_file_is_the_typed_defaults_not_the_demo():
    cfg = paddle_dist.load_config()
    assert cfg.to_dict() == configlib.Config().to_dict()
    assert (cfg.train.lr_schedule, cfg.train.lr_scaling, cfg.train.warmup_epochs) == ("constant", "none", 0.0)
    assert paddle_dist.load_config("mnist_lenet").train.lr_schedule == "cosine"   # the demo, by name
    assert paddle_dist.load_config(overrides=["train.epochs=3"]).train.epochs == 3


def _policy(overrides, lr=0.05, world=4):
    cfg = configlib.with_overrides(overrides)
    opt = paddle.optimizer.SGD(lr, parameters=paddle.nn.Linear(2, 2).parameters())
    return _lr_policy(cfg, DistEnv(world_size=world), opt, per_epoch=10, limit=100)


def test_a_users_optimizer_keeps_its_rate_and_the_start_line_says_so():
    policy, text = _policy([])
    assert policy is None and text == "lr 0.05, constant"
    policy, text = _policy(["train.lr_scaling=linear", "train.batch_size=128"])   # asked for: applied
    assert policy.peak == pytest.approx(0.1) and text.startswith("lr 0.1: 0.05 for a global batch of 256")
    policy, text = _policy(["train.lr_schedule=cosine"])
    assert policy.varies and "cosine decay to 0 at step 100" in text


def test_an_optimizers_own_scheduler_is_said_and_refused_only_against_a_policy():
    def opt():
        return paddle.optimizer.SGD(paddle.optimizer.lr.StepDecay(0.1, step_size=5),
                                    parameters=paddle.nn.Linear(2, 2).parameters())
    cfg = configlib.with_overrides([])
    assert _lr_policy(cfg, DistEnv(), opt(), 10, 100) == (
        None, "lr from the optimizer's own StepDecay, 0.1 at the start, stepped after every "
              "optimizer step (train.scheduler_every=step)")
    by_epoch = configlib.with_overrides(["train.scheduler_every=epoch"])
    assert _lr_policy(by_epoch, DistEnv(), opt(), 10, 100) == (
        None, "lr from the optimizer's own StepDecay, 0.1 at the start, stepped after every "
              "epoch (train.scheduler_every=epoch)")
    with pytest.raises(ConfigError, match="own LRScheduler"):
        _lr_policy(configlib.with_overrides(["train.warmup_epochs=1"]), DistEnv(), opt(), 10, 100)


def test_scheduler_every_epoch_without_a_scheduler_is_harmless_and_plateau_is_refused():
    plain = paddle.optimizer.SGD(0.1, parameters=paddle.nn.Linear(2, 2).parameters())
    by_epoch = configlib.with_overrides(["train.scheduler_every=epoch"])
    assert _lr_policy(by_epoch, DistEnv(), plain, 10, 100) == (None, "lr 0.1, constant")
    with pytest.raises(ConfigError, match="train.scheduler_every"):
        configlib.with_overrides(["train.scheduler_every=batch"])
    plateau = paddle.optimizer.SGD(paddle.optimizer.lr.ReduceOnPlateau(0.1),
                                   parameters=paddle.nn.Linear(2, 2).parameters())
    with pytest.raises(ConfigError, match="ReduceOnPlateau steps on a metric"):
        _lr_policy(by_epoch, DistEnv(), plateau, 10, 100)


def test_a_fit_runs_config_yaml_says_what_ran_and_train_py_refuses_it(tmp_path):
    cfg = configlib.with_overrides(["train.epochs=2"])
    path = tmp_path / "config.yaml"
    configlib.dump(cfg, path, fit=RECORD)
    data = yaml.safe_load(path.read_text())
    assert list(data)[0] == "fit" and data["fit"] == RECORD
    assert "model" not in data and data["data"] == {"batched": True}
    assert not {"optimizer", "lr", "weight_decay"} & set(data["train"])
    with pytest.raises(ConfigError) as refused:
        configlib.load(str(path))
    assert str(refused.value) == (f"{path} is from a paddle_dist.fit() run of the script's own model "
                                  "SmallCNN; train.py builds only its built-in models: run that "
                                  "script again to repeat or continue the run")
    assert configlib.fit_record(path) == RECORD
    # The script itself may load it: the record is a description, the rest its config.
    assert paddle_dist.load_config(str(path)).train.epochs == 2
    # The config's own optimizer stays in the file when the run used it.
    configlib.dump(cfg, path, fit=dict(RECORD, optimizer_from="config"))
    assert yaml.safe_load(path.read_text())["train"]["lr"] == cfg.train.lr


def test_a_built_in_jobs_config_yaml_has_no_record(tmp_path):
    path = tmp_path / "config.yaml"
    configlib.dump(configlib.load("mnist_lenet"), path)
    assert configlib.fit_record(path) is None and configlib.load(str(path)).model.name == "lenet"


@pytest.mark.parametrize("ending, code", [("errors.Preempted('stopped on request at step 3')", 75),
                                          ("errors.Interrupted()", 130),
                                          ("errors.StoppedByPeer('rank 1 failed')", 5)])
def test_a_stop_left_uncaught_in_a_script_is_its_exit_code_without_a_traceback(ending, code):
    script = f"from paddle_dist import errors\nraise {ending}\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == code and done.stderr == ""
    exc = eval(ending, {"errors": errors})          # noqa: S307 - a literal of this test
    assert errors.exit_code_of(exc) == code and errors.outcome_of(exc) in ("preempted", "stopped")
    assert not isinstance(exc, Exception)          # `except Exception` in a script lets it through


def _ignores_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_the_watchdog_ignores_ctrl_c_and_ends_quietly_with_its_rank():
    """Ctrl+C reaches the rank's whole process group; the watchdog leaves it to the rank."""
    script = Path(monitor.__file__).with_name("_deadline.py")
    watchdog = subprocess.Popen([sys.executable, str(script), "1", "600", "never said"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while watchdog.poll() is None and not _ignores_sigint(watchdog.pid):
            pass                               # until its start-up has set SIGINT aside
        watchdog.send_signal(signal.SIGINT)    # delivered (or dropped) before the close below
        watchdog.stdin.close()                 # its rank ended
        assert watchdog.wait(timeout=30) == 0
        assert watchdog.stderr.read() == ""
    finally:
        watchdog.kill()
        watchdog.wait()


def _imported_by_deadline(args, rank_done):
    """The modules `python -S -X importtime _deadline.py ARGS` imported; its stdin brings
    the rank's line at once (`rank_done`) or stays open until it ends."""
    script = Path(monitor.__file__).with_name("_deadline.py")
    rank_end, our_end = os.pipe()          # held open here: no line, no end of file
    try:
        if rank_done:
            os.write(our_end, b"done\n")
        proc = subprocess.Popen([sys.executable, "-S", "-X", "importtime", str(script), *args],
                                stdin=rank_end, stderr=subprocess.PIPE, text=True)
        try:
            said = proc.communicate(timeout=60)[1]
        finally:
            proc.kill()
            proc.wait()
    finally:
        os.close(rank_end)
        os.close(our_end)
    return {line.rsplit("|", 1)[1].strip() for line in said.splitlines() if line.startswith("import time:")}


def test_a_deadline_met_imports_none_of_the_modules_acting_needs():
    """Two deadline watchdogs start with every rank; nearly all of them only see the rank
    finish in time, and so never import what reporting a miss takes."""
    met = _imported_by_deadline([str(os.getpid()), "600", "never said"], rank_done=True)
    assert "select" in met and not met & {"gloocheck", "watchdog", "procfs", "status"}
    victim = subprocess.Popen(["sleep", "60"])           # the "rank" the missed deadline ends
    try:
        missed = _imported_by_deadline([str(victim.pid), "0.01", "missed"], rank_done=False)
    finally:
        victim.kill()
        victim.wait()
    assert {"gloocheck", "procfs", "status"} <= missed


def test_the_watchdog_ends_with_its_rank_while_a_forked_child_holds_its_pipe():
    """A DataLoader worker forked by the rank holds a copy of the watchdog's stdin: the
    rank's line still ends it (the end of the pipe alone would not come)."""
    script = Path(monitor.__file__).with_name("_deadline.py")
    watchdog = subprocess.Popen([sys.executable, str(script), "1", "600", "never said"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, pass_fds=(watchdog.stdin.fileno(),))
    try:
        ended = threading.Thread(target=monitor.stop_watchdog, args=(watchdog,), daemon=True)
        ended.start()
        ended.join(timeout=30)
        assert not ended.is_alive() and watchdog.returncode == 0
    finally:
        for proc in (watchdog, holder):
            proc.kill()
            proc.wait()


class _Points(paddle.io.Dataset):
    def __init__(self, n: int):
        self.x = np.arange(n * 4, dtype="float32").reshape(n, 4)
        self.y = self.x.sum(axis=1, keepdims=True)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


@pytest.mark.parametrize("overrides, scheduler, words", [
    (["train.lr_schedule=cosine"], True, "own LRScheduler"),
    (["train.eval_only=true", "checkpoint.resume=nowhere"], False, "needs a test set")])
def test_fits_refusals_come_before_anything_is_on_disk(overrides, scheduler, words, tmp_path, monkeypatch):
    from paddle_dist.trainer import progress
    from paddle_dist.runtime import process

    monkeypatch.setattr(process, "_ENV", None)
    monkeypatch.setattr(progress.get(), "handlers", list(progress.get().handlers))
    cfg = paddle_dist.load_config(overrides=[f"output.root={tmp_path / 'runs'}", *overrides])
    net = paddle.nn.Linear(4, 1)
    lr = paddle.optimizer.lr.StepDecay(0.1, step_size=2) if scheduler else 0.1
    with pytest.raises(ConfigError, match=words):
        paddle_dist.fit(net, _Points(8), config=cfg, task="regression",
                        optimizer=paddle.optimizer.SGD(lr, parameters=net.parameters()))
    assert not (tmp_path / "runs").exists()
