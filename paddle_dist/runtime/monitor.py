"""What each rank does so that failures are fast, named and survivable.

- A status file per rank, `<run>/status/rank<N>.json` (runs/status.py, RankStatus): pid,
  state (running, done, failed, refused, stopped, hung, preempted, diverged), step, phase,
  last progress time, and for a failure the exception and its traceback. Launchers read
  these to name the root cause. "refused" is a rank that ended on a user error (a config,
  a data sample, a checkpoint: errors.UserError): the run is not offered to be continued
  as it was.
- A hang watchdog: when no rank of the job has made progress for `dist.hang_timeout`
  seconds, the job is hung; the rank to blame (stopped, silent outside any collective, or
  in another collective than the rest: watchdog.judge) has its stack logged and recorded, and
  is stopped (reported as EXIT_HANG), with one line naming every rank's step and the
  collective it waits in. The watchdog is a process of its own (paddle_dist/runtime/_deadline.py)
  reading the ranks' heartbeats from shared memory, so a rank stuck in native code that
  holds the GIL is caught too; the stack comes from faulthandler, which needs no GIL.
- A deadline for the rendezvous: a rank whose peers never arrive is stopped with a
  message instead of waiting forever (SIGKILL from a watchdog process; launchers
  report EXIT_RENDEZVOUS).
- SIGTERM / SIGUSR1 request a stop (preemption): rank 0 saves a checkpoint at the next
  step and every rank exits with EXIT_PREEMPTED, so a scheduler can requeue the job.
- Fault injection (`faults.inject: KIND:RANK:STEP`, inject.py) for testing how failures
  end a job: the above, and a machine lost (lose) or ranks whose weights differ (perturb).
  The Monitor's step(), save_delay() and perturb() are where the trainer reaches it.

Example:
    monitor = Monitor(env, run_dir, cfg)
    with monitor.running():
        ... monitor.step(global_step) after every optimizer step ...
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from .. import procfs
from ..errors import EXIT_PREEMPTED, EXIT_RENDEZVOUS, exit_code_of
from ..runs import status
from ..runs.layout import Run
from ..security import credentials, private
from . import watchdog
from .inject import Injector
from .env import DistEnv

GLOO_TIMEOUT_S = 30.0    # gloo's fixed timeout of a collective: its TIMEOUT error then


def stop_watchdog(watchdog_proc: subprocess.Popen) -> None:
    """End a _deadline.py watchdog quietly and wait for it: a line on its stdin, then the
    pipe's end (which alone never comes while a forked child, such as a DataLoader
    worker, holds a copy of the pipe)."""
    with contextlib.suppress(OSError):      # a watchdog that has ended reads nothing
        watchdog_proc.stdin.write(b"stop\n")
        watchdog_proc.stdin.flush()
    with contextlib.suppress(OSError):
        watchdog_proc.stdin.close()
    watchdog_proc.wait()


def _exit_preempted(signum, frame) -> None:
    os._exit(EXIT_PREEMPTED)


def _ignore_stop_signals() -> None:
    for sig in (*stop_signals(), signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def stop_signals():
    return (signal.SIGTERM, signal.SIGUSR1)


class Heartbeat:
    """A rank's progress where its watchdog process, and its peers' on the same machine,
    read it: a few bytes of shared memory (watchdog.BEAT_FORMAT) in the job's private
    directory (watchdog.beat_path). Writing is one struct.pack_into, cheap enough for every
    step and every collective. `fd` stays open for the watchdog, which is handed it."""

    def __init__(self, folder: str, rank: int, progress: float):
        self.path = watchdog.beat_path(folder, rank, os.getpid())
        fd, made = tempfile.mkstemp(prefix=f".new-{os.getpid()}-", dir=folder)   # O_EXCL, 0600
        try:
            os.ftruncate(fd, watchdog.BEAT_SIZE)
            self.map = mmap.mmap(fd, watchdog.BEAT_SIZE)
        except BaseException:
            os.close(fd)
            os.unlink(made)
            raise
        self.fd = fd
        self.write(progress, 0, 0)
        os.replace(made, self.path)        # peers never read a beat before its first write

    def write(self, progress: float, step: int, epoch: int, collective: tuple = ()) -> None:
        """`collective`: (kind, number, size in bytes, since) while in one."""
        watchdog.pack(self.map, progress, step, epoch, *collective)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def beat_folder(env: DistEnv, run_dir) -> Tuple[str, bool]:
    """(the directory for this rank's heartbeat and stacks, whether its peers' are there
    too): the job's private directory (private.rank_dir, named by the job's token and run
    directory when no launcher made one), else one of this rank's own."""
    token = b""
    with contextlib.suppress(Exception):        # the rank's set-up has already said what is wrong with it
        token = credentials.token(env.token_file) if getattr(env, "token_file", "") else b""
    shared = private.rank_dir(private.key(token, str(Path(run_dir).resolve())), getattr(env, "job_dir", ""))
    return (shared, True) if shared is not None else (_own_folder(), False)


