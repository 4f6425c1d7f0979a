"""Unit tests for paddle_dist.launch.launcher: `plan()` decides how a job starts, without starting it.

No process is started here: `launch()` is only exercised with Popen / spawn replaced by fakes.
"""

import dataclasses
import os
import sys

import pytest

from paddle_dist import config as configlib
from paddle_dist.launch import launcher
from paddle_dist.launch.jobspec import JobSpec
from paddle_dist.security import rankgate
from paddle_dist.config import load
from paddle_dist.runtime.devices import GpuInfo, JobDevices
from paddle_dist.runtime.env import DistEnv, detect
from paddle_dist.runtime.variables import HostFacts
from paddle_dist.errors import ConfigError, DeviceError
from paddle_dist.launch.launcher import LaunchPlan, module_args, plan

from tests.conftest import environ_diff

CPU_BUILD = GpuInfo(False, 0)
FOUR_GPUS = GpuInfo(True, 4)
LAUNCH_PREFIX = (sys.executable, *module_args("paddle.distributed.launch"), "--nproc_per_node")


def job(cfg, env=None, info=CPU_BUILD, environ=None, cpu_count=8, script="train.py",
        script_args=("-o", "train.epochs=1"), **program) -> JobSpec:
    """The job `cfg`, from a standalone process, 8 cores, no user variables."""
    facts = HostFacts({} if environ is None else environ, info, cpu_count)
    return JobSpec(cfg, facts, env or DistEnv(), script=script, script_args=tuple(script_args), **program)


def make_plan(overrides=(), env=None, info=CPU_BUILD, always=False, log_dir="", **kwargs):
    """plan() for `-o overrides` (the job: `job()`)."""
    return plan(job(load(overrides=list(overrides)), env, info, **kwargs), always=always, log_dir=log_dir)


# ---------------------------------------------------------------- modes
def test_one_process_runs_here():
    p = make_plan(["dist.nprocs=1"])
    assert p == LaunchPlan(mode="none", nprocs=1, gpus=())
    assert p.argv == () and p.env == {}


def test_two_processes_on_one_machine_are_started_directly():
    p = make_plan(["dist.nprocs=2"])
    assert (p.mode, p.nprocs, p.gpus, p.direct) == ("launch", 2, (), True)
    assert p.argv == GATED + (sys.executable, "train.py", "-o", "train.epochs=1")   # once per rank
    assert p.selected == ()                    # CPU: no devices to pin
    assert p.log_dir == ""


def test_the_stores_port_is_picked_in_the_users_port_range():
    assert make_plan(["dist.nprocs=2"], environ={"PORT_RANGE": "20000:20999"}).ports == (20000, 20999)
    assert make_plan(["dist.nprocs=2"]).ports == (0, 0)          # the kernel's pick


