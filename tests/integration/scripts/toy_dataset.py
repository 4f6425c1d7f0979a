"""A data set of one's own for the built-in job, added the way data/registry.py says (one
`register` call and its reader), then trained by the built-in job's own path (worker.main:
the launcher's check, the parts, the trainer) in one process, and its preprocessing read
as export writes it.

    python toy_dataset.py RUN_DIR

Prints one JSON line: the run's final metrics and deploy.json's view of the data.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))     # the repository

import numpy as np  # noqa: E402

from paddle_dist import config, worker  # noqa: E402
from paddle_dist.data import registry  # noqa: E402
from paddle_dist.data.datasets import ArrayDataset  # noqa: E402


def quadrants(cfg):
    """28x28 images with a bright square in one of 4 quadrants; the label is the quadrant."""
    def make(count, seed):
        rng = np.random.RandomState(seed)
        y = rng.randint(0, 4, size=(count, 1)).astype("int64")
        x = rng.normal(0, 0.3, (count, 1, 28, 28)).astype("float32")
        for i, label in enumerate(y[:, 0]):
            top, left = (label // 2) * 14, (label % 2) * 14
            x[i, :, top:top + 14, left:left + 14] += 1.0
        return ArrayDataset(x, y)
    return make(256, cfg.data.seed), make(64, cfg.data.seed + 1), ["top-left", "top-right", "bottom-left", "bottom-right"]


def preprocess(cfg):
    return {"color": "L", "height": 28, "width": 28, "mean": [0.25], "std": [0.5]}, \
        ["top-left", "top-right", "bottom-left", "bottom-right"]


registry.register(registry.DataSet("quadrants", "classification", (1, 28, 28), quadrants, preprocess))


def main(run_dir: str) -> None:
    cfg = config.load("mnist_lenet", ["data.name=quadrants", "model.num_classes=4", "train.epochs=2",
                                      f"output.run_dir={run_dir}"])
    registry.check(cfg)
    result = worker.main(cfg)
    print(json.dumps({"metrics": result.metrics, "steps": result.steps,
                      "deploy": registry.preprocessing(cfg)}))


if __name__ == "__main__":
    main(sys.argv[1])
