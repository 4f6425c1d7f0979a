"""paddle_dist's extension points, extended from outside the package: a toy transport,
added in a script through sync/transports.py alone (a reducer and a `register` call),
carries a real 2-rank job's gradients through GradSync (the self-test's MLP against its
one-process replay); and a name no transport has is one line before any rank starts."""

import json

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


def test_a_transport_with_no_entry_is_one_line_before_any_rank_starts(tmp_path):
    done = run(["train.py", "-o", "dist.nprocs=2", "-o", "sync.transport=carrier_pigeon",
                "-o", f"output.run_dir={tmp_path / 'run'}"], timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: sync.transport must be one of auto, shm, hierarchical, backend (got 'carrier_pigeon')")
    assert not (tmp_path / "run").exists()
