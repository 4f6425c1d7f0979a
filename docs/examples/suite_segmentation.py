"""A segmentation script in PaddleSeg's habits, trained through paddle_dist.fit().

What PaddleSeg's trainers bring, and what fit() is told about it:
- dict samples `{img, label, trans_info, gt_fields}` whose keys are not `forward`'s
  argument names, with non-tensor entries: `inputs=`/`labels=` InputSpecs name the keys;
- a model with auxiliary heads in training only (BiSeNetV2: a list of 5 logits in
  training, of 1 in evaluation), and a loss defined on the training outputs only: a
  weighted sum over the heads, returned in parts (one per head);
- validation labels `[N, 1, H, W]` where training's are `[N, H, W]`, and no loss on
  validation batches (`train.eval_loss=false`): mIoU alone;
- iterations, not epochs (`train.max_steps`), and evaluation every N iterations
  (`train.eval_every_steps`), the best model chosen by mIoU (`checkpoint.monitor`).

    python docs/examples/suite_segmentation.py                                  # one process
    python -m paddle_dist.launch --nprocs 2 docs/examples/suite_segmentation.py
"""

import numpy as np
import paddle
import paddle.nn.functional as F

SIZE = 16            # images are 3 x SIZE x SIZE
ITERS, EVAL_EVERY = 48, 16
COEF = (1.0, 0.4, 0.4)   # the main head's and the auxiliary heads' weights, as PaddleSeg's loss_coef


class Squares(paddle.io.Dataset):
    """Noisy images with a bright square of class 1; PaddleSeg's sample dict."""

    def __init__(self, count, seed, mode="train"):
        rng = np.random.RandomState(seed)
        self.mode = mode
        self.images = rng.normal(0, 0.3, (count, 3, SIZE, SIZE)).astype("float32")
        self.labels = np.zeros((count, SIZE, SIZE), "int64")
        for i in range(count):
            y, x, side = rng.randint(0, SIZE // 2), rng.randint(0, SIZE // 2), rng.randint(3, SIZE // 2)
            self.images[i, :, y:y + side, x:x + side] += 1.0
            self.labels[i, y:y + side, x:x + side] = 1

    def __getitem__(self, i):
        label = self.labels[i] if self.mode == "train" else self.labels[i][None]    # val: [1, H, W]
        return {"img": self.images[i], "label": label, "trans_info": "resize", "gt_fields": "label"}

    def __len__(self):
        return len(self.images)


class AuxNet(paddle.nn.Layer):
    """A main head and two auxiliary heads, the latter in training only."""

    def __init__(self, classes=2):
        super().__init__()
        self.stem = paddle.nn.Sequential(paddle.nn.Conv2D(3, 16, 3, padding=1), paddle.nn.BatchNorm2D(16),
                                         paddle.nn.ReLU())
        self.body = paddle.nn.Sequential(paddle.nn.Conv2D(16, 16, 3, padding=1), paddle.nn.BatchNorm2D(16),
                                         paddle.nn.ReLU())
        self.head = paddle.nn.Conv2D(16, classes, 1)
        self.aux = paddle.nn.LayerList([paddle.nn.Conv2D(16, classes, 1) for _ in range(2)])

    def forward(self, x):
        low = self.stem(x)
        logits = [self.head(self.body(low))]
        if self.training:
            logits += [self.aux[0](low), self.aux[1](self.body(low))]
        return logits


class HeadsLoss(paddle.nn.Layer):
    """PaddleSeg's loss computation: the heads' cross-entropies, weighted, in parts."""

    def forward(self, logits, aux1, aux2, label):
        parts = [F.cross_entropy(x, label.unsqueeze(1), axis=1) for x in (logits, aux1, aux2)]
        return {"loss": sum(c * p for c, p in zip(COEF, parts)),
                "loss_main": parts[0], "loss_aux1": parts[1], "loss_aux2": parts[2]}


class MeanIoU(paddle.metric.Metric):
    def __init__(self, classes=2):
        super().__init__()
        self.classes = classes
        self.reset()

    def compute(self, logits, label):
        return logits.argmax(axis=1), label.squeeze(1)

    def update(self, pred, label):
        index = label.reshape(-1) * self.classes + pred.reshape(-1)
        self.confusion += np.bincount(index, minlength=self.classes ** 2).reshape(self.classes, -1)

    def accumulate(self):
        hits = np.diag(self.confusion)
        union = self.confusion.sum(0) + self.confusion.sum(1) - hits
        return float(np.mean(hits / np.maximum(union, 1)))

    def reset(self):
        self.confusion = np.zeros((self.classes, self.classes), "int64")

    def name(self):
        return "miou"


def build():
    """The model, the data, the optimizer and the metric."""
    paddle.seed(2024)
    net = AuxNet()
    train_loader = paddle.io.DataLoader(Squares(192, seed=0), batch_size=8, shuffle=True, num_workers=2)
    eval_loader = paddle.io.DataLoader(Squares(45, seed=1, mode="val"), batch_size=16)
    optimizer = paddle.optimizer.Momentum(0.05, parameters=net.parameters())
    return net, train_loader, eval_loader, HeadsLoss(), optimizer, [MeanIoU()]


def evaluate(net, eval_loader, metrics):
    """One plain process, as PaddleSeg's evaluator: the main head's mIoU over the set."""
    net.eval()
    for metric in metrics:
        metric.reset()
    with paddle.no_grad():
        for batch in eval_loader:
            logits = net(batch["img"])[0]
            for metric in metrics:
                metric.update(*[t.numpy() for t in metric.compute(logits, batch["label"])])
    return {"miou": metrics[0].accumulate()}


def main():
    import paddle_dist
    from paddle.static import InputSpec

    net, train_loader, eval_loader, loss, optimizer, metrics = build()
    config = paddle_dist.load_config(overrides=[
        f"train.max_steps={ITERS}", f"train.eval_every_steps={EVAL_EVERY}", "train.eval_loss=false",
        "checkpoint.monitor=eval_miou"])
    paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer, metrics=metrics, config=config,
                    inputs=[InputSpec([None, 3, SIZE, SIZE], "float32", "img")],
                    labels=[InputSpec([None, SIZE, SIZE], "int64", "label")])
    return net, []


if __name__ == "__main__":
    main()