def _own_folder() -> str:
    """A private directory for this rank alone (removed by private.clean once it is gone)."""
    return tempfile.mkdtemp(prefix=f"paddle_dist-job-{os.geteuid()}-{os.getpid()}-", dir=private.base())


class Monitor:
    """This rank's status file, hang watchdog, stop requests and injected faults."""

    def __init__(self, env: DistEnv, run_dir: Optional[Path], hang_timeout: float = 0, fault: str = ""):
        self.env, self.hang_timeout = env, hang_timeout
        self.path = status.path_of(run_dir, env.global_rank) if run_dir else None
        self.log_path = str(Run(run_dir).rank_log(env.global_rank)) if run_dir else ""
        self.injector = Injector(fault, env.global_rank)
        self.step_no, self.epoch, self.phase_name = 0, 0, "setup"
        self.last_progress = time.monotonic()
        self.stop_asked = False
        self._written = 0.0
        self._heartbeat: Optional[Heartbeat] = None
        self.collectives = 0               # collectives entered so far (the same count on every rank)
        self._collective: tuple = ()       # (kind, number, size, since) while in one
        self._last_collective: tuple = ()  # the latest one left
        self.run_dir = run_dir
        self.folder, self.shared = "", False     # where the heartbeats are (beat_folder), once watched
        self.state = status.RUNNING            # how this rank ended, once finish() said it

    # ------------------------------------------------------------ life cycle
    @contextlib.contextmanager
    def running(self):
        """Install signal handlers and the hang watchdog for the duration of training."""
        old = {s: signal.signal(s, self._on_stop_signal) for s in stop_signals()}
        self.phase_name = "train"
        self._write(status.RUNNING, force=True)
        watchdog_proc = self._start_watchdog() if self.hang_timeout else None
        try:
            yield self
        finally:
            if watchdog_proc is not None:
                self._stop_watchdog(watchdog_proc)
            if self.state != status.PREEMPTED:     # a saved stop keeps ending with 75
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    def _start_watchdog(self) -> subprocess.Popen:
        """The hang watchdog process (module docstring), and faulthandler ready to write
        this rank's stacks for it on SIGUSR2. The watchdog is handed the heartbeat's and
        the stack file's descriptors: it never opens them by name."""
        if not self.folder:
            self.folder, self.shared = beat_folder(self.env, self.run_dir) if self.run_dir is not None else \
                (_own_folder(), False)
        self._heartbeat = Heartbeat(self.folder, self.env.global_rank, time.monotonic())
        self._beat()
        self._stacks = os.fdopen(private.create(f"{self._heartbeat.path}.stack"), "w")
        faulthandler.register(signal.SIGUSR2, file=self._stacks, all_threads=True)
        script = Path(__file__).with_name("_deadline.py")
        fds = (self._heartbeat.fd, self._stacks.fileno())
        return subprocess.Popen(
            [sys.executable, "-S", str(script), "--heartbeat", str(os.getpid()), self._heartbeat.path,
             str(self.hang_timeout), str(self.path or ""), str(self.env.global_rank),
             f"{self._heartbeat.path}.stack", self.log_path,
             self.folder if self.shared else "", str(self.env.world_size), *map(str, fds)],
            stdin=subprocess.PIPE, preexec_fn=os.setpgrp, pass_fds=fds)

    def _stop_watchdog(self, watchdog_proc: subprocess.Popen) -> None:
        stop_watchdog(watchdog_proc)
        faulthandler.unregister(signal.SIGUSR2)
        self._stacks.close()
        with contextlib.suppress(OSError):
            os.unlink(f"{self._heartbeat.path}.stack")
        self._heartbeat.close()
        self._heartbeat = None
        if not self.shared:
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)
            self.folder = ""

    def _beat(self) -> None:
        self.last_progress = time.monotonic()
        if self._heartbeat is not None:
            self._heartbeat.write(self.last_progress, self.step_no, self.epoch, self._collective)

    def _on_stop_signal(self, signum, frame):
        self.stop_asked = True

    def want_stop(self) -> bool:
        return self.stop_asked

    # ------------------------------------------------------------ progress
    def step(self, step: int, epoch: int) -> None:
        """Called after every optimizer step (`epoch`: the 0-based index of the epoch in
        progress): progress for the watchdog, then any injected fault."""
        self.step_no, self.epoch = step, epoch + 1    # 1-based, as the console prints it
        self._beat()
        self._write(status.RUNNING)
        self.injector.after_step(step, self._beat, self.want_stop)

    def save_delay(self, step: int) -> Optional[Callable[[], None]]:
        """The injected slow save, for the checkpoint of exactly that step (inject.py)."""
        return self.injector.save_delay(step)

    def perturb(self, model, step: int) -> None:
        """The injected perturb, after optimizer step `step` (inject.py): this rank's
        weights then differ from its peers'."""
        self.injector.perturb(model, step)

    def beat(self) -> None:
        """Progress that is not an optimizer step (an evaluation batch)."""
        self._beat()

    @contextlib.contextmanager
    def phase(self, name: str, kind: str = "", size: int = 0):
        """Mark time spent waiting for other ranks ("comm": a collective of `kind`, e.g.
        "all-reduce", moving `size` bytes): its heartbeat says which collective this rank
        waits in (watchdog.py). A collective inside a collective is the same wait."""
        if name == "comm" and self._collective:
            yield
            return
        previous, self.phase_name = self.phase_name, name
        if name == "comm":
            self.collectives += 1
            self._collective = (kind or "collective", self.collectives, size, time.monotonic())
        self._beat()
        try:
            yield
        finally:
            self.phase_name = previous
            if name == "comm":
                self._last_collective, self._collective = self._collective, ()
            self._beat()

    # ------------------------------------------------------------ outcomes
    def finish(self, state: str, error: Optional[BaseException] = None, message: str = "",
               **extra: Any) -> None:
        """Record how this rank ended: done | failed | refused | stopped | hung | preempted |
        diverged."""
        info = dict(extra)
        if error is not None:
            lines = [line for line in str(error).splitlines() if line.strip()]
            info |= {"error_type": type(error).__name__, "error": lines[0] if lines else "",
                    "exit_code": exit_code_of(error),
                    "traceback": "".join(traceback.format_exception(error))[-4000:]}
        if message:
            info["message"] = message
        held_up = self._held_up_by(error) if state == status.STOPPED else None
        if held_up:          # the root cause as this rank saw it: nobody's watchdog had fired
            state, info["message"] = status.HUNG, held_up
        self.state = state
        self._write(state, force=True, **info)
        if state == status.PREEMPTED:
            # Its checkpoint is saved: from now on a stop signal (srun or mpirun ending the
            # other ranks once one has exited, a second scancel) ends the rank at once with
            # 75, not with the signal's 143, so that the job asks to be requeued.
            for sig in (*stop_signals(), signal.SIGINT):
                signal.signal(sig, _exit_preempted)
            # Python puts its default back (death by the signal) for the signals it handles
            # when it finalizes, while Paddle's objects are still being torn down: ignored
            # from then on, they let the rank end with 75 by itself.
            atexit.register(_ignore_stop_signals)

    def _held_up_by(self, error: Optional[BaseException]) -> str:
        """When gloo gave up on a collective (its fixed GLOO_TIMEOUT_S, shorter than
        dist.hang_timeout), who held the job up, from the heartbeats (watchdog.judge); ''
        when that is not why this rank stopped, or no rank seen here is to blame (a peer
        on another machine that died also ends in gloo's TIMEOUT)."""
        if not self.shared or "TIMEOUT" not in str(getattr(error, "__cause__", None) or error):
            return ""
        if not self._last_collective:
            return ""
        # This rank as it was until gloo gave up: in that collective since it entered it.
        kind, count, size, since = self._last_collective
        me = watchdog.Beat(self.env.global_rank, os.getpid(), since, self.step_no, self.epoch,
                           kind, count, size, since)
        peers = [b for b in watchdog.read_beats(self.folder) if b.rank != me.rank]
        seconds = min(self.hang_timeout or GLOO_TIMEOUT_S, GLOO_TIMEOUT_S) * 0.8
        verdict = watchdog.judge(peers + [me], time.monotonic(), seconds, self.env.world_size)
        if verdict is None or not verdict.names_a_rank:     # a dead peer elsewhere times out too
            return ""
        return f"{verdict.message} (gloo gave up after {GLOO_TIMEOUT_S:g} s)"

    # ------------------------------------------------------------ status file
    def _write(self, state: str, force: bool = False, **extra: Any) -> None:
        if self.path is None:
            return
        now = time.time()
        if not force and now - self._written < 1.0:   # progress: at most once a second
            return
        self._written = now
        status.RankStatus.make(rank=self.env.global_rank, local_rank=self.env.local_rank,
                               host=socket.gethostname(), pid=os.getpid(), state=state, step=self.step_no,
                               epoch=self.epoch, phase=self.phase_name, time=now, log=self.log_path,
                               **extra).write(self.path)


