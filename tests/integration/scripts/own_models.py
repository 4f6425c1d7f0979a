"""The examples of docs/examples/ as the tests run them.

    own_models.py train EXAMPLE OUT       # the example's main(), unchanged; rank 0 then writes
                                          # OUT/evaluated.npz: the weights its last evaluation
                                          # used (an EMA callback's averages, if it has one)
    own_models.py evaluate EXAMPLE WEIGHTS    # one plain process: the example's eval loader,
                                              # fresh metrics, loss per batch (or the example's
                                              # own evaluate()); prints JSON
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(name, out):
    import paddle

    net, callbacks = example(name).main()
    if paddle.distributed.get_rank() != 0:
        return
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    for callback in callbacks:          # the EMA callback's averages are what was evaluated
        for key, value in getattr(callback, "shadow", {}).items():
            weights[key] = value
    np.savez(Path(out) / "evaluated.npz", **weights)


def evaluate(name, weights):
    import paddle

    import paddle_dist

    module = example(name)
    built = module.build()
    net, eval_loader, loss_fn, metrics = built[0], built[2], built[3], built[5]
    if weights.endswith(".npz"):
        saved = np.load(weights)
        net.set_state_dict({k: paddle.to_tensor(saved[k]) for k in saved.files})
    else:                      # a run directory: its latest checkpoint (moving averages first)
        paddle_dist.checkpoint.load_weights(net, weights)
    if hasattr(module, "evaluate"):      # a suite's example evaluates as its suite does
        print(json.dumps(module.evaluate(net, eval_loader, metrics)))
        return
    net.eval()
    inputs = len(getattr(module, "INPUTS", [None]))
    loss_sum = count = 0.0
    for metric in metrics:
        metric.reset()
    with paddle.no_grad():
        for batch in eval_loader:
            fields = [batch[k] for k in ("image", "mask")] if isinstance(batch, dict) else list(batch)
            outputs, labels = net(*fields[:inputs]), fields[inputs:]
            n = fields[0].shape[0]
            loss_sum += float(loss_fn(outputs, *labels)) * n
            count += n
            for metric in metrics:      # compute() gives one tensor or a tuple, as paddle.Model reads it
                results = metric.compute(outputs, *labels)
                results = results if isinstance(results, (list, tuple)) else [results]
                metric.update(*[r.numpy() if isinstance(r, paddle.Tensor) else r for r in results])
    found = {"loss": loss_sum / count, "count": int(count)}
    for metric in metrics:
        names, values = metric.name(), metric.accumulate()
        names = names if isinstance(names, list) else [names]
        values = values if isinstance(values, list) and len(names) > 1 else [values]
        found.update({n: float(v) for n, v in zip(names, values)})
    print(json.dumps(found))


if __name__ == "__main__":
    command, name, where = sys.argv[1:4]
    train(name, where) if command == "train" else evaluate(name, where)
