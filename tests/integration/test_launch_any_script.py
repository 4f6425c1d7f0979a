"""`python -m paddle_dist.launch` runs an existing Paddle script data-parallel."""

import json
import sys
from pathlib import Path

import numpy as np

from .procs import ROOT, check, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "three_changes.py")


def test_three_changes_script_runs_on_two_ranks_with_our_settings(tmp_path):
    result = check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
                        "-o", "dist.nccl.debug=INFO", "-o", "dist.nccl.socket_ifname=lo",
                        SCRIPT, "--out", str(tmp_path)]))
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    weights = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in (0, 1)]
    assert [i["world"] for i in infos] == [2, 2]
    # 256 samples, 2 epochs, split between the ranks: each saw exactly half.
    assert [i["seen"] for i in infos] == [256, 256]
    for key in weights[0]:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    for info in infos:
        assert info["env"]["NCCL_DEBUG"] == "INFO"
        assert info["env"]["NCCL_SOCKET_IFNAME"] == "lo"
        assert info["env"]["OMP_NUM_THREADS"] == "1"
    assert "Traceback" not in result.stderr


def test_the_launchers_config_options_reach_the_scripts_load_config(tmp_path):
    """-c and -o given to the launcher are what paddle_dist.load_config() and fit()'s own
    config return in every rank (the command line wins over the script's overrides)."""
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import paddle_dist\n"
        "cfg = paddle_dist.load_config(overrides=['train.epochs=7', 'train.lr=0.5'])\n"
        "out = {'epochs': cfg.train.epochs, 'lr': cfg.train.lr, 'model': cfg.model.name}\n"
        "open(os.path.join(sys.argv[1], f'{os.getpid()}.json'), 'w').write(json.dumps(out))\n")
    check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
               "-c", "mnist_mlp", "-o", "train.epochs=1", str(script), str(tmp_path)]))
    seen = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert seen == [{"epochs": 1, "lr": 0.5, "model": "mlp"}] * 2


def test_console_command_is_installed():
    command = Path(sys.executable).parent / "paddle-dist-launch"
    result = check(run([str(command), "--help"], timeout=60))
    assert "--nprocs" in result.stdout and "--gpus" in result.stdout