def test_one_machine_keeps_gloo_and_nccl_on_loopback_unless_the_user_chose():
    p = make_plan(["dist.nprocs=2"])
    assert p.env["GLOO_SOCKET_IFNAME"] == p.env["NCCL_SOCKET_IFNAME"] == "lo"
    chosen = make_plan(["dist.nprocs=2", "dist.nccl.socket_ifname=eth0"], environ={"GLOO_SOCKET_IFNAME": "eth1"})
    assert "GLOO_SOCKET_IFNAME" not in chosen.env and chosen.env["NCCL_SOCKET_IFNAME"] == "eth0"
    across = make_plan(["dist.nprocs=2", "dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    assert "GLOO_SOCKET_IFNAME" not in across.env     # the rank picks the interface reaching the master


def test_several_machines_use_paddle_distributed_launch_exactly():
    p = make_plan(["dist.nprocs=2", "dist.nnodes=2", "dist.master=10.0.0.1:6170",
                   "dist.host=10.0.0.2", "dist.node_rank=1"], script="job.py",
                  script_args=["--flag", "x"], log_dir="logs")
    assert not p.direct
    assert p.argv == LAUNCH_PREFIX + ("2", "--log_level", "ERROR", "--master", "10.0.0.1:6170",
                                      "--nnodes", "2", "--rank", "1", "--host", "10.0.0.2",
                                      "--log_dir", "logs", "job.py", "--flag", "x")


# A rank started on one machine passes the job's gate (rankgate.py) before it becomes its program.
GATED = (sys.executable, "-S", rankgate.SCRIPT)


def test_launch_children_get_threads_nccl_settings_and_quiet_logs():
    p = make_plan(["dist.nprocs=2", "dist.nccl.socket_ifname=eth0", "dist.nccl.debug=WARN",
                   "dist.nccl.ib_disable=true", "dist.nccl.extra={NCCL_ALGO: Ring}"])
    assert p.env["OMP_NUM_THREADS"] == "4"          # 8 cores / 2 ranks
    assert p.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert p.env["NCCL_DEBUG"] == "WARN"
    assert p.env["NCCL_IB_DISABLE"] == "1"
    assert p.env["NCCL_ALGO"] == "Ring"
    assert p.env["GLOG_minloglevel"] == "2"


def test_users_omp_num_threads_is_not_overridden():
    p = make_plan(["dist.nprocs=2"], environ={"OMP_NUM_THREADS": "6"})
    assert "OMP_NUM_THREADS" not in p.env


def test_spawn_has_no_command_line():
    p = make_plan(["dist.nprocs=2", "dist.launcher=spawn", "dist.backend=gloo"])
    assert (p.mode, p.nprocs, p.argv, p.backend) == ("spawn", 2, (), "gloo")
    assert p.env["OMP_NUM_THREADS"] == "4"
    assert p.env["GLOG_minloglevel"] == "2"


def test_the_job_config_reaches_the_ranks_by_one_road():
    """The built-in job's config: in the ranks' environment for the launchers that start
    them as processes; spawn hands it as its entry's argument, so its ranks' environment
    holds no second, stale copy."""
    from paddle_dist.runtime import protocol

    given = load(None, ["dist.nprocs=2", "train.epochs=3"])
    launched = plan(job(given, builtin=True))
    spawned = plan(job(configlib.derived(given, {"dist.launcher": "spawn"}), builtin=True))
    assert launched.env[protocol.JOB_CONFIG] == protocol.job_config(given.to_dict())[protocol.JOB_CONFIG]
    assert spawned.mode == "spawn" and protocol.JOB_CONFIG not in spawned.env
    assert protocol.JOB_CONFIG not in plan(job(given)).env        # a user's script reads its -c/-o


def test_the_plan_carries_the_resolved_backend():
    assert make_plan(["dist.nprocs=2"]).backend == "gloo"
    assert make_plan(["dist.nprocs=2"], info=FOUR_GPUS).backend == "nccl"
    assert make_plan(["dist.nprocs=2", "dist.backend=gloo"], info=FOUR_GPUS).backend == "gloo"
    assert make_plan(["dist.nprocs=1"]).backend == "none"
    # A machine of two with one rank each: a job of two ranks.
    assert make_plan(["dist.nnodes=2", "dist.master=127.0.0.1:6170"]).backend == "gloo"


# ---------------------------------------------------------------- GPUs
def test_gpus_alone_set_the_number_of_processes():
    p = make_plan(["dist.gpus=0,1"], info=FOUR_GPUS)
    assert (p.mode, p.nprocs, p.gpus) == ("launch", 2, ("0", "1"))
    assert p.selected == ("0", "1")


def test_ranks_get_their_gpus_position_among_the_visible_ones():
    p = make_plan(["dist.gpus=5,7"], info=FOUR_GPUS, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert (p.gpus, p.selected) == (("5", "7"), ("1", "3"))


def test_gpus_and_matching_nprocs_agree():
    p = make_plan(["dist.gpus=2,3", "dist.nprocs=2"], info=FOUR_GPUS)
    assert (p.nprocs, p.gpus) == (2, ("2", "3"))


def test_spawn_with_gpus_keeps_the_ids():
    p = make_plan(["dist.gpus=1,2", "dist.launcher=spawn"], info=FOUR_GPUS)
    assert (p.mode, p.nprocs, p.gpus, p.argv) == ("spawn", 2, ("1", "2"), ())


def test_gpus_and_nprocs_that_disagree_are_a_device_error():
    with pytest.raises(DeviceError, match="--nprocs 3 does not match --gpus 0,1"):
        make_plan(["dist.gpus=0,1", "dist.nprocs=3"], info=FOUR_GPUS)


def test_gpus_are_checked_against_the_given_environ():
    with pytest.raises(DeviceError, match="GPU 1 is not visible"):
        make_plan(["dist.gpus=1"], info=FOUR_GPUS, environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    p = make_plan(["dist.gpus=5"], info=FOUR_GPUS, environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert p.gpus == ("5",)


def test_gpus_on_a_cpu_build_are_a_device_error():
    with pytest.raises(DeviceError, match="paddlepaddle-gpu"):
        make_plan(["dist.gpus=0,1"], info=CPU_BUILD)


# ---------------------------------------------------------------- never launch twice
@pytest.mark.parametrize("env", [
    DistEnv(launcher="paddle_launch", world_size=2, local_world_size=2),
    DistEnv(launcher="paddle_launch", global_rank=1, local_rank=1, world_size=2, local_world_size=2),
    DistEnv(launcher="spawn", world_size=2, local_world_size=2),
])
def test_inside_a_launched_job_nothing_is_launched_again(env):
    assert make_plan(["dist.nprocs=2"], env=env).mode == "none"
    assert make_plan(["dist.nprocs=2", "dist.launcher=spawn"], env=env).mode == "none"


def test_inside_a_launched_job_with_gpus_nothing_is_launched_again():
    env = DistEnv(launcher="paddle_launch", world_size=2, device="gpu:0", backend="nccl")
    p = make_plan(["dist.gpus=0,1"], env=env, info=FOUR_GPUS,
                  environ={"FLAGS_selected_gpus": "0"})
    assert p.mode == "none"


# ---------------------------------------------------------------- devices
def test_dist_nprocs_below_one_is_a_config_error():
    with pytest.raises(ConfigError, match="dist.nprocs must be >= 1"):
        make_plan(["dist.nprocs=0"])


def test_nccl_on_cpu_is_an_error():
    with pytest.raises(DeviceError, match="dist.backend=nccl needs GPUs"):
        make_plan(["dist.nprocs=2", "dist.backend=nccl"])


def test_spawn_without_gpus_on_a_gpu_machine_takes_visible_gpus():
    p = make_plan(["dist.nprocs=2", "dist.launcher=spawn"], info=FOUR_GPUS,
                  environ={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert (p.mode, p.gpus) == ("spawn", ("2", "3"))


# ---------------------------------------------------------------- purity
def test_plan_is_repeatable_and_leaves_os_environ_alone():
    before = dict(os.environ)
    cfg = load(overrides=["dist.nprocs=2", "dist.nccl.debug=INFO"])
    first = plan(job(cfg, environ=dict(os.environ)))
    second = plan(job(cfg, environ=dict(os.environ)))
    assert first == second
    assert environ_diff(before, os.environ) == []


def test_plan_does_not_modify_the_config():
    cfg = load(overrides=["dist.gpus=0,1"])
    before = cfg.to_dict()
    make_plan(["dist.gpus=0,1"], info=FOUR_GPUS)
    plan(job(cfg, info=FOUR_GPUS))
    assert cfg.to_dict() == before


def test_the_plan_takes_the_devices_resolved_with_the_spec():
    """JobSpec resolves the ranks, their GPUs and the backend once; plan() checks nothing again."""
    spec = job(load(overrides=["dist.nprocs=2"]))
    assert spec.devices == JobDevices(2, (), (), "gloo")
    given = dataclasses.replace(spec, devices=JobDevices(2, ("5", "7"), ("5", "6", "7"), "nccl"))
    p = plan(given)
    assert (p.nprocs, p.gpus, p.backend, p.selected) == (2, ("5", "7"), "nccl", ("0", "2"))


def test_the_plan_and_its_env_are_read_only_and_a_changed_plan_is_a_new_one():
    first = make_plan(["dist.nprocs=2"])
    with pytest.raises(TypeError):
        first.env["EXTRA"] = "1"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.nprocs = 3
    second = dataclasses.replace(first, env={**first.env, "EXTRA": "1"})
    assert second.env["EXTRA"] == "1" and "EXTRA" not in first.env
    with pytest.raises(TypeError):
        second.env["EXTRA"] = "2"
    assert "EXTRA" not in launcher.QUIET_CHILD


# ---------------------------------------------------------------- launch() with fakes
def _supervision(calls: list, code, started=lambda *args, **kwargs: None):
    """A stand-in for a supervisor.Supervision class: records what it was built with, and
    run() returns `code` (or what `started(*args)` returns, when not None)."""
    class Fake:
        def __init__(self, *args, **kwargs):
            calls.append(args)
            self.args, self.kwargs = args, kwargs

        def run(self):
            found = started(*self.args, **self.kwargs)
            return code if found is None else found
    return Fake


def test_launch_runs_the_argv_with_the_plan_env_under_the_supervisor(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(launcher.supervisor, "RankSupervision", _supervision(calls, 3))
    monkeypatch.setenv("PADDLE_DIST_TEST_PARENT", "kept")
    p = make_plan(["dist.nprocs=2", "dist.nccl.debug=INFO", "dist.stop_timeout=7"],
                  log_dir=str(tmp_path))
    assert launcher.launch(p, run_dir=tmp_path) == 3
    [(argv, child_env, ranks, run_dir, stop, log_dir)] = calls
    assert argv == list(p.argv) and run_dir == tmp_path and stop == 7 and log_dir == tmp_path
    assert [r["PADDLE_TRAINER_ID"] for r in ranks] == ["0", "1"]
    assert not any("PADDLE_MASTER" in r for r in ranks)     # the gate tells the admitted ranks
    assert child_env["PADDLE_DIST_GATE"].startswith("127.0.0.1:")
    token_file = child_env["PADDLE_DIST_TOKEN_FILE"]        # made for the job, gone after it
    assert not os.path.exists(token_file) and "PADDLE_DIST_TOKEN" not in child_env
    assert child_env["PADDLE_DIST_TEST_PARENT"] == "kept"   # the parent's environment...
    assert child_env["NCCL_DEBUG"] == "INFO"                # ...plus the plan's variables
    assert child_env["OMP_NUM_THREADS"] == "4"
    assert child_env["PADDLE_DIST_SUPERVISED"] == "1"
    assert "NCCL_DEBUG" not in os.environ or os.environ["NCCL_DEBUG"] != "INFO"


def test_mpirun_ranks_do_not_inherit_the_launchers_flags_selected_gpus(monkeypatch, tmp_path):
    # mpirun hands its whole environment to the ranks on its machine, which pick their GPU
    # by local rank: an inherited FLAGS_selected_gpus=0 would leave local rank 1 without gpu:1.
    calls = []
    monkeypatch.setattr(launcher.supervisor, "LaunchSupervision", _supervision(calls, 0))
    monkeypatch.setenv("FLAGS_selected_gpus", "0")
    p = make_plan(["dist.nprocs=2", "dist.launcher=mpirun", "dist.master=127.0.0.1:6170"],
                  info=FOUR_GPUS, log_dir=str(tmp_path))
    assert launcher.launch(p, run_dir=tmp_path) == 0
    [(argv, child_env, *_)] = calls
    assert "FLAGS_selected_gpus" not in child_env
    rank1 = dict(child_env, OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                 OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2")
    rank1.pop("CUDA_VISIBLE_DEVICES", None)
    assert detect(gpu_info=FOUR_GPUS, environ=rank1).device == "gpu:1"


class _Context:
    processes = []


def _run_spawn_plan(monkeypatch, p, fake_spawn):
    import paddle.distributed as dist

    monkeypatch.setattr(dist, "spawn", fake_spawn)
    monkeypatch.setattr(launcher.supervisor, "SpawnSupervision",
                        _supervision([], 9, lambda start, run_dir, stop: 0 if start() is _Context else None))
    return launcher.launch(p, print, ("x",))


def test_launch_spawn_exports_the_plan_env_only_while_spawning(monkeypatch):
    seen = {}

    def fake_spawn(fn, args=(), nprocs=1, backend=None, join=True, **options):
        seen.update(fn=fn, args=args, nprocs=nprocs, backend=backend, options=options, join=join,
                    debug=os.environ.get("NCCL_DEBUG"))
        return _Context

    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    p = make_plan(["dist.nprocs=2", "dist.launcher=spawn", "dist.nccl.debug=INFO"])
    assert _run_spawn_plan(monkeypatch, p, fake_spawn) == 0
    assert seen == dict(fn=print, args=("x",), nprocs=2, backend="gloo",
                        options={"start_method": "fork"}, join=False, debug="INFO")
    assert "NCCL_DEBUG" not in os.environ


def test_launch_spawn_passes_gpus_and_picks_nccl(monkeypatch):
    seen = {}
    p = make_plan(["dist.gpus=1,2", "dist.launcher=spawn"], info=FOUR_GPUS)
    _run_spawn_plan(monkeypatch, p, lambda fn, **kw: seen.update(kw) or _Context)
    assert (seen["nprocs"], seen["backend"], seen["gpus"]) == (2, "nccl", "1,2")
    assert seen["start_method"] == "spawn"       # CUDA cannot be used in a forked child


def test_spawn_forks_on_cpu_unless_told_otherwise():
    assert make_plan(["dist.nprocs=2", "dist.launcher=spawn"]).start_method == "fork"
    chosen = make_plan(["dist.nprocs=2", "dist.launcher=spawn", "dist.start_method=forkserver"])
    assert chosen.start_method == "forkserver"


def test_fork_with_gpus_is_a_device_error():
    with pytest.raises(DeviceError, match="dist.start_method=spawn"):
        make_plan(["dist.gpus=1,2", "dist.launcher=spawn", "dist.start_method=fork"], info=FOUR_GPUS)


def test_launch_refuses_a_plan_that_starts_nothing():
    with pytest.raises(ValueError, match="starts no processes"):
        launcher.launch(make_plan(["dist.nprocs=1"]))


def test_one_gpu_runs_in_this_process():
    # The worker then selects the device itself (env.select_device: gpu:3 here).
    p = make_plan(["dist.gpus=3"], info=FOUR_GPUS)
    assert (p.mode, p.nprocs, p.gpus, p.argv) == ("none", 1, ("3",), ())


def test_always_launches_a_single_script_process_with_its_gpu():
    p = make_plan(["dist.gpus=2"], info=FOUR_GPUS, always=True)
    assert (p.mode, p.nprocs, p.direct) == ("launch", 1, True)
    assert p.selected == ("2",)


# ---------------------------------------------------------------- `python -m paddle_dist.train`
# A job started as a module has ranks that run the module: `python -m paddle_dist.train`,
# never the module's file as a script (its directory would come first on sys.path).
MODULE = module_args("paddle_dist.train")


def test_a_module_job_starts_its_ranks_as_the_module():
    p = make_plan(["dist.nprocs=2"], script="", module="paddle_dist.train")
    assert p.direct and p.argv == GATED + (sys.executable, *MODULE, "-o", "train.epochs=1")


def test_a_module_job_across_machines_has_paddles_launcher_run_the_interpreter():
    """paddle.distributed.launch has no -m: its "training script" is the interpreter,
    with the -u it gives a .py script."""
    p = make_plan(["dist.nprocs=2", "dist.nnodes=2", "dist.master=10.0.0.1:6170",
                   "dist.host=10.0.0.2", "dist.node_rank=1"], script="", module="paddle_dist.train",
                  log_dir="logs")
    assert p.argv == LAUNCH_PREFIX + ("2", "--log_level", "ERROR", "--master", "10.0.0.1:6170",
                                      "--nnodes", "2", "--rank", "1", "--host", "10.0.0.2",
                                      "--log_dir", "logs", sys.executable, "-u", *MODULE,
                                      "-o", "train.epochs=1")


def test_paddles_launcher_turns_the_module_argv_into_the_ranks_command(monkeypatch):
    """The installed Paddle's own parser and entry point, fed the argv above: each rank
    runs `python -u -m paddle_dist.train args` (a .py script would get `python -u script`)."""
    from types import SimpleNamespace

    from paddle.distributed.launch.context.args_envs import parse_args
    from paddle.distributed.launch.controllers.controller import Controller

    p = make_plan(["dist.nprocs=2", "dist.nnodes=2", "dist.master=10.0.0.1:6170",
                   "dist.node_rank=1"], script="", module="paddle_dist.train")
    monkeypatch.setattr(sys, "argv", ["launch", *p.argv[len(LAUNCH_PREFIX) - 1:]])
    args, unknown = parse_args()
    assert unknown == [] and str(args.nproc_per_node) == "2" and args.nnodes == "2"
    entry = Controller._get_entrypoint(SimpleNamespace(ctx=SimpleNamespace(args=args)))
    assert entry == [sys.executable, "-u", *MODULE, "-o", "train.epochs=1"]


def test_a_module_job_under_mpirun_runs_the_module():
    p = make_plan(["dist.nprocs=2", "dist.launcher=mpirun", "dist.master=127.0.0.1:6170"],
                  script="", module="paddle_dist.train")
    assert p.argv[:3] == ("mpirun", "-n", "2")
    assert p.argv[-3 - len(MODULE):] == (sys.executable, *MODULE, "-o", "train.epochs=1")


def test_a_script_job_is_unchanged_by_the_module_option():
    assert launcher.python_args("train.py") == ("train.py",)
    assert launcher.python_args("", "paddle_dist.train") == MODULE
    p = make_plan(["dist.nprocs=2", "dist.launcher=mpirun", "dist.master=127.0.0.1:6170"])
    assert p.argv[-4:] == (sys.executable, "train.py", "-o", "train.epochs=1")
