"""paddle_dist's extension points, extended from outside the package: a toy transport,
added in a script through sync/transports.py alone (a reducer and a `register` call),
carries a real 2-rank job's gradients through GradSync (the self-test's MLP against its
one-process replay); a toy data set, added in a script through data/registry.py alone,
trains through the built-in job; and a name with no entry is one line before any rank
starts (a transport's in one process: tests/unit/test_train.py)."""

import json

from paddle_dist.runs.layout import Run

from .procs import ROOT, run

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "toy_transport.py"


def test_a_transport_of_ones_own_carries_the_gradients(tmp_path):
    done = run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), str(SCRIPT),
                str(tmp_path)], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["how"] == "sync fused over toy"
        assert rank["calls"] == 3 * 5          # 3 steps: the head (flag, presence) and 4 gradients
        assert rank["difference"] <= 1e-6
    assert ranks[0]["digest"] == ranks[1]["digest"]


DATASET_SCRIPT = ROOT / "tests" / "integration" / "scripts" / "toy_dataset.py"


def test_a_data_set_of_ones_own_trains_through_the_built_in_job(tmp_path):
    """One `registry.register` call (data/registry.py) is the whole of adding a data set:
    the built-in job's check, parts and trainer take it, and export's preprocessing says
    how its images become the model's input."""
    done = run([str(DATASET_SCRIPT), str(tmp_path / "run")], cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["steps"] == 2 * 256 // 32 and found["metrics"]["eval_accuracy"] >= 0.9
    assert found["deploy"]["classes"] == ["top-left", "top-right", "bottom-left", "bottom-right"]
    assert found["deploy"]["input_shape"] == [1, 28, 28] and found["deploy"]["preprocess"]["mean"] == [0.25]
    assert Run(tmp_path / "run").metrics.is_file()


def test_a_data_set_with_no_entry_is_one_line_before_any_rank_starts(tmp_path):
    done = run(["train.py", "-o", "data.name=tea_leaves", "-o", f"output.run_dir={tmp_path / 'run'}"], timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: data.name must be one of mnist, cifar10, imagefolder, synthetic, linear (got 'tea_leaves')")
    assert not (tmp_path / "run").exists()