@contextlib.contextmanager
def deadline(seconds: float, message: str, status_file: Optional[Path] = None, rank: int = 0,
             store: str = "", world: int = 0):
    """End this process with `message` and exit code EXIT_RENDEZVOUS (3) if the block is
    not done in `seconds`.

    Used around the rendezvous, where Paddle would otherwise wait forever for a peer. A
    separate watchdog process does it (paddle_dist/runtime/_deadline.py): Paddle holds the GIL
    while it waits, so no thread here could. It sends SIGQUIT, whose handler here is libc's
    `_exit` itself, set through ctypes: it needs no GIL, and `_exit(SIGQUIT)` is
    `_exit(3)` on Linux, so the shell sees 3 however the rank was started. The rank's
    status file, when given, records the failure for the launcher's report. `store`
    ("host:port" of Paddle's store) and `world`: where the watchdog looks for something
    outside the job that holds the rendezvous up (gloocheck.py), given the sockets this
    process holds now: a listener of gloo's is one opened later.
    """
    if not seconds:
        yield
        return
    script = Path(__file__).with_name("_deadline.py")
    previous = _exit_on_sigquit()
    held = ",".join(sorted(procfs.socket_inodes())) if store else ""
    watchdog_proc = subprocess.Popen([sys.executable, "-S", str(script), str(os.getpid()), str(seconds), message,
                                      str(status_file or ""), str(rank), store, str(world), held],
                                     stdin=subprocess.PIPE, preexec_fn=os.setpgrp)
    try:
        yield
    finally:
        watchdog_proc.stdin.close()            # done in time: the watchdog exits quietly
        watchdog_proc.wait()
        if previous is not None:
            _libc().signal(signal.SIGQUIT, previous)


def _libc():
    libc = ctypes.CDLL(None)
    libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p]
    return libc


def _exit_on_sigquit() -> Optional[int]:
    """Make SIGQUIT call libc's _exit(signal number) = _exit(3); return the handler it had
    (None where that is not possible: the watchdog then falls back to SIGKILL)."""
    if signal.SIGQUIT != EXIT_RENDEZVOUS:
        return None
    try:
        libc = _libc()
        return libc.signal(signal.SIGQUIT, ctypes.cast(libc._exit, ctypes.c_void_p).value) or 0
    except (OSError, AttributeError):
        return None
