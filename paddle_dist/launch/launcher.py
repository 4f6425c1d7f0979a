"""Start the processes of a job: `plan()` decides (pure), `launch()` acts.

Modes:
- `none`: run in this process: one rank, or processes already started outside
  (under `paddle.distributed.launch`, `spawn`, ...) so nothing is started twice;
- `launch`: on one machine, paddle_dist starts `python script args` N times itself, with
  the variables `paddle.distributed.launch` would give each rank (variables.rank_variables), each
  first admitted by the job's gate (rankgate.py), which tells it where the store is; across
  machines (`dist.nnodes` > 1), `python -m paddle.distributed.launch --nnodes ... script
  args` on each, whose HTTP rendezvous finds the other machines' ranks, after the machines
  met at paddle_dist's own rendezvous (rendezvous.py), which has a deadline where Paddle's has none;
- `spawn`: `paddle.distributed.spawn(fn, args, nprocs=N, gpus=ids, backend=...)`;
- `mpirun`: `mpirun -n N [--hostfile F] -x VAR ... python script args` (OpenMPI), the ranks
  then find themselves through OpenMPI's variables.

The ranks run a script (`python train.py args`) or, for a job started as a module
(`python -m paddle_dist.train`), that module (`python -m paddle_dist.train args`).

Example:
    p = plan(jobspec.resolve(cfg, script="train.py", script_args=sys.argv[1:]))
    if p.mode != "none":
        sys.exit(launch(p))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence, Tuple

from .. import config as configlib
from ..security import auth, credentials, private, rankgate
from . import jobprocs, mpirun, rendezvous, supervisor
from .jobspec import JobSpec, attempt_config
from .meeting import wait_for_machines
from ..security.rankgate import free_port  # noqa: F401  (here for the command line; rankgate needs it standalone)
from ..runs.topology import Meeting
from ..runtime import env as envlib, protocol, variables as varlib
from ..errors import DeviceError
from ..procfs import pid_alive
from ..schema import Config

# Paddle's INFO noise stays out of the user's terminal; our own output is unaffected.
QUIET_CHILD = {
    "GLOG_minloglevel": "2",
    "PYTHONWARNINGS": "ignore::UserWarning:paddle.utils.cpp_extension.extension_utils",
}
# A user's script keeps glog's WARNING lines: when a peer dies inside DataParallel's
# backward, the survivor's only line that says why before its SIGABRT is one
# ("W... backward.cc:697] While running Node (GradNodeAccumulation) raises a
# std::exception: gloo::IoException"). paddle_dist's ranks report a peer's failure
# themselves (PeerFailure).
SCRIPT_CHILD = {"GLOG_minloglevel": "1"}
PADDLE_LAUNCH = "paddle.distributed.launch"


@dataclass(frozen=True)
class LaunchPlan:
    """How an attempt runs (plan()): read-only, its `env` too; a changed plan is a new one
    (dataclasses.replace(p, env={**p.env, ...}))."""

    mode: str                           # none | launch | spawn | mpirun
    nprocs: int = 1
    gpus: Tuple[str, ...] = ()          # the ranks' GPUs, physical ids (JobSpec.devices)
    backend: str = "none"               # the process group's, resolved: gloo | nccl | none (one rank)
    argv: Tuple[str, ...] = ()          # launch, mpirun: the command to run (once per rank if direct)
    env: Mapping[str, str] = field(default_factory=dict)  # variables added for the children (read-only)
    log_dir: str = ""                   # launch, mpirun: the ranks' workerlog.N files
    direct: bool = False                # launch mode: paddle_dist starts the ranks itself
    selected: Tuple[str, ...] = ()      # direct: each rank's FLAGS_selected_gpus
    stop_timeout: float = 60.0          # after SIGTERM: time to save and stop before SIGKILL
    start_method: str = "spawn"         # spawn mode: multiprocessing's start method
    gate: Optional[rendezvous.MeetingPlace] = None   # multi-node launch: where the machines meet first
    token_file: str = ""                # direct, spawn: dist.token_file ("": a token made for the job)
    ports: Tuple[int, int] = (0, 0)     # direct: where the store's port is picked (variables.port_range)

    def __post_init__(self):
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))   # a copy no one can change


def plan(spec: JobSpec, attempt: int = 0, met: Optional[Meeting] = None, log_dir: str = "",
         always: bool = False) -> LaunchPlan:
    """Decide how to run an attempt of the job `spec` (jobspec.attempt_config: which config,
    on the machines that `met`). Pure: nothing starts.

    `always`: start processes even for one rank (a script cannot run in this process).
    The built-in job's ranks (`spec.builtin`) run the attempt's config, which the plan puts
    in their environment (protocol.JOB_CONFIG) instead of them reading their command line
    again; spawn's ranks get it as their entry's argument instead: one road each.

    Example:
        plan(JobSpec(cfg, varlib.host_facts(), DistEnv(), script="train.py")).argv
        # ('python', '-m', 'paddle.distributed.launch', '--nproc_per_node', '2', ..., 'train.py')
    """
    cfg = attempt_config(spec, attempt, met)
    env, environ, cpu_count = spec.here, spec.facts.environ, spec.facts.cores
    script, module, script_args = spec.script, spec.module, spec.script_args
    devices, mode = spec.devices, cfg.dist.launcher     # devices: resolved with the spec, once
    nprocs, gpus, visible = devices.nprocs, devices.gpus, devices.visible
    alone = nprocs == 1 and cfg.dist.nnodes == 1 and mode != "mpirun"
    if env.launcher != "standalone":          # its ranks are started already: run right here
        envlib.check_started_outside(cfg.dist.nprocs, env)
        return LaunchPlan(mode="none", nprocs=1, gpus=gpus, backend=env.backend)
    if alone and not always:                  # one process: run right here
        return LaunchPlan(mode="none", nprocs=1, gpus=gpus, backend=devices.backend)
    variables = dict(QUIET_CHILD, **{protocol.SUPERVISED: "1"})
    variables.update(varlib.worker_variables(cfg.dist.nccl, nprocs, cpu_count, environ))
    if spec.builtin and mode != "spawn":       # spawn hands it as its entry's argument
        variables.update(protocol.job_config(cfg.to_dict()))
    argv: Tuple[str, ...] = ()
    direct = mode == "launch" and cfg.dist.nnodes == 1
    if direct or (mode == "spawn" and cfg.dist.nnodes == 1):
        variables.update(varlib.loopback_variables(cfg.dist.nccl, environ))
    if mode == "spawn" and sys.version_info >= (3, 11):
        # multiprocessing starts each rank as `python -c ...`, which puts the working
        # directory first on sys.path until the parent's path replaces it.
        variables["PYTHONSAFEPATH"] = "1"
    if direct:     # each rank passes the job's gate first, then becomes the program (exec)
        argv = (sys.executable, "-S", rankgate.SCRIPT,
                sys.executable, *python_args(script, module), *script_args)
    elif mode == "launch":
        argv = launch_argv(nprocs, gpus, script, script_args, log_dir, nodes_of(cfg), module)
    elif mode == "mpirun":
        variables.update(mpirun.master_variables(cfg))
        argv = mpirun.mpirun_argv(nprocs, cfg.dist.hostfile, variables, python_args(script, module), script_args)
    # Paddle's launcher gives a rank its GPU's position among the visible ones.
    selected = tuple(str(visible.index(g)) for g in gpus) if direct else ()
    return LaunchPlan(mode=mode, nprocs=nprocs, gpus=gpus, backend=devices.backend,
                      argv=argv, env=variables, log_dir=log_dir, stop_timeout=cfg.dist.stop_timeout,
                      direct=direct, selected=selected,
                      token_file=cfg.dist.token_file if direct or mode == "spawn" else "",
                      ports=varlib.port_range(environ),
                      start_method=start_method(cfg.dist.start_method, gpus),
                      gate=gate_of(cfg, nprocs) if mode == "launch" and not direct else None)


def gate_of(cfg: Config, nprocs: int) -> Optional[rendezvous.MeetingPlace]:
    """Where the machines of a multi-node launch meet before Paddle's launcher starts."""
    d = cfg.dist
    if d.nnodes == 1:
        return None
    return rendezvous.MeetingPlace(d.master, d.nnodes, d.node_rank, nprocs, d.rendezvous_timeout,
                                   token_file=d.token_file, tls_ca=d.tls_ca, tls_cert=d.tls_cert, tls_key=d.tls_key,
                                   min_nodes=d.min_nnodes if d.min_nnodes < d.nnodes else 0,
                                   last_call=d.last_call, config=configlib.config_hash(cfg.to_dict()),
                                   config_keys=configlib.key_digests(cfg.to_dict()))


