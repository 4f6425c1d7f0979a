"""docs/examples/ctr.py's wide&deep CTR model as a plain Paddle script: its own loop over
`paddle.DataParallel`, no paddle_dist in it. Under the launcher it trains data-parallel
through Paddle's reducer, which knows `nn.Embedding(sparse=True)` tables and all-reduces
their rows; `Adam(lazy_mode=True)` (or SGD) updates only the rows a step looked up.

    python -m paddle_dist.launch --nprocs 2 docs/examples/ctr_plain.py --save weights
    ... docs/examples/ctr_plain.py --own-tables    # refused: see below

Paddle's reducer takes any other parameter for dense: a table of one's own looked up with
`F.embedding(..., sparse=True)` (`--own-tables`) kills a raw Paddle job with SIGSEGV at
the first backward. Under paddle_dist's launcher that backward instead ends the rank with
one line naming the table (runtime/scripthooks/tables.py); fit() (`ctr.py --own-tables`)
trains such tables.
"""

import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ctr  # noqa: E402  (the model, data and optimizer of the fit() example)


def main(argv):
    dist.init_parallel_env()
    net, data, _, loss_fn, optimizer, _ = ctr.build("--own-tables" in argv)
    model = paddle.DataParallel(net)
    # shuffle=False: the test replays the same batches in one process.
    sampler = paddle.io.DistributedBatchSampler(data, ctr.BATCH, shuffle=False)
    loader = paddle.io.DataLoader(data, batch_sampler=sampler)
    for epoch in range(ctr.EPOCHS):
        for ids, clicked in loader:
            loss = loss_fn(model(ids), clicked)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {float(loss):.4f}", flush=True)
    if "--save" in argv:
        path = f"{argv[argv.index('--save') + 1]}.rank{dist.get_rank()}.npz"
        np.savez(path, **{k: v.numpy() for k, v in net.state_dict().items()})


if __name__ == "__main__":
    main(sys.argv[1:])
