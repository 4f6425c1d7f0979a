"""A stream of text files through fit() (tests/integration/scripts/stream_fit.py: an
IterableDataset whose shards are its 32 files, variable-length lines padded per batch,
2 DataLoader workers per rank), 2 ranks x 2 micro-batches, 20 steps:

- killed (SIGKILL of rank 1 at step 13) and continued by the same command, the run ends
  bitwise equal to the uninterrupted one, with the same samples at every step, at both
  API levels;
- stopped at 2 ranks and continued on 1, it ends within 1e-6, the same samples at every step;
- no rank reads the corpus at the start: each rank has read a few of its own lanes' lines
  when its first step starts, and only its own lanes' files in the whole run;
- train.group_by_length over the same lines as a Dataset is dealt out by the data plan:
  killed at 2 ranks and continued on 1, within 1e-6 and the same samples at every step.
"""

import json
from pathlib import Path

import pytest

from ..oracles import References, checkpoint_arrays, differing, latest_checkpoint
from .procs import ROOT, run
from .test_whole_state import _same_samples, _within_rounding

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "stream_fit.py")
STEPS = ["-o", "train.max_steps=20", "-o", "train.accumulate_steps=2", "-o", "train.log_samples=true",
         "-o", "checkpoint.every_steps=5", "-o", "train.log_every=5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    done = run([SCRIPT, "corpus", str(folder)], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def _job(corpus: Path, out: Path, *extra: str, ranks: int = 2, group: bool = False):
    out.mkdir(parents=True, exist_ok=True)
    return run(["-m", "paddle_dist.launch", "--nprocs", str(ranks), "--log_dir", str(out / "log"),
                "-o", f"output.run_dir={out / 'run'}", *STEPS, *extra,
                SCRIPT, "train", str(corpus), str(out), *(["--group"] if group else [])],
               cwd=out, timeout=180)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus):
    def make(out: Path, api: str) -> Path:
        done = _job(corpus, out, "-o", f"train.api={api}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "a stream of 32 shards, 20 steps/epoch" in done.stdout
        return out
    return References(tmp_path_factory, "clean", make)


@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_killed_stream_run_continues_bitwise_with_the_same_samples(uninterrupted, corpus, api, tmp_path):
    clean, out = uninterrupted[api], tmp_path / "killed"
    first = _job(corpus, out, "-o", f"train.api={api}", "-o", "faults.inject=kill:1:13")
    assert first.returncode != 0, first.stderr[-3000:]
    done = _job(corpus, out, "-o", f"train.api={api}")
    assert done.returncode == 0, done.stderr[-3000:]
    _same_samples(clean, out)
    a, b = (checkpoint_arrays(latest_checkpoint(o / "run")) for o in (clean, out))
    assert a.keys() == b.keys() and differing(a, b) == []
    saved = json.loads((out / "run" / "checkpoints" / "ckpt_000000010" / "meta.json").read_text())["stream"]
    assert saved["lanes"] == 4 and [p["micro"] for p in saved["positions"]] == [10] * 4


def test_a_stream_stopped_at_two_ranks_continues_on_one_within_rounding(uninterrupted, corpus, tmp_path):
    clean, out = uninterrupted["loop"], tmp_path / "one"
    first = _job(corpus, out, "-o", "faults.inject=term:0:13")
    assert first.returncode == 75, first.stderr[-3000:]
    done = _job(corpus, out, ranks=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing on 1 rank (was 2): 4 micro-batches per step keep the global batch of 16" in done.stdout
    _same_samples(clean, out)
    _within_rounding(clean, out)


def _lanes_files(rank: int, corpus: Path) -> set:
    """The files of rank `rank`'s lanes (2 ranks x 2 micro-batches: lanes 2r and 2r + 1),
    and the first file, whose first line the check before epoch 1 reads on every rank."""
    files = sorted(str(p) for p in corpus.glob("*.txt"))
    return {f for i, f in enumerate(files) if i % 4 in (2 * rank, 2 * rank + 1)} | {files[0]}


def test_no_rank_reads_the_corpus_at_the_start_nor_another_ranks_files(uninterrupted, corpus):
    out = uninterrupted["loop"]
    total = sum(p.stat().st_size for p in corpus.glob("*.txt"))
    for rank in (0, 1):
        before = json.loads((out / f"first_step{rank}.json").read_text())
        # DataLoader workers prefetch a few batches of their lanes, as many as the scheduling lets
        # them (a tenth of this small corpus once): what must never be is a pass over the corpus.
        assert 0 < sum(before.values()) < total / 4, (sum(before.values()), total)
        assert set(before) <= _lanes_files(rank, corpus)
        whole = set()
        for note in (out / "reads").glob(f"rank{rank}-*.json"):
            whole |= set(json.loads(note.read_text()))
        assert whole <= _lanes_files(rank, corpus) and len(whole) > 8     # its lanes wrapped into a next pass


def test_length_grouped_batches_continue_on_one_rank_within_rounding(corpus, tmp_path):
    grouped = ["-o", "train.group_by_length=true", "-o", "train.max_steps=0", "-o", "train.epochs=2"]
    clean, out = tmp_path / "clean", tmp_path / "one"
    done = _job(corpus, clean, *grouped, group=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _job(corpus, out, *grouped, "-o", "faults.inject=kill:1:13", group=True).returncode != 0
    done = _job(corpus, out, *grouped, ranks=1, group=True)
    assert done.returncode == 0, done.stderr[-3000:]
    _same_samples(clean, out)
    _within_rounding(clean, out)


def test_a_stream_without_max_steps_is_one_line_and_exit_2(corpus, tmp_path):
    done = run([SCRIPT, "train", str(corpus), str(tmp_path)], cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "is a stream (an IterableDataset), which has no length: set the run's optimizer steps, " \
           "e.g. -o train.max_steps=1000" in done.stderr
    assert "Traceback" not in done.stderr