def python_args(script: str, module: str = "") -> Tuple[str, ...]:
    """What follows `python` on a rank's command line: `-m module` in safe-path mode
    (module_args) when the job runs a module, else the script, whose own directory Python
    puts first on sys.path, never the working directory. (A module's file is never run as
    a script: its directory would come first on sys.path, where the package's own module
    names shadow others.)

    Example:
        python_args("", "paddle_dist.train")     # ('-P', '-m', 'paddle_dist.train')
    """
    return module_args(module) if module else (script,)


# `python -m` puts the working directory first on sys.path: a yaml.py another user left in
# a shared working directory would run in every rank. Python 3.11+ leaves it out with -P;
# before, -c does the same: its '' (the working directory) is dropped before anything but
# the built-in sys is imported, and runpy then runs the module exactly as -m does.
_SAFE_MODULE = ("-P", "-m") if sys.version_info >= (3, 11) else (
    "-c", "import sys; del sys.path[0]; del sys.argv[0]; import runpy; runpy._run_module_as_main(sys.argv[0])")


def module_args(module: str) -> Tuple[str, ...]:
    """What follows `python` to run `module` as `python -m` does, without the working
    directory on sys.path (Python's safe-path mode).

    Example:
        module_args("paddle.distributed.launch")   # ('-P', '-m', 'paddle.distributed.launch') on 3.11+
    """
    return (*_SAFE_MODULE, module)


