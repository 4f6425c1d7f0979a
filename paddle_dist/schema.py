"""The config schema: every key, its type, its default and what it means (the comment beside
it), and the tables the checks use (choices, ranges, which model fits which data). What
loading, merging and checking do with it is config.py's.

Example:
    Config().train.epochs      # -> 5
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

# Keys a run and its resume may differ in without training anything differently: where
# and how the job is started, watched and written, and how long it runs. (The world
# size, part of dist, is checked on its own when a checkpoint is loaded.)
VOLATILE_KEYS = ("output", "checkpoint", "faults", "dist", "train.epochs", "train.max_steps",
                 "train.log_every", "train.eval_every_steps")


def _config_dir() -> Path:
    """Where the bundled YAML configs are: `paddle_dist/configs/` in an installed package
    (setup.cfg ships the checkout's configs/ under that name), else the checkout's
    `configs/` beside the package (an editable install, or the repository on sys.path).
    The installed place is tried first: a site-packages/configs of someone else's must not win.

    Example:
        _config_dir() / "mnist_lenet.yaml"   # .../paddle_dist/configs/mnist_lenet.yaml, installed
    """
    package = Path(__file__).resolve().parent
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


CONFIG_DIR = _config_dir()
DEFAULT_CONFIG = "mnist_lenet"


@dataclass(frozen=True)
class DataConfig:
    name: str = "mnist"            # mnist | cifar10 | imagefolder | synthetic | linear
    root: str = ""                 # mnist: IDX directory; "" = the bundled 4,000/1,000 subset.
                                   # cifar10: cifar-10-python.tar.gz, cifar-10-batches-py/ or
                                   # cifar-10-batches-bin/ (or a directory holding one); "" =
                                   # Paddle's cache (~/.cache/paddle/dataset/cifar), downloaded once
    augment: bool = True           # training images: cifar10 random crop (4-pixel padding) + flip;
                                   # imagefolder random flip
    image_size: int = 32           # imagefolder: shorter side resized to this, centre-cropped square
    mean: str = "0.485,0.456,0.406"  # imagefolder: per-channel (RGB) mean and std after scaling
    std: str = "0.229,0.224,0.225"   # to [0, 1] (one number: every channel)
    num_samples: int = 4096        # synthetic / linear: training samples (synthetic images
                                   # take the model's input shape: 1x28x28, or 3x32x32 for resnets)
    num_eval_samples: int = 1024   # synthetic / linear: evaluation samples
    seed: int = 0                  # synthetic / linear: data generator seed
    batched: bool = True           # in-memory datasets: gather each batch with one indexing op
                                   # (false: paddle.io.DataLoader, per-sample __getitem__ + collate)
    num_workers: int = 0           # DataLoader worker processes per rank for datasets read per
                                   # sample (a DataLoader given to fit() keeps its own)


@dataclass(frozen=True)
class ModelConfig:
    name: str = "lenet"            # lenet | mlp | linear | resnet18 (CIFAR form: 3x3 stem, no
                                   # max-pool) | resnet50 (paddle.vision's)
    num_classes: int = 0           # 0 = the data's: 10, or imagefolder's class folders


@dataclass(frozen=True)
class TrainConfig:
    api: str = "loop"              # loop (manual DataParallel) | hapi (paddle.Model.fit)
    epochs: int = 5                # 0: evaluate only (see eval_only)
    eval_only: bool = False        # evaluate checkpoint.resume's checkpoint on the test set on
                                   # every rank (exact counts), write metrics.json, train nothing
    batch_size: int = 64           # per rank; the global batch is batch_size * world_size
    eval_batch_size: int = 500     # per rank
    optimizer: str = "adam"        # adam | sgd | momentum
    lr: float = 0.001              # for lr_reference_batch samples per step (see lr_scaling)
    lr_scaling: str = "none"       # linear | sqrt | none: lr x (global batch / lr_reference_batch),
                                   # or its square root; global batch = batch_size x ranks x accumulate_steps
    lr_reference_batch: int = 256  # the global batch `lr` was tuned for
    warmup_epochs: float = 0.0     # ramp the lr linearly from lr/steps up to its value over these epochs
    lr_schedule: str = "constant"  # constant | cosine (to 0 at the last step) | step
    lr_milestones: str = ""        # step: epochs after which the lr is multiplied by lr_gamma, e.g. "30,60"
    lr_gamma: float = 0.1
    scheduler_every: str = "step"  # step | epoch: when the optimizer's own LRScheduler (if it has
                                   # one) is stepped: after every optimizer step (with
                                   # accumulate_steps=k once per k micro-batches) or after every
                                   # epoch, as hapi's paddle.callbacks.LRScheduler(by_step/by_epoch)
    amp: str = "off"               # off | O1 (autocast per op) | O2 (16-bit weights, fp32 master copy)
    amp_dtype: str = "auto"        # auto (float16) | float16 | bfloat16 (compute capability 8.0+): GPU/XPU
                                   # only; on CPU Paddle's bfloat16 autocast leaves matmul and Linear in
                                   # float32, so train.amp is refused there (trainer/amp.py)
    loss_scale: float = 32768.0    # float16: initial dynamic loss scale (bfloat16 needs none)
    weight_decay: float = 0.0
    clip_grad_norm: float = 0.0    # clip the gradients to this global norm (paddle.nn.ClipGradByGlobalNorm;
                                   # the config's optimizer) and log the norm; 0 = no clipping
    ema_decay: float = 0.0         # keep an exponential moving average of the whole state (weights and
                                   # BatchNorm statistics), e.g. 0.9998, used for evaluation, the best
                                   # checkpoint and export; 0 = off
    log_samples: bool = False      # write <run>/samples.tsv: each optimizer step's digest of its sample
                                   # indices over all ranks (the same at any world size), to compare runs
    ema_warmup: bool = True        # the average's decay warms up as min(decay, (1+n)/(10+n)) after n
                                   # updates (PaddleDetection's ModelEMA); false: decay from the start
    eval_loss: bool = True         # evaluation computes the loss too; false: the metrics alone, as
                                   # suites evaluate (outputs or labels the loss cannot take)
    deterministic: bool = True     # GPUs: deterministic cuDNN and embedding kernels, so that a continued
                                   # run is bitwise the uninterrupted one (runtime/determinism.py)
    shuffle: bool = True           # order = Paddle's DistributedBatchSampler, seeded by epoch
    drop_last: bool = False
    group_by_length: bool = False  # batches of samples of similar length (less padding), dealt out by
                                   # the data plan like any batches (trainer/grouping.py)
    seed: int = 2024               # weights and every other random draw
    max_steps: int = 0             # the run's optimizer steps (a suite's `iters`), over as many epochs
                                   # as they fill; 0 = train.epochs whole epochs
    eval_every_steps: int = 0      # evaluate (best checkpoint, early stopping, checkpoint.monitor)
                                   # every N optimizer steps, mid-epoch too, instead of every epoch
    accumulate_steps: int = 1      # micro-batches of batch_size per optimizer step; gradients
                                   # are communicated once per optimizer step
    early_stop_patience: int = 0   # stop after this many evaluations without a better
                                   # checkpoint.monitor value; 0 = never
    log_every: int = 20            # steps between progress lines
    loss_count: str = "none"       # none: the loss is a per-sample mean (or returns {"loss": mean,
                                   # "count": n} itself); labels: the model's loss is its mean over the
                                   # labels that are not ignore_index (PaddleFormers'), which are counted:
                                   # each step then trains on Σ sums / Σ counts (trainer/weighting.py)
    ignore_index: int = -100       # train.loss_count=labels: the label that is not counted (padding)


@dataclass(frozen=True)
class NcclConfig:
    socket_ifname: str = ""        # NCCL_SOCKET_IFNAME, e.g. "eth0" or "^lo,docker"
    ib_hca: str = ""               # NCCL_IB_HCA, e.g. "mlx5_0,mlx5_1"
    ib_disable: Optional[bool] = None   # NCCL_IB_DISABLE
    p2p_disable: Optional[bool] = None  # NCCL_P2P_DISABLE
    debug: str = ""                # NCCL_DEBUG: WARN | INFO | TRACE
    debug_subsys: str = ""         # NCCL_DEBUG_SUBSYS, e.g. "INIT,NET"
    extra: Dict[str, str] = field(default_factory=dict)  # any other NCCL_* variable


@dataclass(frozen=True)
class DistConfig:
    nprocs: Optional[int] = None   # processes on this machine (default: one per dist.gpus id, else 1);
                                   # > 1 makes train.py launch them
    launcher: str = "launch"       # launch (python -m paddle.distributed.launch) | spawn | mpirun
    start_method: str = "auto"     # spawn launcher: auto (fork on CPU: the ranks reuse this
                                   # process's `import paddle`; spawn on GPU, as CUDA needs) |
                                   # spawn | fork | forkserver
    nnodes: int = 1                # machines in the job (launch mode: each runs train.py once);
                                   # MIN:MAX (e.g. 1:2, quoted in YAML) sets min_nnodes too
    min_nnodes: int = 0            # elastic: the fewest machines the job may start or restart on
                                   # (a lost machine: dist.max_restarts); 0 = all of nnodes
    last_call: float = 30.0        # elastic: once min_nnodes machines have met, seconds to wait
                                   # for the others before going on without them
    node_rank: int = 0             # this machine's index, 0 .. nnodes-1
    master: str = ""               # host:port of node 0's rendezvous; needed when nnodes > 1
    host: str = ""                 # this machine's address as the others see it; "" = the
                                   # local address of the route to the master
    hostfile: str = ""             # mpirun: OpenMPI hostfile ("HOST slots=N" lines)
    token_file: str = ""           # multi-node: a 0600 file with the job's token, the same on every
                                   # machine; only machines that prove it meet (docs/multinode.md)
    tls_ca: str = ""               # multi-node: PEM file of the CA that signs every machine's
                                   # certificate; with tls_cert and tls_key (all three or none)
                                   # the machines meet over mutual TLS 1.3 (docs/security.md)
    tls_cert: str = ""             # this machine's PEM certificate, signed by tls_ca; node 0's
                                   # must name dist.master's host (subjectAltName IP: or DNS:)
    tls_key: str = ""              # tls_cert's private key, PEM, unencrypted, in a 0600 file
    gpus: str = ""                 # e.g. "0,1": physical ids, as in CUDA_VISIBLE_DEVICES
    backend: str = "auto"          # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    rendezvous_timeout: float = 120.0  # seconds to wait for every rank to arrive; 0 = forever
    hang_timeout: float = 300.0    # no rank progressing this long is a hang (docs/faults.md); 0 = off
    isolate: bool = False          # one machine: the job in a network namespace of its own (loopback
                                   # only): no other user sees or reaches its store, gloo or gate;
                                   # nor has the job any network beyond itself (docs/security.md)
    stop_timeout: float = 60.0     # after SIGTERM, seconds the ranks get to save and stop before SIGKILL
    max_restarts: int = 0          # restart a failed job from its latest checkpoint up to N times
    nccl: NcclConfig = field(default_factory=NcclConfig)


@dataclass(frozen=True)
class SyncConfig:
    mode: str = "auto"             # overlap: buckets all-reduced during backward() as they fill |
                                   # fused: one exchange at the optimizer step | auto: on CPUs fused
                                   # when every rank is on this machine (shared memory), else
                                   # overlap; on GPUs dataparallel | dataparallel: Paddle's reducer
    transport: str = "auto"        # CPU: auto (shm on one machine, hierarchical across machines
                                   # with several ranks each, else backend) | shm | hierarchical
                                   # (shm within a host + backend between hosts) | backend (the
                                   # process group's all-reduce: gloo, NCCL)
    bucket_mb: float = 0.0         # cap on one buffer in MiB; 0 = the mode's default: one buffer
                                   # (fused), 25 (overlap; small models: ~4 buckets)
    compress: str = "none"         # none | bf16 | fp16: all-reduce gradients in 16 bits
                                   # over the backend (half the bytes; approximate, opt-in)
    find_unused_parameters: bool = True  # mode dataparallel: Paddle's reducer averages the
                                   # gradients of parameters some rank's batch did not reach (an
                                   # extra all-reduce per step); false is faster for models that use
                                   # every parameter, and the ranks' weights check (exit 7) catches
                                   # one that does not. The other modes always do it, at no cost


@dataclass(frozen=True)
class CheckpointConfig:
    every_epochs: int = 1          # 0 = never
    every_steps: int = 0           # also every N optimizer steps (mid-epoch); 0 = never
    keep_last: int = 3
    resume: str = "auto"           # auto (latest in this run dir, if any) | none | a checkpoint path
    monitor: str = "eval_accuracy" # the metric that picks <run>/best and early stopping:
                                   # eval_accuracy | eval_loss | train_loss | eval_<name> of a
                                   # fit(metrics=...) metric; higher is better except for names
                                   # ending in loss or error (fit() with metrics and no accuracy:
                                   # the first metric's)
    save_best: bool = True         # keep the best epoch's checkpoint in <run>/best


@dataclass(frozen=True)
class OutputConfig:
    root: str = "runs"             # runs go to <root>/<name>-<timestamp>
    name: str = ""                 # "" = the config file's stem
    run_dir: str = ""              # explicit run directory; must not hold a finished run
    share: str = "private"         # who else may read the run: private (its directory 0700, the
                                   # job's files made under umask 077) | group (0750, umask 027)


@dataclass(frozen=True)
class FaultsConfig:
    inject: str = ""               # testing: KIND:RANK:STEP, KIND one of FAULT_KINDS


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "model.name": ("lenet", "mlp", "linear", "resnet18", "resnet50"),
    "train.api": ("loop", "hapi"),
    "train.optimizer": ("adam", "sgd", "momentum"),
    "dist.launcher": ("launch", "spawn", "mpirun"),
    "dist.start_method": ("auto", "spawn", "fork", "forkserver"),
    "dist.backend": ("auto", "gloo", "nccl"),
    "sync.mode": ("auto", "overlap", "fused", "dataparallel"),
    "sync.compress": ("none", "bf16", "fp16"),
    "train.lr_scaling": ("none", "linear", "sqrt"),
    "train.lr_schedule": ("constant", "cosine", "step"),
    "train.scheduler_every": ("step", "epoch"),
    "train.loss_count": ("none", "labels"),
    "train.amp": ("off", "O1", "O2"),
    "train.amp_dtype": ("auto", "float16", "bfloat16"),
    "output.share": ("private", "group"),
}
# What each built-in model and dataset is for (the model picks its loss and metric).
MODEL_TASKS = {"linear": "regression", "mlp": "classification", "lenet": "classification",
               "resnet18": "classification", "resnet50": "classification"}
# One sample's shape for each model, and for each dataset with a fixed shape (synthetic
# images take their model's).
MODEL_INPUTS = {"linear": (10,), "mlp": (1, 28, 28), "lenet": (1, 28, 28),
                "resnet18": (3, 32, 32), "resnet50": (3, 32, 32)}
ANY_SIZE_MODELS = ("resnet18", "resnet50")     # 3-channel images of any size (8 px and up)
POSITIVE = ("data.image_size", "train.batch_size", "train.eval_batch_size", "train.log_every",
            "data.num_samples", "data.num_eval_samples")
POSITIVE += ("dist.nnodes", "train.accumulate_steps", "train.lr_reference_batch", "train.loss_scale")
NON_NEGATIVE = ("train.clip_grad_norm", "train.ema_decay", "data.num_workers", "model.num_classes", "train.epochs", "dist.node_rank", "train.max_steps", "train.weight_decay", "checkpoint.every_epochs",
                "train.warmup_epochs", "train.lr_gamma", "train.early_stop_patience",
                "checkpoint.every_steps", "checkpoint.keep_last", "dist.rendezvous_timeout",
                "dist.hang_timeout", "dist.stop_timeout", "dist.max_restarts", "sync.bucket_mb",
                "dist.min_nnodes", "dist.last_call", "train.eval_every_steps")
FAULT_KINDS = ("raise", "exit", "kill", "hang", "nativehang", "slowsave", "slow",
               "perturb", "term", "interrupt", "lose")   # faults.inject (runtime/inject.py)
