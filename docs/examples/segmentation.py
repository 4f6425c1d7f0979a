"""A segmentation script as a Paddle user writes it, trained through paddle_dist.fit().

Dict samples ({"image": CHW float32, "mask": HW int64}), a cross-entropy + dice loss,
a mean-IoU `paddle.metric.Metric`, a DataLoader with 2 workers, a callback that logs the
learning rate, EarlyStopping on mIoU, and gradient clipping. `--plain` runs the same
script as it was written for paddle.Model; the two differ in the five lines under
`if plain:` (docs/own_model.md).

    python docs/examples/segmentation.py                                  # one process
    python -m paddle_dist.launch --nprocs 2 docs/examples/segmentation.py
    python -m paddle_dist.launch --nprocs 2 -o train.api=hapi -o train.ema_decay=0.9 docs/examples/segmentation.py
"""

import sys

import numpy as np
import paddle
import paddle.nn.functional as F

EPOCHS = 3
SIZE = 16            # images are 3 x SIZE x SIZE


class Shapes(paddle.io.Dataset):
    """Noisy images with a bright square; the mask marks the square."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.images = rng.normal(0, 0.3, (count, 3, SIZE, SIZE)).astype("float32")
        self.masks = np.zeros((count, SIZE, SIZE), "int64")
        for i in range(count):
            y, x, side = rng.randint(0, SIZE // 2), rng.randint(0, SIZE // 2), rng.randint(3, SIZE // 2)
            self.images[i, :, y:y + side, x:x + side] += 1.0
            self.masks[i, y:y + side, x:x + side] = 1

    def __getitem__(self, i):
        return {"image": self.images[i], "mask": self.masks[i]}

    def __len__(self):
        return len(self.images)


class SegNet(paddle.nn.Layer):
    def __init__(self, classes=2):
        super().__init__()
        self.body = paddle.nn.Sequential(
            paddle.nn.Conv2D(3, 16, 3, padding=1), paddle.nn.BatchNorm2D(16), paddle.nn.ReLU(),
            paddle.nn.Conv2D(16, 16, 3, padding=1), paddle.nn.BatchNorm2D(16), paddle.nn.ReLU())
        self.head = paddle.nn.Conv2D(16, classes, 1)

    def forward(self, image):
        return self.head(self.body(image))


class CrossEntropyDice(paddle.nn.Layer):
    def forward(self, logits, mask):
        ce = F.cross_entropy(logits, mask.unsqueeze(1), axis=1)
        prob = F.softmax(logits, axis=1)[:, 1]
        target = mask.astype("float32")
        dice = 1 - (2 * (prob * target).sum() + 1) / (prob.sum() + target.sum() + 1)
        return ce + dice


class MeanIoU(paddle.metric.Metric):
    def __init__(self, classes=2):
        super().__init__()
        self.classes = classes
        self.reset()

    def compute(self, logits, mask):
        return logits.argmax(axis=1), mask

    def update(self, pred, mask):
        index = mask.reshape(-1) * self.classes + pred.reshape(-1)
        self.confusion += np.bincount(index, minlength=self.classes ** 2).reshape(self.classes, -1)

    def accumulate(self):
        hits = np.diag(self.confusion)
        union = self.confusion.sum(0) + self.confusion.sum(1) - hits
        return float(np.mean(hits / np.maximum(union, 1)))

    def reset(self):
        self.confusion = np.zeros((self.classes, self.classes), "int64")

    def name(self):
        return "miou"


class LogLearningRate(paddle.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if paddle.distributed.get_rank() == 0:
            print(f"epoch {epoch + 1}: lr {self.model._optimizer.get_lr():g}")


def build():
    """The model, the data, the optimizer, the metrics and the callbacks."""
    paddle.seed(2024)
    net = SegNet()
    train_loader = paddle.io.DataLoader(Shapes(256, seed=0), batch_size=8, shuffle=True, num_workers=2)
    eval_loader = paddle.io.DataLoader(Shapes(61, seed=1), batch_size=16)
    schedule = paddle.optimizer.lr.CosineAnnealingDecay(0.05, T_max=EPOCHS)
    optimizer = paddle.optimizer.Momentum(schedule, parameters=net.parameters(),
                                          grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    metrics = [MeanIoU()]
    callbacks = [LogLearningRate(), paddle.callbacks.LRScheduler(by_step=False, by_epoch=True),
                 paddle.callbacks.EarlyStopping("miou", mode="max", patience=2)]
    return net, train_loader, eval_loader, CrossEntropyDice(), optimizer, metrics, callbacks


def main(plain=False):
    net, train_loader, eval_loader, loss, optimizer, metrics, callbacks = build()
    if plain:
        model = paddle.Model(net)
        model.prepare(optimizer, loss, metrics)
        model.fit(train_loader, eval_loader, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    else:
        import paddle_dist
        paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer, metrics=metrics, callbacks=callbacks, epochs=EPOCHS)
    return net, callbacks


if __name__ == "__main__":
    main(plain="--plain" in sys.argv)