def start_method(chosen: str, gpus: Sequence[str]) -> str:
    """How spawn mode starts its processes. `fork` lets the ranks reuse the parent's
    `import paddle` (about a second each); CUDA cannot be used in a forked child, so GPU
    jobs default to `spawn`."""
    if chosen == "fork" and gpus:
        raise DeviceError("dist.start_method=fork cannot start GPU ranks (CUDA does not work in a "
                          "forked process); use -o dist.start_method=spawn or auto")
    if chosen != "auto":
        return chosen
    return "spawn" if gpus else "fork"


def nodes_of(cfg: Config) -> Tuple[str, ...]:
    """paddle.distributed.launch's multi-node options for `dist.nnodes` > 1."""
    d = cfg.dist
    if d.nnodes == 1:
        return ()
    # --host: Paddle's launcher guesses this machine's address from its hostname, and
    # when the guess is not the address the master is on, no node starts the master.
    host = ("--host", d.host) if d.host else ()
    return ("--master", d.master, "--nnodes", str(d.nnodes), "--rank", str(d.node_rank), *host)


def launch_argv(nprocs: int, gpus: Sequence[str], script: str, script_args: Sequence[str],
                log_dir: str = "", nodes: Sequence[str] = (), module: str = "") -> Tuple[str, ...]:
    # ERROR: Paddle's launcher then records each failed rank's exit code, which the
    # supervisor reads from its stderr file to report the real code or signal.
    argv = [sys.executable, *module_args(PADDLE_LAUNCH), "--nproc_per_node", str(nprocs),
            "--log_level", "ERROR", *nodes]
    if gpus:
        argv += ["--devices", ",".join(gpus)]
    if log_dir:
        argv += ["--log_dir", log_dir]
    return tuple(argv + [*_launched_program(script, module), *script_args])


def _launched_program(script: str, module: str) -> Tuple[str, ...]:
    """The "training script" for paddle.distributed.launch. It has no -m: it runs a `.py`
    file as `python -u file` and anything else as a program with the words after it
    (controllers/controller.py, `_get_entrypoint`, Paddle 2.6 to 3.3), so a module is run
    by naming the interpreter as the program, with the -u it gives scripts."""
    return (sys.executable, "-u", *module_args(module)) if module else (script,)


