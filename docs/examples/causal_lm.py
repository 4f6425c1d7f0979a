"""A causal language model on a byte stream of text files, trained through paddle_dist.fit().

As a language-model user writes it: a small decoder-only transformer (Paddle's own
TransformerEncoder layers under a causal mask: a decoder without cross-attention, a GPT)
whose `forward(input_ids, position_ids=None, attention_mask=None)` takes the mask third,
as a Llama's does; an `IterableDataset` that reads text files as bytes, cut into
sequences of 2 to 64 bytes at line ends, padded per batch with labels -100 on the padding;
the next-byte loss written by hand as the mean over the bytes that are not padding, which
says what it averaged over (`{"loss": mean, "count": n}`); AdamW without decay on norms,
biases and embeddings, warm-up then cosine, clipping at 1.0.

The stream declares its shards (the files), so every micro-batch of a step reads files of
its own and fit() resumes it mid-stream on any number of ranks (docs/own_model.md,
"Streams"); `train.max_steps` is the run's length. The eval set is a stream of other files,
evaluated whole (every sequence once, each file cut into batches of 32, the files dealt
over the ranks): its loss is the token mean over all of it, with its perplexity. The loss's count makes every step's
gradient that of Σ NLL / Σ tokens over all its micro-batches of all ranks (weighting.py).

    python docs/examples/causal_lm.py                                     # one process
    python -m paddle_dist.launch --nprocs 2 -o train.accumulate_steps=2 docs/examples/causal_lm.py
    python -m paddle_dist.launch --nprocs 2 -o train.api=hapi docs/examples/causal_lm.py
    python docs/examples/causal_lm.py --files 'my_corpus/*.txt'           # text of your own
    python docs/examples/causal_lm.py --llama     # PaddleFormers' Llama (pip install paddleformers)
"""

import glob
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F

STEPS, BATCH, EVAL_BATCH, WARMUP, LR = 40, 8, 32, 4, 3e-3
IGNORE = -100                      # labels the loss leaves out: padding
DOCS = Path(__file__).resolve().parents[1]


@dataclass
class LMConfig:
    vocab_size: int = 256          # bytes
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    max_position_embeddings: int = 64    # fit() warns once of a longer batch


def sequences(path, longest=64):
    """A text file's bytes as sequences of whole lines, each 2 to `longest` bytes."""
    piece = b""
    for line in Path(path).read_bytes().splitlines(keepends=True):
        while len(line) > longest:                       # a long line: cut
            yield from ([piece] if len(piece) >= 2 else [])
            piece, line = line[:longest], line[longest:]
        if len(piece) + len(line) > longest:
            yield from ([piece] if len(piece) >= 2 else [])
            piece = b""
        piece += line
    if len(piece) >= 2:
        yield piece


def sample(piece, shifted=False):
    """A sequence as a causal LM takes it: labels the input itself (the loss shifts them),
    or, `shifted` as PaddleFormers' models take them, each position's next byte."""
    ids = np.frombuffer(piece, dtype=np.uint8).astype("int64")
    inputs, labels = (ids[:-1], ids[1:]) if shifted else (ids, ids.copy())
    return {"input_ids": inputs, "attention_mask": np.ones(len(inputs), "float32"), "labels": labels}


class TextFiles(paddle.io.IterableDataset):
    """The files' bytes as sequences, file after file. Its shards are the files: fit() reads
    each micro-batch of a step from files of its own, and records where it stands."""

    def __init__(self, files, shifted=False):
        self.files, self.shifted = [str(f) for f in files], shifted

    def shards(self):
        return self.files

    def read_shard(self, path):
        for piece in sequences(path):
            yield sample(piece, self.shifted)

    def __iter__(self):
        for path in self.files:
            yield from self.read_shard(path)


def pad(samples):
    """A batch padded to its longest sequence: input ids 0, mask 0 and labels -100 there."""
    longest = max(len(s["input_ids"]) for s in samples)
    batch = {"input_ids": np.zeros((len(samples), longest), "int64"),
             "attention_mask": np.zeros((len(samples), longest), "float32"),
             "labels": np.full((len(samples), longest), IGNORE, "int64")}
    for i, s in enumerate(samples):
        for key in batch:
            batch[key][i, :len(s[key])] = s[key]
    return batch


