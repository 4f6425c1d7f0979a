"""A detector-like fit() script whose state is more than its weights: a small CNN with
BatchNorm, a DataLoader with 2 workers and random augmentation, an eval set with a metric,
and (as chosen) an EMA.

    whole_state.py OUT [--callback-ema suite|per-rank] [--epochs 2] [--dropout P]
    whole_state.py evaluate WEIGHTS              # one plain process: the eval set, printed as JSON
                                                 # (WEIGHTS: an .npz, or a run directory read
                                                 # by paddle_dist.checkpoint.load_weights)

--callback-ema suite: the script keeps its own EMA in a callback, as PaddleDetection's
ModelEMA: every floating entry of the state_dict (BatchNorm statistics included), with
its decay warm-up, swapped into the model at on_eval_begin and out at on_eval_end.
--callback-ema per-rank: the same, but its decay depends on the rank (an EMA of each
rank's own making; the batch losses in the logs are the step's over all ranks): each
rank's averages are then its own.
--dropout P: a Dropout(P) before the head's Linear (as BiSeNetV2's head has one).
paddle_dist's train.ema_decay / train.ema_warmup come through -o of the launcher.

Rank r writes OUT/evaluated<r>.npz: the state it evaluated last (its callback's averages
when it has one), and OUT/result<r>.json: fit()'s last metrics.
"""

import json
import sys
from pathlib import Path

import numpy as np
import paddle

SAMPLES, EVAL_SAMPLES = 256, 90


class Boxes(paddle.io.Dataset):
    """8x8 images with a bright square in one of 4 quadrants; the label is the quadrant.
    `augment`: random augmentation drawn from numpy's global generator in __getitem__ (in
    the DataLoader's workers), as users write it: a left-right flip (the label follows)
    and noise."""

    def __init__(self, count, seed, augment=False):
        self.augment = augment
        rng = np.random.RandomState(seed)
        self.x = rng.normal(0, 1.5, (count, 3, 8, 8)).astype("float32")
        self.y = rng.randint(0, 4, size=(count, 1)).astype("int64")
        for i, label in enumerate(self.y[:, 0]):
            top, left = (label // 2) * 4, (label % 2) * 4
            self.x[i, :, top:top + 4, left:left + 4] += 0.5

    def __getitem__(self, i):
        x, y = self.x[i], self.y[i]
        if self.augment:
            if np.random.rand() < 0.5:
                x, y = x[:, :, ::-1], y ^ 1
            x = x + np.random.normal(0, 0.1, x.shape)
        return np.ascontiguousarray(x, dtype="float32"), y

    def __len__(self):
        return len(self.x)


class Detector(paddle.nn.Layer):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.body = paddle.nn.Sequential(
            paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(),
            paddle.nn.Conv2D(8, 8, 3, padding=1, stride=2), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU())
        self.head = paddle.nn.Linear(8 * 4 * 4, 4)
        self.drop = paddle.nn.Dropout(dropout) if dropout else None

    def forward(self, x):
        features = paddle.flatten(self.body(x), 1)
        return self.head(self.drop(features) if self.drop is not None else features)


class ModelEMA(paddle.callbacks.Callback):
    """PaddleDetection's habit: an EMA of the whole state_dict, swapped in for evaluation."""

    def __init__(self, net, decay=0.9, per_rank=False):
        super().__init__()
        self.net, self.decay, self.per_rank, self.step = net, decay, per_rank, 0
        self.shadow = {k: v.numpy().astype("float32") for k, v in net.state_dict().items()}
        self.kept = None

    def on_train_batch_end(self, step, logs=None):
        d = min(self.decay, (1 + self.step) / (10 + self.step))
        if self.per_rank:         # the rank's own decay: the ranks' averages drift apart
            d = min(0.99, d + (1 + paddle.distributed.get_rank()) * 1e-3)
        self.step += 1
        for k, v in self.net.state_dict().items():
            if np.issubdtype(self.shadow[k].dtype, np.floating):
                self.shadow[k] = d * self.shadow[k] + (1 - d) * v.numpy()

    def on_eval_begin(self, logs=None):
        self.kept = {k: v.numpy() for k, v in self.net.state_dict().items()}
        self.net.set_state_dict({k: paddle.to_tensor(v) for k, v in self.shadow.items()})

    def on_eval_end(self, logs=None):
        self.net.set_state_dict({k: paddle.to_tensor(v) for k, v in self.kept.items()})


class Evaluated(paddle.callbacks.Callback):
    """Keeps the state the model held during the last evaluation (after the EMA's swap)."""

    def __init__(self, net):
        super().__init__()
        self.net, self.state = net, None

    def on_eval_batch_begin(self, step, logs=None):
        if step == 0:
            self.state = {k: v.numpy().copy() for k, v in self.net.state_dict().items()}


def build(dropout=0.0):
    paddle.seed(7)
    net = Detector(dropout)
    train = paddle.io.DataLoader(Boxes(SAMPLES, 0, augment=True), batch_size=8, shuffle=True, num_workers=2)
    evaluation = paddle.io.DataLoader(Boxes(EVAL_SAMPLES, 1), batch_size=16)
    optimizer = paddle.optimizer.Momentum(0.02, parameters=net.parameters())
    return net, train, evaluation, optimizer


def train(out: Path, callback_ema: str, epochs: int, dropout: float = 0.0):
    import paddle_dist

    net, loader, evaluation, optimizer = build(dropout)
    callbacks = []
    if callback_ema:
        callbacks.append(ModelEMA(net, per_rank=callback_ema == "per-rank"))
    watch = Evaluated(net)
    callbacks.append(watch)         # after the EMA: sees what the EMA swapped in
    result = paddle_dist.fit(net, loader, evaluation, paddle.nn.CrossEntropyLoss(), optimizer,
                             metrics=[paddle.metric.Accuracy()], callbacks=callbacks, epochs=epochs)
    rank = paddle.distributed.get_rank()
    np.savez(out / f"evaluated{rank}.npz", **watch.state)
    (out / f"result{rank}.json").write_text(json.dumps(result.metrics))


def evaluate(weights: str):
    net, _, evaluation, _ = build()
    if Path(weights).is_dir():               # what export and load_weights take: the averages
        import paddle_dist

        paddle_dist.checkpoint.load_weights(net, weights)
    else:
        saved = np.load(weights)
        net.set_state_dict({k: paddle.to_tensor(saved[k]) for k in saved.files})
    net.eval()
    correct = count = 0
    with paddle.no_grad():
        for x, y in evaluation:
            correct += int((net(x).argmax(axis=-1) == y.reshape([-1])).astype("int64").sum())
            count += int(x.shape[0])
    print(json.dumps({"acc": correct / count, "count": count}))


if __name__ == "__main__":
    if sys.argv[1] == "evaluate":
        evaluate(sys.argv[2])
    else:
        args = sys.argv[2:]
        ema = args[args.index("--callback-ema") + 1] if "--callback-ema" in args else ""
        epochs = int(args[args.index("--epochs") + 1]) if "--epochs" in args else 2
        dropout = float(args[args.index("--dropout") + 1]) if "--dropout" in args else 0.0
        train(Path(sys.argv[1]), ema, epochs, dropout)
