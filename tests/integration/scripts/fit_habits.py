"""fit() with a Paddle user's habits, for tests/integration/test_fit_habits.py.

    fit_habits.py callbacks OUT       # a binary classifier with Paddle's own callbacks and
                                      # metrics; each rank writes OUT/events<rank>.json and
                                      # rank 0 OUT/weights.npz
    fit_habits.py evaluate OUT        # one plain process evaluates OUT/weights.npz; prints JSON
    fit_habits.py replay OUT BATCH    # dict samples into a two-input model, a DataLoader with 2
                                      # workers, parameter groups, clipping; each rank writes
                                      # OUT/rank<N>.npz
    fit_habits.py hwc                 # images in HWC layout into a Conv2D: refused before epoch 1
    fit_habits.py own_sampler         # a DataLoader whose batch sampler picks a subset
    fit_habits.py aux_heads OUT       # a model with extra heads in training only, and a loss
                                      # that takes them all (as PaddleSeg's); prints what it saw
    fit_habits.py dict_keys [FIX]     # dict samples whose keys are not forward's names; FIX:
                                      # fit()'s keyword arguments, e.g. "inputs=[...]"
    fit_habits.py one_logit OUT COLUMNS  # a classifier without metrics whose scores have COLUMNS
                                      # columns: 1 (BCEWithLogitsLoss) or 2 (cross-entropy)
    fit_habits.py sync_bn OUT [NORM]  # a SyncBatchNorm on a CPU (NORM=bn: a BatchNorm1D instead);
                                      # rank 0 writes OUT/<NORM>.npz
    fit_habits.py untrained           # a trainable head the loss never reaches
    fit_habits.py bad_sample WORKERS WHERE  # sample 37 raises in __getitem__ (WHERE=item) or in
                                      # the collate_fn (WHERE=collate)
    fit_habits.py loss_parts OUT BATCH  # a detector-like model whose loss="model" is a dict
                                      # {loss, loss_cls, loss_box} in training, detections in
                                      # evaluation (no loss); OUT/parts<rank>.json
    fit_habits.py schedule OUT        # a cosine schedule sized from len(DataLoader), and one
                                      # from paddle_dist.steps(); OUT/steps<rank>.json
"""

import json
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F

import paddle_dist


class Points(paddle.io.Dataset):
    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.x = rng.normal(0, 1, (count, 4)).astype("float32")
        self.y = (self.x[:, :1] + 0.5 * rng.normal(0, 1, (count, 1)) > 0).astype("int64")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


class Positive(paddle.metric.Metric):
    """Precision, Recall and Auc read probabilities: a user's compute() gives them."""

    def compute(self, logits, label):
        prob = F.softmax(logits, axis=-1)
        return (prob if isinstance(self, paddle.metric.Auc) else prob[:, 1:]), label


class Precision(Positive, paddle.metric.Precision):
    pass


class Recall(Positive, paddle.metric.Recall):
    pass


class Auc(Positive, paddle.metric.Auc):
    pass


def metrics():
    return [paddle.metric.Accuracy(), Precision(), Recall(), Auc()]


class Record(paddle.callbacks.Callback):
    """Every call, with the logs' keys (and the eval logs' values)."""

    def __init__(self):
        super().__init__()
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            def record(*args):
                logs = args[-1] or {}
                self.events.append([name, {k: v for k, v in logs.items()} if "eval_end" in name
                                    else sorted(logs)])
            return record
        return super().__getattribute__(name)


def net():
    paddle.seed(7)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 2))


def callbacks(out):
    out = Path(out)
    cfg = paddle_dist.load_config(overrides=["train.epochs=6", "train.batch_size=8",
                                             "train.eval_batch_size=16", f"output.run_dir={out}/run"])
    record = Record()
    plateau = paddle.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, verbose=0)
    stopper = paddle.callbacks.EarlyStopping("acc", mode="max", patience=1, verbose=0)
    model = net()
    paddle_dist.fit(model, Points(96, 0), Points(51, 1), optimizer=paddle.optimizer.SGD(0.5, parameters=model.parameters()),
                    config=cfg, metrics=metrics(),
                    callbacks=[record, plateau, stopper, paddle.callbacks.VisualDL(str(out / "vdl")),
                               paddle.callbacks.ModelCheckpoint(save_dir=str(out / "saved"))])
    rank = paddle.distributed.get_rank()
    (out / f"events{rank}.json").write_text(json.dumps({"events": record.events, "stop": stopper.stopped_epoch}))
    if rank == 0:
        np.savez(out / "weights.npz", **{k: v.numpy() for k, v in model.state_dict().items()})


