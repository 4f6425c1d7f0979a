"""A detector in PaddleDetection's habits, trained through paddle_dist.fit().

As PaddleDetection's architectures do, the model computes its own loss in training, as a
dict of parts (`{"loss", "loss_cls", "loss_box"}`), and returns detections without a loss
in evaluation (`loss="model"`: fit() logs the parts beside the total and hands the
detections to the metric). Samples are dicts `{image, gt_box, gt_class, im_id}`; a
recall at IoU 0.5 is the metric.

    python docs/examples/suite_detection.py                                  # one process
    python -m paddle_dist.launch --nprocs 2 docs/examples/suite_detection.py
"""

import numpy as np
import paddle
import paddle.nn.functional as F

SIZE = 16
EPOCHS = 4


class OneBox(paddle.io.Dataset):
    """Images with one bright box of class 1 (or 2, dimmer); its box in [0, 1] units."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.images = rng.normal(0, 0.2, (count, 3, SIZE, SIZE)).astype("float32")
        self.boxes = np.zeros((count, 4), "float32")
        self.classes = rng.randint(1, 3, (count, 1)).astype("int64")
        for i in range(count):
            y, x, side = rng.randint(0, SIZE // 2), rng.randint(0, SIZE // 2), rng.randint(4, SIZE // 2)
            self.images[i, :, y:y + side, x:x + side] += 1.0 if self.classes[i, 0] == 1 else 0.5
            self.boxes[i] = np.array([x, y, x + side, y + side], "float32") / SIZE

    def __getitem__(self, i):
        return {"image": self.images[i], "gt_box": self.boxes[i], "gt_class": self.classes[i], "im_id": i}

    def __len__(self):
        return len(self.images)


class TinyDetector(paddle.nn.Layer):
    def __init__(self, classes=3):
        super().__init__()
        self.backbone = paddle.nn.Sequential(paddle.nn.Conv2D(3, 16, 3, padding=1), paddle.nn.ReLU(),
                                             paddle.nn.AdaptiveAvgPool2D(4), paddle.nn.Flatten())
        self.cls_head = paddle.nn.Linear(16 * 16, classes)
        self.box_head = paddle.nn.Linear(16 * 16, 4)

    def forward(self, image, gt_box, gt_class):
        feature = self.backbone(image)
        logits, box = self.cls_head(feature), F.sigmoid(self.box_head(feature))
        if not self.training:           # detections: boxes, scores, classes
            prob = F.softmax(logits)
            return box, prob.max(axis=1), prob.argmax(axis=1)
        loss_cls = F.cross_entropy(logits, gt_class)
        loss_box = F.smooth_l1_loss(box, gt_box) * 10
        return {"loss": loss_cls + loss_box, "loss_cls": loss_cls, "loss_box": loss_box}


class Recall50(paddle.metric.Metric):
    """Detections of the right class whose box overlaps the ground truth by IoU >= 0.5."""

    def __init__(self):
        super().__init__()
        self.reset()

    def compute(self, box, score, label, gt_box, gt_class):
        low = paddle.maximum(box[:, :2], gt_box[:, :2])
        high = paddle.minimum(box[:, 2:], gt_box[:, 2:])
        inter = paddle.clip(high - low, min=0).prod(axis=1)
        area = lambda b: paddle.clip(b[:, 2:] - b[:, :2], min=0).prod(axis=1)   # noqa: E731
        iou = inter / (area(box) + area(gt_box) - inter + 1e-9)
        return ((iou >= 0.5) & (label == gt_class.reshape([-1]))).astype("int64")

    def update(self, hits):
        self.hits, self.count = self.hits + int(hits.sum()), self.count + len(hits)

    def accumulate(self):
        return self.hits / max(self.count, 1)

    def reset(self):
        self.hits = self.count = 0

    def name(self):
        return "recall50"


def build():
    paddle.seed(2024)
    net = TinyDetector()
    train_loader = paddle.io.DataLoader(OneBox(160, seed=0), batch_size=8, shuffle=True)
    eval_loader = paddle.io.DataLoader(OneBox(50, seed=1), batch_size=10)
    optimizer = paddle.optimizer.Adam(0.01, parameters=net.parameters())
    return net, train_loader, eval_loader, "model", optimizer, [Recall50()]


def evaluate(net, eval_loader, metrics):
    """One plain process, as PaddleDetection's evaluation: the recall over the whole set."""
    net.eval()
    for metric in metrics:
        metric.reset()
    with paddle.no_grad():
        for batch in eval_loader:
            detections = net(batch["image"], batch["gt_box"], batch["gt_class"])
            for metric in metrics:
                metric.update(metric.compute(*detections, batch["gt_box"], batch["gt_class"]).numpy())
    return {"recall50": metrics[0].accumulate()}


def main():
    import paddle_dist
    from paddle.static import InputSpec

    net, train_loader, eval_loader, loss, optimizer, metrics = build()
    paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer, metrics=metrics, epochs=EPOCHS,
                    inputs=[InputSpec([None, 3, SIZE, SIZE], "float32", "image")],
                    labels=[InputSpec([None, 4], "float32", "gt_box"), InputSpec([None, 1], "int64", "gt_class")],
                    config=paddle_dist.load_config(overrides=["checkpoint.monitor=eval_recall50"]))
    return net, []


if __name__ == "__main__":
    main()
