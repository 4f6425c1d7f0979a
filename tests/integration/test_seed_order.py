"""Two runs of one command give one result: README's fit() example, run as a script
twice, ends with bitwise equal weights on 1 and on 2 ranks. The same script with the
model built before paddle_dist seeds Paddle ends elsewhere each run, and says so in one
line; a script that seeded Paddle itself first is reproducible and hears nothing.

The script is README's code block as the page gives it, after a small MyNet (with
Dropout: the forward draws from the seeded generator) and two datasets.
"""

import re
from pathlib import Path

import pytest

from ..oracles import rank_status
from .procs import ROOT, run

PREAMBLE = '''
import numpy as np
import paddle


class MyNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.body = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Dropout(0.2),
                                         paddle.nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


class Blobs(paddle.io.Dataset):
    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.y = rng.randint(0, 3, (count, 1)).astype("int64")
        self.x = (rng.normal(0, 1, (count, 8)) + self.y).astype("float32")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.y)


train_dataset, eval_dataset = Blobs(64, 0), Blobs(32, 1)
'''
WARNING = "paddle_dist: warning: the weights of MyNet ("
BUILD = re.compile(r"^net = MyNet\(\).*\n", re.M)       # the line that builds the model


def readme_example() -> str:
    """README's code block that calls paddle_dist.fit(net, ...)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if "paddle_dist.fit(net" in b and BUILD.search(b)]
    assert len(found) == 1, "README.md's fit() example is no longer one block building MyNet"
    return found[0]


def _runs(script: Path, cwd: Path, times: int, launch=()):
    """(each run's final weights digest, what it said), running `script` `times` times
    from `cwd` (each finished run makes the next command a new run)."""
    cwd.mkdir(parents=True, exist_ok=True)
    digests, said = [], []
    for _ in range(times):
        done = run([*launch, str(script)], cwd=cwd, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        said.append(done.stdout + done.stderr)
    for run_dir in sorted(p for p in (cwd / "runs").iterdir() if p.is_dir()):
        digests.append(rank_status(run_dir, 0)["weights_sha256"])
    assert len(digests) == times
    return digests, said


def _script(tmp: Path, name: str, example: str) -> Path:
    path = tmp / f"{name}.py"
    path.write_text(PREAMBLE + example)
    return path


@pytest.mark.compat
def test_readmes_example_run_twice_ends_with_the_same_weights_and_no_warning(tmp_path):
    script = _script(tmp_path, "example", readme_example())
    digests, said = _runs(script, tmp_path / "one", 2)
    assert digests[0] == digests[1]
    assert not any(WARNING in s for s in said)


def test_readmes_example_on_two_ranks_run_twice_ends_with_the_same_weights(tmp_path):
    script = _script(tmp_path, "example", readme_example())
    digests, said = _runs(script, tmp_path / "two", 2, ["-m", "paddle_dist.launch", "--nprocs", "2"])
    assert digests[0] == digests[1]
    assert not any(WARNING in s for s in said)


@pytest.mark.compat
def test_a_model_built_before_the_seed_is_said_once_and_its_runs_differ(tmp_path):
    example = readme_example()
    build = BUILD.search(example).group(0)
    before = build + example.replace(build, "")               # the model first, then setup(cfg)
    digests, said = _runs(_script(tmp_path, "before", before), tmp_path / "before", 2)
    assert digests[0] != digests[1]
    for text in said:
        assert text.count(WARNING) == 1, text[-3000:]
        assert ("were made before paddle_dist seeded Paddle (train.seed=2024), so every run starts from "
                "other weights unless they are loaded from a file; call paddle_dist.setup(cfg), or "
                "paddle.seed(...), before building the model") in text
    # Seeded by the user first, the same order is reproducible: nothing is said.
    digests, said = _runs(_script(tmp_path, "seeded", "paddle.seed(7)\n" + before), tmp_path / "seeded", 2)
    assert digests[0] == digests[1] and not any(WARNING in s for s in said)
