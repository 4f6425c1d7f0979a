"""docs/examples/causal_lm.py, a causal LM on a byte stream of text files, trained as the
example is run: 2 ranks x 2 micro-batches of variable-length sequences, 40 steps, at both
API levels (issue 52, item 7).

Its final weights are compared with one process that takes, at every step, the union of
the step's micro-batches by the documented stream rule (docs/own_model.md, "Streams":
lane l of the step's W x k reads files l, l + L, ... in order, B sequences at a time) and
trains on the token mean, Σ NLL over every byte that is not padding / their count, with
the example's own AdamW, schedule and clipping. Its log and metrics.json say tokens/s and
each checkpoint's size and write time. Its eval set is a stream of files, evaluated whole
at the end: the eval loss and perplexity in metrics.json, at 1, 2 and 4 ranks, are one
process's over the whole stream with the run's final weights, to 1e-9 relative.
"""

import itertools
import math
import re

import numpy as np
import paddle
import pytest

from paddle_dist import checkpoint

from ..oracles import module_from, read_metrics
from .procs import ROOT, run

EXAMPLE = ROOT / "docs" / "examples" / "causal_lm.py"


def example():
    return module_from(EXAMPLE, "causal_lm")


def replay(lanes: int, llama: bool = False):
    """One process on the union of each step's micro-batches, trained on the token mean.

    Its gradient is that of Σ NLL / Σ count, taken as a data-parallel step takes it: each
    micro-batch's NLL sum backward()ed, the summed gradients then divided by the step's
    count. The same loss backward()ed as one expression differs from it by float rounding
    only (2.3e-7 after the 40 steps, measured; a mean of the micro-batches' means is
    2.3e-2 away). `llama`: PaddleFormers' Llama, whose own loss is its token mean."""
    lm = example()
    net, _, _, _, opt = (lm.build_llama if llama else lm.build)()
    files = lm.corpus()[0]

    def lane(l):                  # pass after pass over the lane's files
        for _ in itertools.count():
            for path in files[l::lanes]:
                yield from (lm.sample(piece, shifted=llama) for piece in lm.sequences(path))

    readers = [lane(l) for l in range(lanes)]
    for _ in range(lm.STEPS):
        count = 0
        for batch in [lm.pad([next(r) for _ in range(lm.BATCH)]) for r in readers]:
            ids, mask, labels = (paddle.to_tensor(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
            if llama:
                found = {"loss": net(ids, attention_mask=mask, labels=labels)[0],
                         "count": (labels != lm.IGNORE).astype("int64").sum()}
            else:
                found = lm.next_byte_loss(net(ids, attention_mask=mask), labels)
            (found["loss"] * found["count"].astype("float32")).backward()
            count += int(found["count"])
        for p in net.parameters():
            if p.grad is not None:
                p.grad.set_value(p.grad * (1.0 / count))
        opt.step()                  # clipping sees the token mean's gradient
        opt.clear_grad()
        opt._learning_rate.step()
    return {k: v.numpy() for k, v in net.state_dict().items()}


REPLAYED = {}


def replayed(llama: bool = False):
    """The replay, once per model: every plan here has W x k = 4 micro-batches a step."""
    if llama not in REPLAYED:
        REPLAYED[llama] = replay(4, llama)
    return REPLAYED[llama]


def train(tmp_path, api: str, ranks: int, accumulate: int, *extra: str):
    out = tmp_path / "run"
    done = run(["-m", "paddle_dist.launch", "--nprocs", str(ranks), "--log_dir", str(tmp_path / "log"),
                "-o", f"train.api={api}", "-o", f"train.accumulate_steps={accumulate}",
                "-o", f"output.run_dir={out}", str(EXAMPLE), *extra], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done


def one_process_eval(weights, llama: bool = False):
    """(token-mean NLL, sequences) of the example's eval stream in one process, by the rule
    fit() evaluates a stream by (docs/own_model.md, "Streams"): its files in order, each cut
    into batches of EVAL_BATCH, each batch's mean weighed by its count of tokens."""
    lm = example()
    net = (lm.build_llama if llama else lm.build)()[0]
    net.set_state_dict(weights)
    net.eval()
    nll = tokens = sequences = 0
    with paddle.no_grad():
        for path in lm.corpus()[1]:
            samples = [lm.sample(piece, shifted=llama) for piece in lm.sequences(path)]
            for start in range(0, len(samples), lm.EVAL_BATCH):
                batch = lm.pad(samples[start:start + lm.EVAL_BATCH])
                ids, mask, labels = (paddle.to_tensor(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
                found = lm.next_byte_loss(net(ids, attention_mask=mask), labels)
                nll, tokens = nll + float(found["loss"]) * int(found["count"]), tokens + int(found["count"])
                sequences += len(ids)
    return nll / tokens, sequences


def assert_evaluated(out, what: str):
    """The run's last eval loss and perplexity (metrics.json) against one process over the
    whole eval stream with the run's final weights."""
    found = read_metrics(out)["history"][-1]
    want, sequences = one_process_eval(checkpoint.load(out).model)
    print(f"{what}: eval loss {found['eval_loss']!r}, one process {want!r}")
    assert found["eval_count"] == sequences, what
    assert found["eval_loss"] == pytest.approx(want, rel=1e-9), what
    assert found["eval_perplexity"] == pytest.approx(math.exp(want), rel=1e-9), what


def assert_replayed(out, want, what: str):
    trained = checkpoint.load(out).model
    worst = max(float(np.max(np.abs(trained[k] - want[k]))) for k in want)
    assert worst < 1e-6, f"{what}: final weights differ from the one-process replay by {worst:.3g}"


@pytest.mark.parametrize("api,ranks,accumulate", [("loop", 2, 2), ("hapi", 2, 2), ("loop", 4, 1), ("hapi", 1, 4)])
def test_the_example_trains_what_one_process_on_the_union_of_its_micro_batches_trains(tmp_path, api, ranks,
                                                                                      accumulate):
    """Its final weights are the replay's; its eval stream's loss is one process's on them."""
    out, done = train(tmp_path, api, ranks, accumulate)
    assert_replayed(out, replayed(), f"{api} {ranks}x{accumulate}")
    assert_evaluated(out, f"{api} {ranks}x{accumulate}")
    metrics = read_metrics(out)
    assert metrics["steps"] == 40 and metrics["tokens_per_s"] > 0
    progress = [line for line in done.stdout.splitlines() if " samples/s " in line and "eta" in line]
    assert progress and all(re.search(r"samples/s [\d,]+ tokens/s eta", line) for line in progress), progress
    assert re.search(r"checkpoint for step 40 written: [\d.,]+ MB in [\d.]+ s", done.stdout), done.stdout[-2000:]


def test_paddleformers_llama_takes_the_same_road(tmp_path):
    """--llama: PaddleFormers' Llama with its own loss (loss="model", train.loss_count=labels),
    its dict samples reaching input_ids, attention_mask and labels by name."""
    pytest.importorskip("paddleformers")
    out, _ = train(tmp_path, "hapi", 2, 2, "--llama")
    assert_replayed(out, replayed(llama=True), "PaddleFormers' Llama, hapi 2x2")
