"""What a rank's Session writes of a run: samples.tsv, each attempt marked, compared as
docs/faults.md says."""

import os
import re
import subprocess
import types
from pathlib import Path

from paddle_dist.trainer.session import Session

ROOT = Path(__file__).resolve().parents[3]


def ns(**kw):
    return types.SimpleNamespace(**kw)


def attempt(run_dir: Path, steps, world: int, resumed_from=None, per_epoch: int = 4) -> None:
    """An attempt of a run that logs `steps` (global steps), as Session.after_step does."""
    pos = ns(global_step=0, epoch=0, step_in_epoch=0)
    session = ns(cfg=ns(train=ns(log_samples=True)), env=ns(is_main=True, world_size=world),
                 run_dir=run_dir, pos=pos, result=ns(resumed_from=resumed_from), samples_marked=False,
                 sampler=ns(step_digest=lambda i: f"{pos.epoch}:{i:08x}"))
    for step in steps:
        pos.global_step, pos.epoch, pos.step_in_epoch = step, (step - 1) // per_epoch, (step - 1) % per_epoch + 1
        Session._log_samples(session)


def documented_comparison() -> str:
    """The command docs/faults.md gives for comparing two runs' samples.tsv."""
    text = (ROOT / "docs" / "faults.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "samples.tsv" in b]
    return block


def test_a_resumed_attempt_is_marked_and_the_documented_diff_sees_no_difference(tmp_path):
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    clean.mkdir(), resumed.mkdir()
    attempt(clean, range(1, 11), world=2)
    attempt(resumed, range(1, 8), world=2)                      # killed after step 7, saved at 5
    attempt(resumed, range(6, 11), world=1, resumed_from="/x/run/checkpoints/ckpt_000000005")
    lines = (resumed / "samples.tsv").read_text().splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# attempt 1: from step 1 on 2 rank(s), a new run",
        "# attempt 2: from step 6 on 1 rank(s), continuing checkpoint ckpt_000000005"]
    assert lines[8] == "# attempt 2: from step 6 on 1 rank(s), continuing checkpoint ckpt_000000005"
    assert lines[9].split("\t") == ["6", "2", "2", "1:00000001"]     # steps 6, 7 redone after it
    done = subprocess.run(["bash", "-c", documented_comparison()], capture_output=True, text=True,
                          env=dict(os.environ, A=str(clean), B=str(resumed)), timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, "same samples at every step\n", "")
    with open(resumed / "samples.tsv", "a") as out:
        out.write("10\t3\t2\tffff\n")                             # a step that differs is reported
    done = subprocess.run(["bash", "-c", documented_comparison()], capture_output=True, text=True,
                          env=dict(os.environ, A=str(clean), B=str(resumed)), timeout=30)
    assert done.returncode == 1 and "> 10\t3\t2\tffff" in done.stdout


def test_nothing_is_written_without_the_option_or_on_another_rank(tmp_path):
    session = ns(cfg=ns(train=ns(log_samples=False)), env=ns(is_main=True), run_dir=tmp_path, sampler=ns())
    Session._log_samples(session)
    session.cfg.train.log_samples, session.env.is_main = True, False
    Session._log_samples(session)
    assert not (tmp_path / "samples.tsv").exists()
