"""predict.Predictor runs Paddle Inference on the job's GPU, not always on GPU 0.

Paddle Inference is replaced by a fake Config that records what the predictor asked of it,
and the GPUs by a fake GpuInfo, so no GPU and no exported model are needed.
"""

import json

import paddle
import pytest
from paddle import inference

from paddle_dist.runtime import env as envlib
from paddle_dist import predict
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.errors import UserError

# Everything env.detect() reads, cleared so that the test's own variables alone decide.
LAUNCH_VARIABLES = ("PADDLE_TRAINER_ID", "PADDLE_LOCAL_RANK", "PADDLE_TRAINERS_NUM", "PADDLE_LOCAL_SIZE",
                    "PADDLE_NNODES", "PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
                    "FLAGS_selected_gpus", "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                    "SLURM_NTASKS", "SLURM_STEP_ID", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class FakeConfig:
    """Records the calls Predictor makes on paddle.inference.Config."""

    made = []

    def __init__(self, model_file, params_file):
        self.calls = []
        FakeConfig.made.append(self)

    def disable_glog_info(self):
        pass

    def enable_use_gpu(self, memory_mb, device_id):
        self.calls.append(("enable_use_gpu", memory_mb, device_id))

    def disable_gpu(self):
        self.calls.append(("disable_gpu",))


@pytest.fixture
def exported(tmp_path, monkeypatch):
    """A folder with an exported classifier's deploy.json; Paddle Inference faked; no launcher."""
    deploy = {"task": "classification", "model_file": "inference.pdmodel",
              "params_file": "inference.pdiparams",
              "preprocess": {"height": 28, "color": "L", "scale": 1 / 255, "mean": [0.5], "std": [0.5]}}
    (tmp_path / "deploy.json").write_text(json.dumps(deploy))
    FakeConfig.made = []
    monkeypatch.setattr(inference, "Config", FakeConfig)
    monkeypatch.setattr(inference, "create_predictor", lambda config: object())
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def machine_with(monkeypatch, gpus):
    """This process sees `gpus` GPUs of a CUDA build (0: a CPU build), through the
    environment layer and through Paddle alike."""
    monkeypatch.setattr(envlib, "probe_gpus", lambda: GpuInfo(gpus > 0, gpus))
    monkeypatch.setattr(paddle.device, "is_compiled_with_cuda", lambda: gpus > 0)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: gpus)


def gpu_calls(folder, **kwargs):
    predict.Predictor(folder, **kwargs)
    [config] = FakeConfig.made
    return config.calls


@pytest.mark.parametrize("device, calls", [
    ("gpu:2", [("enable_use_gpu", 256, 2)]),
    ("gpu:0", [("enable_use_gpu", 256, 0)]),
    ("cpu", [("disable_gpu",)]),
])
def test_the_caller_names_the_device(exported, device, calls):
    assert gpu_calls(exported, device=device) == calls


def test_without_a_device_a_rank_uses_the_gpu_its_launcher_selected(exported, monkeypatch):
    machine_with(monkeypatch, 4)
    monkeypatch.setenv("FLAGS_selected_gpus", "3")
    assert gpu_calls(exported) == [("enable_use_gpu", 256, 3)]


def test_without_a_device_an_mpirun_rank_uses_its_local_ranks_gpu(exported, monkeypatch):
    machine_with(monkeypatch, 4)
    for name, value in {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    assert gpu_calls(exported) == [("enable_use_gpu", 256, 1)]


def test_without_a_device_or_a_named_gpu_the_first_visible_one_is_used(exported, monkeypatch):
    machine_with(monkeypatch, 4)
    assert gpu_calls(exported) == [("enable_use_gpu", 256, 0)]


def test_without_gpus_inference_runs_on_the_cpu(exported, monkeypatch):
    machine_with(monkeypatch, 0)
    assert gpu_calls(exported) == [("disable_gpu",)]


@pytest.mark.parametrize("device", ["gpu", "gpu:x", "cuda:0", "gpu:-1", ""])
def test_a_malformed_device_is_a_one_line_user_error(exported, device):
    with pytest.raises(UserError, match="is not 'cpu' or 'gpu:N'") as refused:
        predict.Predictor(exported, device=device)
    assert "\n" not in str(refused.value) and FakeConfig.made == []


def test_a_folder_without_deploy_json_is_said_before_paddles_import(tmp_path, without_paddle):
    done = without_paddle("-m", "paddle_dist.predict", str(tmp_path), "digit.png")
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: {tmp_path} holds no readable deploy.json; give a directory written by python -m paddle_dist.export")
