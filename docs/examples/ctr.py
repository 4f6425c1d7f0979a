"""A wide&deep click-through-rate model with sparse embedding tables, trained through paddle_dist.fit().

As a recommendation user writes it: three categorical fields (user, item, category) over
vocabularies of 10,000 ids, one `nn.Embedding(v, 8, sparse=True)` per field for the deep
part and one of width 1 for the wide part (a logistic regression over the ids), an MLP over
the concatenated embeddings, `BCEWithLogitsLoss`, `paddle.metric.Auc`, and
`Adam(lazy_mode=True)`, which updates only the rows a step looked up. Each table's gradient
holds only its looked-up rows; paddle_dist averages those rows over the ranks, never the
whole table (docs/sync.md, "Sparse embedding tables"), in every sync mode.

    python docs/examples/ctr.py                                      # one process
    python -m paddle_dist.launch --nprocs 2 docs/examples/ctr.py
    python -m paddle_dist.launch --nprocs 2 -o train.api=hapi docs/examples/ctr.py
    python -m paddle_dist.launch --nprocs 2 docs/examples/ctr.py --own-tables   # F.embedding(sparse=True)
    ... docs/examples/ctr.py --save weights.npz       # rank 0 writes the final weights

The same model in a plain paddle.DataParallel loop: docs/examples/ctr_plain.py.
The same model with the tables built with sparse=False trains alike, but each step then
exchanges the whole tables (docs/benchmarks.md, "Sparse embedding tables").
"""

import sys

import numpy as np
import paddle
import paddle.nn.functional as F

FIELDS, VOCAB, DIM = 3, 10_000, 8
SAMPLES, EVAL_SAMPLES, BATCH, EPOCHS, LR = 2048, 512, 64, 2, 0.01


class Clicks(paddle.io.Dataset):
    """Impressions (three ids, Zipf-distributed as real traffic is) and whether they were
    clicked: more often for a few popular items and for users who like the item's category."""

    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.ids = np.minimum(rng.zipf(1.2, size=(count, FIELDS)) - 1, VOCAB - 1).astype("int64")
        score = 0.8 * (self.ids[:, 1] % 7 == 0) + 0.6 * ((self.ids[:, 0] + self.ids[:, 2]) % 3 == 0) - 0.7
        self.clicked = (rng.rand(count) < 1 / (1 + np.exp(-score))).astype("float32")[:, None]

    def __getitem__(self, i):
        return self.ids[i], self.clicked[i]

    def __len__(self):
        return len(self.ids)


class OwnTable(paddle.nn.Layer):
    """A table of one's own, looked up with F.embedding(..., sparse=True)."""

    def __init__(self, rows, width):
        super().__init__()
        self.weight = self.create_parameter([rows, width], default_initializer=paddle.nn.initializer.Normal(0, 0.05))

    def forward(self, ids):
        return F.embedding(ids, self.weight, sparse=True)


class WideDeep(paddle.nn.Layer):
    def __init__(self, own_tables=False):
        super().__init__()

        def table(width):
            return OwnTable(VOCAB, width) if own_tables else paddle.nn.Embedding(VOCAB, width, sparse=True)

        self.wide = table(1)
        self.deep = paddle.nn.LayerList([table(DIM) for _ in range(FIELDS)])
        self.mlp = paddle.nn.Sequential(paddle.nn.Linear(FIELDS * DIM, 32), paddle.nn.ReLU(),
                                        paddle.nn.Linear(32, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))

    def forward(self, ids):
        wide = self.wide(ids).sum(axis=1)                                    # [batch, 1]
        deep = paddle.concat([emb(ids[:, i]) for i, emb in enumerate(self.deep)], axis=1)
        return wide + self.mlp(deep)                                         # the click's logit


class Auc(paddle.metric.Auc):
    """paddle.metric.Auc on logits: it wants the probabilities of both classes."""

    def compute(self, logits, label):
        p = F.sigmoid(logits)
        return paddle.concat([1 - p, p], axis=1), label


def build(own_tables=False):
    """The model, the data, the optimizer, the loss and the metric."""
    paddle.seed(2024)
    net = WideDeep(own_tables)
    optimizer = paddle.optimizer.Adam(LR, parameters=net.parameters(), lazy_mode=True)
    return net, Clicks(SAMPLES, seed=0), Clicks(EVAL_SAMPLES, seed=1), paddle.nn.BCEWithLogitsLoss(), optimizer, Auc()


def main(argv):
    import paddle_dist

    net, train_data, eval_data, loss, optimizer, auc = build("--own-tables" in argv)
    result = paddle_dist.fit(net, train_data, eval_data, loss, optimizer, metrics=[auc],
                             epochs=EPOCHS, batch_size=BATCH)
    if "--save" in argv and paddle.distributed.get_rank() == 0:
        np.savez(argv[argv.index("--save") + 1], **{k: v.numpy() for k, v in net.state_dict().items()})
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