def evaluate(out):
    model = net()
    saved = np.load(Path(out) / "weights.npz")
    model.set_state_dict({k: paddle.to_tensor(saved[k]) for k in saved.files})
    model.eval()
    found = {}
    data = Points(51, 1)
    logits = model(paddle.to_tensor(data.x))
    label = paddle.to_tensor(data.y)
    for metric in metrics():
        results = metric.compute(logits, label)
        results = results if isinstance(results, (list, tuple)) else [results]
        metric.update(*[r.numpy() for r in results])
        found[metric.name()[0] if isinstance(metric.name(), list) else metric.name()] = float(metric.accumulate())
    found["loss"] = float(F.cross_entropy(logits, label))
    print(json.dumps(found))


class Pairs(paddle.io.Dataset):
    """Dict samples: two inputs and a label."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.a, self.b = rng.normal(0, 1, (count, 3)).astype("float32"), rng.normal(0, 1, (count, 2)).astype("float32")
        self.y = (self.a[:, :1] * self.b[:, :1] > 0).astype("int64")

    def __getitem__(self, i):
        return {"label": self.y[i], "b": self.b[i], "a": self.a[i]}

    def __len__(self):
        return len(self.y)


class TwoInputs(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.left, self.right = paddle.nn.Linear(3, 8), paddle.nn.Linear(2, 8)
        self.out = paddle.nn.Linear(8, 2)

    def forward(self, a, b):
        return self.out(paddle.tanh(self.left(a) * self.right(b)))


def replay(out, batch):
    paddle.seed(3)
    model = TwoInputs()
    groups = [{"params": model.out.parameters(), "learning_rate": 0.5},
              {"params": model.left.parameters() + model.right.parameters()}]
    optimizer = paddle.optimizer.Momentum(0.1, parameters=groups,
                                          grad_clip=paddle.nn.ClipGradByGlobalNorm(0.5))
    loader = paddle.io.DataLoader(Pairs(96, 0), batch_size=int(batch), shuffle=True, num_workers=2)
    cfg = paddle_dist.load_config(overrides=["train.epochs=3", f"output.run_dir={out}/run"])
    paddle_dist.fit(model, loader, Pairs(21, 1), optimizer=optimizer, config=cfg, metrics=metrics())
    np.savez(Path(out) / f"rank{paddle.distributed.get_rank()}.npz",
             **{k: v.numpy() for k, v in model.state_dict().items()})


class Images(paddle.io.Dataset):
    def __getitem__(self, i):
        return np.zeros((32, 32, 3), "float32"), np.array([i % 10], "int64")    # HWC: wrong

    def __len__(self):
        return 64


def hwc():
    model = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.Flatten(), paddle.nn.Linear(8 * 30 * 30, 10))
    paddle_dist.fit(model, Images(), Images(), epochs=2)


def own_sampler():
    """A sampler that picks a subset: paddle_dist cannot deal out a run of it exactly."""
    data = Points(64, 0)
    subset = paddle.io.BatchSampler(sampler=paddle.io.SubsetRandomSampler(list(range(32))), batch_size=2)
    paddle_dist.fit(net(), paddle.io.DataLoader(data, batch_sampler=subset))


class AuxHeads(paddle.nn.Layer):
    """Three heads in training, one in evaluation; its BatchNorm shows the check's forward
    leaves no trace."""

    def __init__(self):
        super().__init__()
        paddle.seed(7)
        self.body, self.norm = paddle.nn.Linear(4, 16), paddle.nn.BatchNorm1D(16)
        self.heads = paddle.nn.LayerList([paddle.nn.Linear(16, 2) for _ in range(3)])

    def forward(self, x):
        h = F.relu(self.norm(self.body(x)))
        return [head(h) for head in self.heads] if self.training else self.heads[0](h)


def aux_loss(*args):
    *logits, label = args
    if len(logits) != 3:
        raise ValueError(f"{len(logits)} != 3 heads")
    return sum(F.cross_entropy(x, label) for x in logits)


def aux_heads(out):
    model = AuxHeads()
    paddle_dist.fit(model, Points(32, 0), Points(20, 1), epochs=1, batch_size=8, loss=aux_loss,
                    metrics=[paddle.metric.Accuracy()],
                    config=paddle_dist.load_config(overrides=[f"output.run_dir={out}/run"]))
    print(json.dumps({"norm_mean": model.norm._mean.numpy().tolist()}))


class Named(paddle.io.Dataset):
    def __getitem__(self, i):
        return {"img": np.ones(4, "float32") * i, "label": np.array([i % 2], "int64"), "trans_info": "flip"}

    def __len__(self):
        return 16


def dict_keys(fix=""):
    """`fix`: the keyword arguments of the fit() the refusal suggests, pasted as it gives them."""
    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x)
    given = eval(f"dict({fix})", {"paddle": paddle}) if fix else {}     # noqa: S307  (the hint's code)
    paddle_dist.fit(Net(), Named(), epochs=1, batch_size=4, **given)


def one_logit(out, columns):
    """A binary classifier evaluated without metrics: one logit with BCEWithLogitsLoss, or
    two columns with cross-entropy."""
    paddle.seed(7)
    model = paddle.nn.Linear(4, int(columns))
    loss = (lambda logit, y: F.binary_cross_entropy_with_logits(logit, y.astype("float32"))) \
        if columns == "1" else paddle.nn.CrossEntropyLoss()
    paddle_dist.fit(model, Points(32, 0), Points(16, 1), loss=loss, epochs=2, batch_size=8,
                    config=paddle_dist.load_config(overrides=[f"output.run_dir={out}"]))


def sync_bn(out, norm="sync"):
    paddle.seed(7)
    layer = paddle.nn.SyncBatchNorm(8) if norm == "sync" else paddle.nn.BatchNorm1D(8)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), layer, paddle.nn.Linear(8, 2))
    paddle_dist.fit(model, Points(32, 0), epochs=1, batch_size=8,
                    config=paddle_dist.load_config(overrides=[f"output.run_dir={out}/{norm}"]))
    if paddle.distributed.get_rank() == 0:
        np.savez(Path(out) / f"{norm}.npz", **{k: v.numpy() for k, v in model.state_dict().items()})


def untrained():
    class TwoHeads(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.body, self.used, self.unused = paddle.nn.Linear(4, 8), paddle.nn.Linear(8, 2), paddle.nn.Linear(8, 2)

        def forward(self, x):
            return self.used(F.relu(self.body(x)))
    paddle_dist.fit(TwoHeads(), Points(32, 0), epochs=2, batch_size=8)


class Detector(paddle.nn.Layer):
    """Computes its own loss in training, in parts, as PaddleDetection's architectures do."""

    def __init__(self):
        super().__init__()
        paddle.seed(7)
        self.body, self.cls, self.box = paddle.nn.Linear(4, 16), paddle.nn.Linear(16, 2), paddle.nn.Linear(16, 1)

    def forward(self, x, label):
        h = F.relu(self.body(x))
        if not self.training:          # detections, no loss (as PaddleDetection's architectures)
            return F.softmax(self.cls(h))
        loss_cls = F.cross_entropy(self.cls(h), label)
        loss_box = F.smooth_l1_loss(self.box(h), x[:, :1])
        return {"loss": loss_cls + loss_box, "loss_cls": loss_cls, "loss_box": loss_box}


