"""A language-model user's fit() on a stream: an IterableDataset of text files (each line
a sequence: its bytes are its token ids, lengths 8 to 120), padded per batch by the
user's collate_fn (labels -100 on padding), read by a DataLoader with 2 workers, a model
as small as an Embedding and a Linear predicting the next byte.

    stream_fit.py corpus DIR                  # write the corpus: FILES text files
    stream_fit.py train CORPUS OUT [--group]  # fit(); paddle_dist's settings through -o

The dataset declares its shards (its files), so each rank and worker reads only its own
lanes' files (trainer/streams.py). Every process that reads notes, in
OUT/reads/rank<r>-<pid>.json, the bytes it has read of each file; at the first step's
start each rank sums its processes' notes into OUT/first_step<r>.json.

--group: the same corpus as a map-style Dataset of its lines, with -o
train.group_by_length=true (trainer/grouping.py).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle

import paddle_dist

FILES, BATCH = 32, 4


def write_corpus(folder: Path) -> None:
    rng = np.random.RandomState(52)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        lines = [rng.randint(97, 123, size=rng.randint(8, 121)).astype(np.uint8).tobytes().decode()
                 for _ in range(rng.randint(3, 13))]
        (folder / f"part{f:03d}.txt").write_text("\n".join(lines) + "\n")


def tokens(line: bytes) -> np.ndarray:
    return np.frombuffer(line.rstrip(b"\n"), dtype=np.uint8).astype("int64")


class TextFiles(paddle.io.IterableDataset):
    """The corpus's lines as token ids, file after file; its shards are its files."""

    def __init__(self, folder: str, notes: str):
        self.files, self.notes = sorted(str(p) for p in Path(folder).glob("*.txt")), notes
        self.read, self.reader = {}, 0

    def shards(self):
        return self.files

    def read_shard(self, path):
        with open(path, "rb") as text:
            for line in text:
                if self.reader != os.getpid():     # a worker counts its own reads, not its parent's
                    self.read, self.reader = {}, os.getpid()
                self.read[path] = self.read.get(path, 0) + len(line)
                self._note()
                yield tokens(line)

    def __iter__(self):
        for path in self.files:
            yield from self.read_shard(path)

    def _note(self) -> None:
        rank = os.environ.get("PADDLE_TRAINER_ID", "0")
        folder = Path(self.notes)
        folder.mkdir(exist_ok=True)
        note = folder / f"rank{rank}-{os.getpid()}.json"
        (folder / f".{note.name}").write_text(json.dumps(self.read))
        os.replace(folder / f".{note.name}", note)        # whole, for a reader in another process


class Lines(paddle.io.Dataset):
    """The same corpus as a map-style Dataset of its lines, with their lengths."""

    def __init__(self, folder: str):
        self.lines = [tokens(line) for p in sorted(Path(folder).glob("*.txt")) for line in p.read_bytes().splitlines()]

    def __getitem__(self, i):
        return self.lines[i]

    def __len__(self):
        return len(self.lines)

    def lengths(self):
        return [len(line) for line in self.lines]


def pad(samples):
    """(inputs, labels) of the batch's longest sequence: 0 and -100 after each one's end."""
    longest = max(len(s) for s in samples) - 1
    inputs = np.zeros((len(samples), longest), dtype="int64")
    labels = np.full((len(samples), longest), -100, dtype="int64")
    for row, s in enumerate(samples):
        inputs[row, :len(s) - 1], labels[row, :len(s) - 1] = s[:-1], s[1:]
    return inputs, labels


class NextByte(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed, self.head = paddle.nn.Embedding(256, 16), paddle.nn.Linear(16, 256)

    def forward(self, ids):
        return self.head(paddle.tanh(self.embed(ids)))


def token_mean(logits, labels):
    """The micro-batch's mean loss over its tokens, padding left out."""
    kept = (labels != -100).astype("float32")
    nll = paddle.nn.functional.cross_entropy(logits, labels.clip(min=0).unsqueeze(-1), reduction="none")
    return (nll.squeeze(-1) * kept).sum() / kept.sum()


class FirstStep(paddle.callbacks.Callback):
    """At the first step's start: the bytes this rank's processes have read so far."""

    def __init__(self, notes: Path, out: Path):
        super().__init__()
        self.notes, self.out, self.done = notes, out, False

    def on_train_batch_begin(self, step, logs=None):
        if self.done:
            return
        self.done = True
        rank = os.environ.get("PADDLE_TRAINER_ID", "0")
        read = {}
        for note in self.notes.glob(f"rank{rank}-*.json"):
            for path, count in json.loads(note.read_text()).items():
                read[path] = read.get(path, 0) + count
        (self.out / f"first_step{rank}.json").write_text(json.dumps(read))


def train(corpus: str, out: Path, group: bool) -> None:
    paddle.seed(7)
    net = NextByte()
    notes = out / "reads"
    data = Lines(corpus) if group else TextFiles(corpus, str(notes))
    loader = paddle.io.DataLoader(data, batch_size=BATCH, num_workers=2, collate_fn=pad)
    optimizer = paddle.optimizer.Adam(learning_rate=0.01, parameters=net.parameters())
    paddle_dist.fit(net, loader, loss=token_mean, optimizer=optimizer, callbacks=[FirstStep(notes, out)])


if __name__ == "__main__":
    if sys.argv[1] == "corpus":
        write_corpus(Path(sys.argv[2]))
    else:
        train(sys.argv[2], Path(sys.argv[3]), "--group" in sys.argv)
