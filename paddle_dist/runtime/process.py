"""Per-process set-up, the same for every launch mode: device, process group, seeds, run dir.

Example:
    env = setup(cfg)            # idempotent: safe to call before building the model
    run_dir = make_run_dir(cfg, env)
"""

from __future__ import annotations

import contextlib
import io
import random
import signal
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist

from .. import compat
from . import env as envlib, protocol, variables as varlib
from ..security import attest, credentials
from . import determinism, monitor, gloocheck, netcheck, seedorder
from ..runs import commands, rundir
from ..runs.layout import Run
from .. import procfs
from ..sync.collectives import first_line
from ..errors import PeerFailure, UserError
from ..schema import Config

_ENV: Optional[envlib.DistEnv] = None


def setup(cfg: Config) -> envlib.DistEnv:
    """Detect this process, select its device, start the process group once, seed."""
    global _ENV
    if _ENV is None:
        env = envlib.detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend)
        if env.is_main and not env.supervised:       # a paddle_dist launcher has said it
            compat.warn_unsupported(_say)
        # A rank never outlives the launcher that started it. Paddle's spawn dies at once on
        # SIGTERM (no handler), as it would when a scheduler preempts the job: its ranks then
        # get SIGTERM too, a stop request (checkpoint, exit 75); a hung rank is ended by its
        # hang watchdog. paddle_dist's launcher forwards signals itself, so its ranks go with it.
        if env.supervised:
            procfs.die_with_parent()
        elif env.launcher in ("paddle_launch", "spawn"):
            procfs.die_with_parent(signal.SIGTERM)
        varlib.prepare_process_group(env, cfg.dist.nccl)
        _check_network(env, cfg)
        paddle.set_device(env.device)
        determinism.apply(cfg.train.deterministic, env.device)
        if env.is_distributed:
            # paddle.Model (hapi) calls init_parallel_env() again; since Paddle 2.5 that
            # second call returns the existing default group (parallel.py).
            store = "{}:{}".format(*varlib.store_endpoint())
            with quiet_paddle(), monitor.deadline(cfg.dist.rendezvous_timeout, _lost(env, cfg),
                                                 _status_file(env, cfg), env.global_rank, store, env.world_size):
                if env.global_rank != 0:
                    wait_for_store(*varlib.store_endpoint())
                try:
                    dist.init_parallel_env()
                except Exception as error:
                    _name_outsiders(env, error)
                    raise
            _attest(env, cfg)
        _ENV = env
    seed_everything(cfg.train.seed)
    return _ENV


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_for_store(host: str, port: int) -> None:
    """Return once rank 0's TCP store accepts connections. Paddle's store client sleeps 3 s
    after a refused connection, so a rank that starts before rank 0 listens would lose 3 s
    (half of all 2-rank start-ups here); polling first costs one extra connection. The
    rendezvous deadline around this bounds the wait."""
    while host:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.01)


def _name_outsiders(env: envlib.DistEnv, error: Exception) -> None:
    """The process group failed to form (Paddle's `error`): when something outside the job
    took part in gloo's connections here (gloocheck.py), end the rank for that (exit 6), in
    one line."""
    host, port = varlib.store_endpoint()
    try:
        seen = gloocheck.outsiders(host, port, env.world_size, env.global_rank, error=str(error))
    except Exception:        # noqa: BLE001  (never hide Paddle's own error behind the check's)
        seen = []
    if seen:
        line = f"rank {env.global_rank}: the process group did not form: {seen[0]}"
        print(f"{attest.SECURITY_LINE}{line}; the job was stopped (docs/security.md)", file=sys.stderr, flush=True)
        raise attest.SecurityError(line)


def _attest(env: envlib.DistEnv, cfg: Config) -> None:
    """With a job token (the launcher's, or dist.token_file), check that Paddle's store
    holds this job's ranks alone (attest.py), within dist.hang_timeout: a store that
    stops answering ends the rank with a line that says so."""
    token_file = env.token_file or cfg.dist.token_file
    if not token_file:
        return
    where = "{}:{}".format(*varlib.store_endpoint())
    attest.check(where, credentials.token(token_file), env.job or env.master, env.global_rank,
                 env.world_size, cfg.dist.hang_timeout or cfg.dist.rendezvous_timeout or 300.0)