def loss_parts(out, batch):
    out, rank = Path(out), paddle.distributed.get_rank()
    record = Record()
    model = Detector()
    paddle_dist.fit(model, Points(64, 0), Points(40, 1), loss="model", inputs=1, epochs=2, batch_size=int(batch),
                    callbacks=[record], metrics=[paddle.metric.Accuracy()],
                    optimizer=paddle.optimizer.SGD(0.1, parameters=model.parameters()),
                    config=paddle_dist.load_config(overrides=[f"output.run_dir={out}/run", "train.log_every=2"]))
    (out / f"parts{rank}.json").write_text(json.dumps(record.events))


class Broken(Points):
    def __getitem__(self, i):
        if i == 37:
            raise ValueError(f"label of sample {i} is out of range")
        return super().__getitem__(i)


def collate_points(samples):
    if any(float(x[0]) == float(Points(64, 0).x[37][0]) for x, _ in samples):
        raise ValueError("a box with negative width")
    return [np.stack([x for x, _ in samples]), np.stack([y for _, y in samples])]


def bad_sample(workers, where):
    data = Broken(64, 0) if where == "item" else Points(64, 0)
    loader = paddle.io.DataLoader(data, batch_size=8, num_workers=int(workers),
                                  collate_fn=collate_points if where == "collate" else None)
    paddle_dist.fit(net(), loader, epochs=1, config=paddle_dist.load_config(
        overrides=["train.shuffle=false"]))


def schedule(out):
    out, rank = Path(out), paddle.distributed.get_rank()
    loader = paddle.io.DataLoader(Points(64, 0), batch_size=4, shuffle=True)
    plan = paddle_dist.steps(loader, epochs=2)
    (out / f"steps{rank}.json").write_text(json.dumps({"len": len(loader), **vars(plan)}))
    for name, length in (("len", len(loader) * 2), ("steps", plan.total)):
        model = net()
        scheduler = paddle.optimizer.lr.CosineAnnealingDecay(0.1, T_max=length)
        paddle_dist.fit(model, loader, epochs=2, optimizer=paddle.optimizer.SGD(scheduler, parameters=model.parameters()),
                        config=paddle_dist.load_config(overrides=[f"output.run_dir={out}/{name}"]))


if __name__ == "__main__":
    {"callbacks": callbacks, "evaluate": evaluate, "replay": replay, "aux_heads": aux_heads, "loss_parts": loss_parts, "bad_sample": bad_sample,
     "sync_bn": sync_bn, "dict_keys": dict_keys, "one_logit": one_logit,
     "schedule": schedule}.get(sys.argv[1], lambda *a: globals()[sys.argv[1]]())(*sys.argv[2:])
