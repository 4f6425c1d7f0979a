"""Classify images with an exported model: `python -m paddle_dist.predict EXPORTED_DIR IMAGE...`.

Runs the model that `python -m paddle_dist.export` wrote through Paddle Inference, after
the preprocessing its deploy.json describes (decoded by Pillow: PNG, JPEG and whatever else
Pillow reads), on this process's GPU as env.detect() picks it (the one FLAGS_selected_gpus
or the local rank names, else the first visible one), or on the CPU when Paddle has no CUDA
or no GPU is visible.
Prints each image's top-k classes with their probabilities, or JSON (`--json`).

Example:
    $ python -m paddle_dist.predict runs/mnist_lenet-20261123-061500/export digit.png
    digit.png: 7 (0.998), 2 (0.001), 3 (0.000)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .runtime import devices as devicelib, env as envlib
from .errors import UserError
from .options import ArgParser, run
from .export import DEPLOY_FILE
from .data.imagefolder import fit_image

PROG = "python -m paddle_dist.predict"


def read_deploy(folder: Path) -> Dict[str, Any]:
    """deploy.json of an exported model, checked to describe an image classifier."""
    path = Path(folder) / DEPLOY_FILE
    try:
        deploy = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UserError(f"{folder} holds no readable {DEPLOY_FILE}; give a directory written by "
                        "python -m paddle_dist.export") from None
    if deploy.get("task") != "classification" or not deploy.get("preprocess"):
        raise UserError(f"{folder} holds a {deploy.get('task', 'model')} without image "
                        "preprocessing; predict classifies images only")
    return deploy


def load_images(paths: Sequence[str], pre: Dict[str, Any]) -> np.ndarray:
    """float32 [N, C, H, W]: decoded, converted to the colour mode, resized and cropped
    (imagefolder.fit_image, as in training), scaled and normalised as deploy.json's
    "preprocess" says."""
    from PIL import Image, UnidentifiedImageError

    mean = np.asarray(pre["mean"], np.float32).reshape(-1, 1, 1)
    std = np.asarray(pre["std"], np.float32).reshape(-1, 1, 1)
    batch = []
    for path in paths:
        try:
            with Image.open(path) as image:
                array = fit_image(image, pre["height"], pre["color"])
        except FileNotFoundError:
            raise UserError(f"image {path} not found") from None
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise UserError(f"cannot read image {path} ({type(exc).__name__}); give a PNG or JPEG file") from None
        batch.append((array.astype(np.float32) * np.float32(pre["scale"]) - mean) / std)
    return np.stack(batch).astype(np.float32)


class Predictor:
    """An exported model in Paddle Inference.

    `device`: "gpu:<n>" (n counts among the visible GPUs, as in `DistEnv.device`), "cpu",
    or None for this process's device as `env.detect()` picks it (a rank's own GPU).

    Example:
        probabilities = Predictor("runs/x/export").probabilities(["a.png", "b.png"])
        Predictor("runs/x/export", device=env.device)     # inside a job: the rank's GPU
    """

    def __init__(self, folder, device: Optional[str] = None):
        self.folder = Path(folder)
        self.deploy = read_deploy(self.folder)           # before paddle's import: a wrong folder is quick
        from paddle import inference

        gpu = gpu_index(device if device is not None else envlib.detect().device)
        config = inference.Config(str(self.folder / self.deploy["model_file"]),
                                  str(self.folder / self.deploy["params_file"]))
        config.disable_glog_info()
        if gpu is None:
            config.disable_gpu()
        else:
            config.enable_use_gpu(256, gpu)
        self.predictor = inference.create_predictor(config)

    def logits(self, x: np.ndarray) -> np.ndarray:
        handle = self.predictor.get_input_handle(self.predictor.get_input_names()[0])
        handle.reshape(list(x.shape))
        handle.copy_from_cpu(np.ascontiguousarray(x))
        self.predictor.run()
        return self.predictor.get_output_handle(self.predictor.get_output_names()[0]).copy_to_cpu()

    def probabilities(self, paths: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Softmax of the model's outputs, [N, classes], for the images at `paths`."""
        out = [self.logits(load_images(paths[i:i + batch_size], self.deploy["preprocess"]))
               for i in range(0, len(paths), batch_size)]
        logits = np.concatenate(out).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)


def gpu_index(device: str) -> Optional[int]:
    """The GPU of a device string for Paddle Inference's enable_use_gpu, None for the CPU.

    Example:
        gpu_index("gpu:1")   # 1
    """
    kind, _, index = str(device).partition(":")
    if kind == devicelib.CPU and not index:
        return None
    if kind != "gpu" or not index.isdigit():
        raise UserError(f"device {device!r} is not 'cpu' or 'gpu:N' (N counting the visible GPUs "
                        "from 0); pass e.g. device='gpu:0', or env.device of the job")
    return int(index)


def top_k(probabilities: np.ndarray, classes: Optional[List[str]], k: int) -> List[List[Dict[str, Any]]]:
    """Per image, the k most probable classes: [{"class", "index", "probability"}, ...]."""
    found = []
    for row in probabilities:
        best = np.argsort(-row, kind="stable")[:k]
        found.append([{"class": classes[i] if classes else str(i), "index": int(i),
                       "probability": float(row[i])} for i in best])
    return found


def main(argv: Optional[List[str]] = None) -> int:
    parser = ArgParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a directory written by python -m paddle_dist.export")
    parser.add_argument("images", nargs="+", help="image files (PNG, JPEG, ...)")
    parser.add_argument("-k", "--top-k", type=int, default=3, help="classes to show per image (3)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = parser.parse_args(argv)
    if args.top_k < 1:
        raise UserError(f"{PROG}: --top-k must be 1 or more, not {args.top_k}")
    predictor = Predictor(args.model)
    found = top_k(predictor.probabilities(args.images), predictor.deploy.get("classes"), args.top_k)
    if args.json:
        print(json.dumps([{"image": path, "top": top} for path, top in zip(args.images, found)], indent=1))
    else:
        for path, top in zip(args.images, found):
            print(f"{path}: " + ", ".join(f"{t['class']} ({t['probability']:.3f})" for t in top))
    return 0


if __name__ == "__main__":
    run(main)