def _check_network(env: envlib.DistEnv, cfg: Config) -> None:
    """For a master on another machine: fail now, clearly, if the configured interface is
    wrong or the master unreachable; and make gloo and NCCL use the interface that reaches
    it (dist.nccl.socket_ifname, exported already, wins for NCCL)."""
    host = env.master.rpartition(":")[0]
    if not env.is_distributed or not host or host == "localhost" or host.startswith("127."):
        return
    interface = netcheck.check(env.master, cfg.dist.nccl.socket_ifname)
    varlib.export({"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}, keep_existing=True)


def _lost(env: envlib.DistEnv, cfg: Config) -> str:
    return (f"rank {env.global_rank}: not all {env.world_size} ranks arrived within "
            f"{cfg.dist.rendezvous_timeout:g} s (master {env.master or '?'}); check that every rank "
            "was started with the same world size and master address, that the master is "
            "reachable from here, and that no rank failed at start (dist.rendezvous_timeout "
            "sets this limit)")


def _status_file(env: envlib.DistEnv, cfg: Config) -> Optional[Path]:
    """Where this rank's status goes, when the run directory is already known (it is when
    paddle_dist's launcher started the job)."""
    if not cfg.output.run_dir:
        return None
    return Run(cfg.output.run_dir).rank_status(env.global_rank)


def seed_everything(seed: int) -> None:
    """Same seed on every rank: identical initial weights (DataParallel also broadcasts
    rank 0's), identical data order from the distributed sampler. The first call keeps
    what a model built before it is named by (seedorder)."""
    seedorder.note_seed()
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)
    compat.note_seed(seed)


class _BannerFilter(io.TextIOBase):
    """Drops Paddle's 'Modified FLAGS detected' block; passes everything else through."""

    def __init__(self, target):
        self.target, self.skipping = target, False

    def write(self, text):
        if "Modified FLAGS detected" in text:
            self.skipping = True
        elif self.skipping and text.startswith("====="):
            self.skipping = False
        elif not self.skipping:
            self.target.write(text)
        return len(text)


@contextlib.contextmanager
def quiet_paddle():
    """Silence Paddle's banner and its internal to_tensor warnings (noise users cannot act on)."""
    with contextlib.redirect_stderr(_BannerFilter(sys.stderr)), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")
        yield


def make_run_dir(cfg: Config, env: envlib.DistEnv, identity: Optional[dict] = None) -> Path:
    """The run directory: the one paddle_dist's launcher chose for this machine's ranks;
    otherwise the one rank 0 chooses (rundir.choose: given, continued or new), agreed on by
    every rank. Rank 0 then holds the run until rundir.release() or its exit. `identity`:
    more of what makes the run this job (fit(): its model, optimizer and data).

    Under `python -m paddle_dist.launch`, rank 0 also tells the launcher where the run is
    (protocol.run_pointer), for its report and the command that continues the run; so does the
    first rank of every other machine, whose launcher reports from its own ranks' records."""
    pointer = protocol.run_pointer()
    if env.supervised and cfg.output.run_dir and not pointer:     # train.py's launcher chose it
        return rundir.chosen_by_launcher(cfg)

    def decide() -> str:
        choice = rundir.choose(cfg, env.world_size, commands.invoking_command(), extra=identity)
        if choice.note:
            print(f"paddle_dist: {choice.note}", flush=True)
        rundir.point_to(choice.path, pointer)
        return str(choice.path)

    path = Path(from_rank0(cfg, env, decide)).resolve()
    if not env.is_main:        # on this rank's machine: checked all the way, made when missing
        path = rundir.joined(path, cfg.output.share)
    if env.is_local_main and not env.is_main:
        rundir.point_to(path, pointer)
    return path


def from_rank0(cfg: Config, env: envlib.DistEnv, decide: Callable[[], Any]) -> Any:
    """`decide()`, run by rank 0 alone; its result is sent to every rank (the others wait,
    within dist.rendezvous_timeout). If it raises, every rank raises too: a UserError as
    it is (bad input is the same for all), anything else as itself on rank 0 and as a
    PeerFailure (a consequence) on the others.

    Example:
        state = from_rank0(cfg, env, lambda: checkpoint.load(path))
    """
    box: List[Any] = [None]
    failure: Optional[BaseException] = None
    if env.is_main:
        try:
            box = [(True, decide())]
        except UserError as exc:
            box = [(False, exc)]
        except Exception as exc:  # noqa: BLE001 - the other ranks must not wait for nothing
            failure = exc
            box = [(False, PeerFailure(f"rank 0 failed: {type(exc).__name__}: {first_line(exc)}"))]
    if env.is_distributed:
        with monitor.deadline(cfg.dist.rendezvous_timeout, _lost(env, cfg), _status_file(env, cfg),
                             env.global_rank):
            dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if failure is not None:
        raise failure
    if not ok:
        raise value
    return value
