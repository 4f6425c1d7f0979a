"""Nothing is taken from the working directory by accident (issue 53, findings 4 and 5).
Another user (uid 65534) plants, in a working directory every user may add to (sticky, as
/tmp), a config under a bundled name and a module named yaml.py that notes every process
that imports it. The job runs there as root: its launcher and ranks read the bundled
config, and no rank imports the module. The launcher itself, started as `python -m`, does:
that is Python's own rule (docs/security.md), which `python -P` turns off."""

import json
import os
from pathlib import Path

import pytest
import yaml

from paddle_dist.runs.layout import Run

from ..oracles import NOBODY, as_nobody, shared_folder
from .procs import check, run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")

# yaml.py of the other user: notes who imported it, then hands over the real yaml.
PLANTED_YAML = """
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "imported-by"), "a") as f:
    f.write(repr([os.getpid(), os.environ.get("PADDLE_TRAINER_ID", "launcher")]) + "\\n")
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
del sys.modules["yaml"]
import yaml
"""
PLANTED_CONFIG = "train:\n  lr: 0.123\noutput:\n  name: planted\n"
shared = pytest.fixture(shared_folder)


def test_a_planted_config_and_module_in_the_working_directory_change_no_rank(shared, tmp_path):
    def plant():
        (shared / "yaml.py").write_text(PLANTED_YAML)
        (shared / "imported-by").write_text("")
        (shared / "synthetic_lenet").write_text(PLANTED_CONFIG)
    as_nobody(plant)
    root = tmp_path / "runs"
    result = check(run(["-m", "paddle_dist.train", "-c", "synthetic_lenet", "-o", "dist.nprocs=2",
                        "-o", "train.max_steps=2", "-o", "checkpoint.every_epochs=0", "-o", f"output.root={root}"],
                       timeout=240, cwd=shared))
    # The bundled config, said in one line; the planted one was not read.
    assert ("the file synthetic_lenet in the working directory is not read (pass ./synthetic_lenet to use it)"
            in result.stderr), result.stderr
    [run_dir] = [d for d in root.iterdir() if d.is_dir()]
    ran = yaml.safe_load(Run(run_dir).config.read_text())
    assert ran["train"]["lr"] == 0.05 and not run_dir.name.startswith("planted")
    # The ranks ran in safe-path mode; the launcher, a plain `python -m`, did not.
    importers = [json.loads(line.replace("'", '"')) for line in (shared / "imported-by").read_text().splitlines()]
    assert [who for _, who in importers] == ["launcher"], importers