def launch(p: LaunchPlan, fn: Optional[Callable] = None, args: Sequence = (),
           run_dir: Optional[Path] = None, script: Optional[supervisor.UserScript] = None,
           met: Optional[rendezvous.Meeting] = None, log_dir: str = "") -> int:
    """Run the plan under supervision; return the job's exit code (the root cause's).
    `fn(*args)` is the spawn-mode entry; `run_dir` holds the ranks' status files;
    `script`: the ranks run a user's script (python -m paddle_dist.launch); `met`: what the
    machines of a multi-node launch learnt when they met, if they have met already
    (wait_for_machines()); the report names the ranks' hosts from it. `log_dir`: where the
    ranks' logs go, when known only now (in the run directory, named when the machines met).
    The built-in job's ranks get their config from the plan alone (plan: JobSpec.builtin)."""
    if log_dir:
        p = _logging_to(p, log_dir)
    with job_files(p.token_file) as (folder, token_file):
        private_env = {protocol.JOB_DIR: folder}
        if p.direct:
            with rankgate.RankGate(credentials.token(token_file), auth.nonce(), p.nprocs, ports=p.ports) as gate:
                child_env = varlib.child_environ(dict(p.env, **private_env, **gate.variables(token_file)))
                return supervisor.RankSupervision(list(p.argv), child_env, varlib.rank_variables(p.nprocs, p.selected),
                                                  run_dir, p.stop_timeout, Path(p.log_dir or "log"),
                                                  script=script).run()
        if p.mode in ("launch", "mpirun"):
            if p.gate is not None and met is None:
                code, met = wait_for_machines(p.gate)
                if code:
                    return code
            try:
                return supervisor.LaunchSupervision(list(p.argv), varlib.child_environ(dict(p.env, **private_env)),
                                                    run_dir, p.stop_timeout, Path(p.log_dir or "log"),
                                                    start_timeout=p.gate.timeout if p.gate else 0, meeting=met).run()
            finally:
                if met is not None and met.rendezvous is not None:
                    met.rendezvous.close()
        if p.mode == "spawn":      # no gate (spawn picks the store's port), but the ranks attest
            job = {protocol.TOKEN_FILE: token_file, protocol.JOB: auth.nonce(), **private_env}
            p = dataclasses.replace(p, env=dict(p.env, **job))
            return supervisor.SpawnSupervision(lambda: _start_spawn(p, fn, args), run_dir, p.stop_timeout).run()
    raise ValueError(f"plan mode {p.mode!r} starts no processes; run the worker directly")


def _logging_to(p: LaunchPlan, log_dir: str) -> LaunchPlan:
    """Plan `p` with its ranks' logs in `log_dir`: Paddle's launcher is told so first."""
    argv = p.argv
    if p.mode == "launch" and not p.direct:      # python -P -m paddle.distributed.launch ...
        at = argv.index(PADDLE_LAUNCH) + 1
        argv = argv[:at] + ("--log_dir", log_dir) + argv[at:]
    return dataclasses.replace(p, argv=argv, log_dir=log_dir)


@contextlib.contextmanager
def job_files(given_token: str = ""):
    """(the job's private directory, the path of its token file) while the job runs: the
    directory is made for this job alone (private.make_job_dir) and removed with all it
    holds when the job ends, with the shared memory its ranks' DataLoader workers left
    (private.note_worker); the token file is `given_token` (dist.token_file), else a
    token made for this job alone, in that directory."""
    folder = private.make_job_dir()
    try:
        token_file = given_token
        if not token_file:
            token_file = os.path.join(folder, "token")
            with os.fdopen(private.create(token_file), "w") as f:
                f.write(auth.new_token() + "\n")
        yield folder, token_file
    finally:
        gone = [pid for pid in private.noted_workers(folder) if not pid_alive(pid)]
        jobprocs.remove_segments(gone)      # what killed DataLoader workers left
        shutil.rmtree(folder, ignore_errors=True)


def _start_spawn(p: LaunchPlan, fn: Callable, args: Sequence):
    """Start the ranks with paddle.distributed.spawn (not joined: the supervisor watches).
    Returns spawn's context, which must stay alive while the ranks start: it owns the
    queues their arguments travel through."""
    import paddle.distributed as dist
    import paddle.distributed.fleet.launch  # noqa: F401  (creates the logger silenced below)

    old = varlib.export(p.env)  # spawn copies our environment into its children
    paddle_log = logging.getLogger("root")
    level = paddle_log.level
    try:
        options = {"gpus": ",".join(p.gpus)} if p.gpus else {}
        paddle_log.setLevel(logging.WARNING)   # spawn's "find free ports" INFO line
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Your model will be trained under CPUONLY")
            context = dist.spawn(fn, args=tuple(args), nprocs=p.nprocs, backend=p.backend,
                                 join=False, start_method=p.start_method, **options)
        return context
    finally:
        paddle_log.setLevel(level)
        varlib.restore(old)