class CausalLM(paddle.nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.embed = paddle.nn.Embedding(config.vocab_size, d)
        self.position = paddle.nn.Embedding(config.max_position_embeddings, d)
        # No biases in the attention and MLP, as a Llama: a key's bias has no gradient
        # (softmax takes away what it adds to every score), and Adam turns its rounding into steps.
        layer = paddle.nn.TransformerEncoderLayer(d, config.num_heads, 4 * d, dropout=0.0, normalize_before=True,
                                                  activation="gelu", bias_attr=False)
        self.blocks = paddle.nn.TransformerEncoder(layer, config.num_layers)
        self.norm = paddle.nn.LayerNorm(d)
        self.head = paddle.nn.Linear(d, config.vocab_size)

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        n, t = input_ids.shape
        if position_ids is None:
            position_ids = paddle.arange(t).unsqueeze(0).expand([n, t])
        causal = paddle.tril(paddle.ones([t, t], "bool")).unsqueeze(0)           # [1, t, t]
        if attention_mask is not None:                                           # no key on padding
            causal = paddle.logical_and(causal, attention_mask.astype("bool").unsqueeze(1))
        x = self.blocks(self.embed(input_ids) + self.position(position_ids), causal.unsqueeze(1))
        return self.head(self.norm(x))


def next_byte_loss(logits, labels):
    """The mean negative log-likelihood of each next byte over the bytes that are not
    padding, and how many those are: fit() weighs each micro-batch by its count."""
    logits, targets = logits[:, :-1], labels[:, 1:]
    nll = F.cross_entropy(logits, targets.unsqueeze(-1), ignore_index=IGNORE, reduction="sum")
    count = (targets != IGNORE).astype("int64").sum()
    return {"loss": nll / count.astype(nll.dtype), "count": count}


def optimizer(net, steps=STEPS):
    """AdamW, no decay on norms, biases and embeddings; warm-up, then cosine to 0; clip 1.0."""
    decayed = {p.name for name, p in net.named_parameters()
               if p.ndim >= 2 and "norm" not in name and "embed" not in name and "position" not in name}
    schedule = paddle.optimizer.lr.LinearWarmup(
        paddle.optimizer.lr.CosineAnnealingDecay(LR, T_max=max(steps - WARMUP, 1)), WARMUP, 0.0, LR)
    return paddle.optimizer.AdamW(schedule, parameters=net.parameters(), weight_decay=0.1,
                                  apply_decay_param_fun=lambda name: name in decayed,
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))


def corpus(pattern=None):
    """(training files, evaluation files): the given ones, else this repository's docs."""
    files = sorted(glob.glob(pattern)) if pattern else sorted(DOCS.glob("*.md"))
    held = max(2, len(files) // 6)
    return files[:-held], files[-held:]


def build(pattern=None):
    """The model, the data, the loss and the optimizer."""
    paddle.seed(2024)
    net = CausalLM(LMConfig())
    train_files, eval_files = corpus(pattern)
    train_loader = paddle.io.DataLoader(TextFiles(train_files), batch_size=BATCH, collate_fn=pad)
    eval_loader = paddle.io.DataLoader(TextFiles(eval_files), batch_size=EVAL_BATCH, collate_fn=pad)
    return net, train_loader, eval_loader, next_byte_loss, optimizer(net)


def build_llama(pattern=None):
    """The same job with PaddleFormers' Llama (from a config, random weights): its labels
    come shifted, and it computes its own loss, the mean over the labels that are not -100."""
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(2024)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                         fuse_rms_norm=False)            # no CPU kernel for the fused RMSNorm
    net = LlamaForCausalLM(config)
    train_files, eval_files = corpus(pattern)
    train_loader = paddle.io.DataLoader(TextFiles(train_files, shifted=True), batch_size=BATCH, collate_fn=pad)
    eval_loader = paddle.io.DataLoader(TextFiles(eval_files, shifted=True), batch_size=EVAL_BATCH, collate_fn=pad)
    return net, train_loader, eval_loader, "model", optimizer(net)


def main(pattern=None, llama=False):
    import paddle_dist

    net, train_loader, eval_loader, loss, opt = (build_llama if llama else build)(pattern)
    overrides = [f"train.max_steps={STEPS}", "train.log_every=10"]
    if llama:        # its own loss is a token mean: fit() counts the labels it averaged over
        overrides.append("train.loss_count=labels")
    config = paddle_dist.load_config(overrides=overrides)
    paddle_dist.fit(net, train_loader, eval_loader, loss, opt, config=config)
    return net


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--files") + 1] if "--files" in sys.argv else None, llama="--llama" in sys.argv)
