"""A text classifier as a Paddle user writes it, trained through paddle_dist.fit().

Two inputs (token ids padded to 32, and their lengths), `paddle.metric.Accuracy` plus a
macro-F1 `paddle.metric.Metric`, an EMA callback that evaluates with averaged weights,
and a DataLoader with 2 workers. `--plain` runs the same script as it was written for
paddle.Model; the two differ in the five lines under `if plain:` (docs/own_model.md).

    python docs/examples/text_classifier.py                                  # one process
    python -m paddle_dist.launch --nprocs 2 docs/examples/text_classifier.py
    python -m paddle_dist.launch --nprocs 2 -o train.api=hapi docs/examples/text_classifier.py
"""

import sys

import numpy as np
import paddle
from paddle.static import InputSpec

EPOCHS = 3
LENGTH, VOCAB, CLASSES = 32, 200, 3
INPUTS = [InputSpec([None, LENGTH], "int64", "ids"), InputSpec([None], "int64", "length")]
LABELS = [InputSpec([None, 1], "int64", "label")]


class Sentences(paddle.io.Dataset):
    """Token sequences of random length whose class is the vocabulary third most used."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.ids = np.zeros((count, LENGTH), "int64")
        self.lengths = rng.randint(4, LENGTH + 1, count).astype("int64")
        self.labels = rng.randint(0, CLASSES, (count, 1)).astype("int64")
        for i in range(count):
            third = VOCAB // CLASSES
            common = rng.randint(1 + self.labels[i, 0] * third, (self.labels[i, 0] + 1) * third, self.lengths[i])
            noise = rng.randint(1, VOCAB, self.lengths[i])
            self.ids[i, :self.lengths[i]] = np.where(rng.rand(self.lengths[i]) < 0.6, common, noise)

    def __getitem__(self, i):
        return self.ids[i], self.lengths[i], self.labels[i]

    def __len__(self):
        return len(self.ids)


class BagOfWords(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, 32, padding_idx=0)
        self.out = paddle.nn.Linear(32, CLASSES)

    def forward(self, ids, length):
        mask = (paddle.arange(LENGTH).unsqueeze(0) < length.unsqueeze(1)).astype("float32")
        pooled = (self.embed(ids) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.out(pooled)


class MacroF1(paddle.metric.Metric):
    def __init__(self):
        super().__init__()
        self.reset()

    def compute(self, logits, label):
        return logits.argmax(axis=-1), label.reshape([-1])

    def update(self, pred, label):
        for c in range(CLASSES):
            self.tp[c] += np.sum((pred == c) & (label == c))
            self.fp[c] += np.sum((pred == c) & (label != c))
            self.fn[c] += np.sum((pred != c) & (label == c))

    def accumulate(self):
        f1 = 2 * self.tp / np.maximum(2 * self.tp + self.fp + self.fn, 1)
        return float(f1.mean())

    def reset(self):
        self.tp, self.fp, self.fn = (np.zeros(CLASSES, "int64") for _ in range(3))

    def name(self):
        return "macro_f1"


class ExponentialMovingAverage(paddle.callbacks.Callback):
    """Averages the weights after every step; evaluation runs on the averages."""

    def __init__(self, decay=0.9):
        super().__init__()
        self.decay, self.shadow, self.kept = decay, {}, {}

    def on_train_batch_end(self, step, logs=None):
        for name, p in self.model.network.named_parameters():
            old = self.shadow.get(name, p.numpy())
            self.shadow[name] = self.decay * old + (1 - self.decay) * p.numpy()

    def on_eval_begin(self, logs=None):
        for name, p in self.model.network.named_parameters():
            self.kept[name] = p.numpy()
            if name in self.shadow:
                p.set_value(self.shadow[name].astype(p.numpy().dtype))

    def on_eval_end(self, logs=None):
        for name, p in self.model.network.named_parameters():
            p.set_value(self.kept[name])


def build():
    """The model, the data, the optimizer, the metrics and the callbacks."""
    paddle.seed(2024)
    net = BagOfWords()
    train_loader = paddle.io.DataLoader(Sentences(480, seed=0), batch_size=16, shuffle=True, num_workers=2)
    eval_loader = paddle.io.DataLoader(Sentences(97, seed=1), batch_size=32)
    optimizer = paddle.optimizer.Adam(0.01, parameters=net.parameters())
    loss = paddle.nn.CrossEntropyLoss()
    metrics = [paddle.metric.Accuracy(topk=(1, 2)), MacroF1()]
    callbacks = [ExponentialMovingAverage()]
    return net, train_loader, eval_loader, loss, optimizer, metrics, callbacks


def main(plain=False):
    net, train_loader, eval_loader, loss, optimizer, metrics, callbacks = build()
    if plain:
        model = paddle.Model(net, INPUTS, LABELS)
        model.prepare(optimizer, loss, metrics)
        model.fit(train_loader, eval_loader, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    else:
        import paddle_dist
        paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer, metrics=metrics, callbacks=callbacks, inputs=INPUTS, labels=LABELS, epochs=EPOCHS)
    return net, callbacks


if __name__ == "__main__":
    main(plain="--plain" in sys.argv)
