"""Watch the ranks of a job from the process that started them, and explain its end.

- Each rank's exit is seen the moment it happens (a thread waits on each process), so
  the first rank to fail is known by the order of the exits, not by a poll that may see
  two at once. The launcher remembers which processes it signalled itself: those are
  never the root cause.
- When a rank fails, what is left of it (its DataLoader workers, which hold its
  connections open and keep the peers waiting) is killed at once; the other ranks get
  time to notice, then SIGTERM, then a grace period to clean up, then SIGKILL. No
  process of the job is left behind, nor its shared memory in /dev/shm.
- Ctrl+C stops every rank at once; SIGTERM / SIGUSR1 ask the ranks to save a checkpoint
  and stop (preemption), and whatever has not stopped after `dist.stop_timeout` is killed.
- The end of a failed job is explained once (outcome.py, report.py): which rank failed
  first and how, and the ranks stopped as a consequence. The job's exit code is the root
  cause's, not the launcher's.
- Rank 0's output goes to this terminal as it comes (console.py), every rank's to its log.

One interface for every way ranks start (Supervision: start, wait, close): Paddle's
launcher as the one child (LaunchSupervision), the ranks as children of their own
(RankSupervision), paddle.distributed.spawn's (SpawnSupervision). Each returns a typed
JobResult (outcome.py), which the report reads once.

Example:
    code = LaunchSupervision(plan.argv, child_env, run_dir, 60, Path("log")).run()
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .console import Console, tee
from .jobprocs import Ranks, place_of, remove_segments, signal_pids
from .outcome import JobResult, global_ranks, launcher_exit_codes, machines_of, pointed_run, report
from ..procfs import children_of, die_with_parent
from ..runs.report import POLL_S
from ..runs.topology import Meeting
from ..security import ownpath

GRACE_S = 5.0            # paddle_dist's ranks: time to notice a peer's failure themselves;
                         # every job: time to stop after Ctrl+C before SIGKILL
SCRIPT_NOTICE_S = 1.0    # a user's script: time to fail by itself (its own message) before SIGTERM
SCRIPT_GRACE_S = 5.0     # a user's script: time between SIGTERM and SIGKILL


@dataclass(frozen=True)
class UserScript:
    """A user's script under `python -m paddle_dist.launch`, rather than paddle_dist's ranks:
    `command` runs the job again; `run_pointer` is where its fit() (rank 0) writes the run
    directory it chose, if it keeps one."""
    command: Tuple[str, ...] = ()
    run_pointer: Optional[Path] = None


class _Requests:
    """Signals to the supervisor, turned into requests handled in its wait loop."""

    def __init__(self):
        self.kind: Optional[str] = None     # interrupt | stop
        self.at = 0.0

    def __enter__(self):
        self.old = {signal.SIGINT: signal.signal(signal.SIGINT, self._interrupt),
                    signal.SIGTERM: signal.signal(signal.SIGTERM, self._stop),
                    signal.SIGUSR1: signal.signal(signal.SIGUSR1, self._stop)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def _interrupt(self, signum, frame):
        self.kind, self.at = "interrupt", time.monotonic()

    def _stop(self, signum, frame):
        if self.kind is None:
            self.kind, self.at = "stop", time.monotonic()


def _wait_loop(poll: Callable[[], bool], ranks: Callable[[], List[int]], everyone: Callable[[int], None],
               stop_timeout: float) -> Optional[str]:
    """Wait until `poll()` says the job ended, acting on signals; return the request seen.
    (Paddle's launcher as the one child: it watches the ranks itself.)"""
    sent = None
    with _Requests() as req:
        while not poll():
            if req.kind and not ranks():
                everyone(signal.SIGKILL)        # no rank has started: nothing to save or wait for
            if req.kind and sent != req.kind:
                sent = req.kind
                signal_pids(ranks(), signal.SIGINT if req.kind == "interrupt" else signal.SIGUSR1)
                if req.kind == "interrupt":
                    everyone(signal.SIGINT)
            if req.kind:
                limit = GRACE_S if req.kind == "interrupt" else stop_timeout
                if time.monotonic() - req.at > limit:
                    everyone(signal.SIGKILL)
            time.sleep(POLL_S)
        return req.kind


@dataclass
class _Stop:
    """Stopping the survivors of a failure: `notice_s` to stop by themselves, then SIGTERM,
    then `grace_s` to clean up, then SIGKILL."""
    notice_s: float
    grace_s: float
    failed_at: Optional[float] = None
    termed_at: Optional[float] = None

    def step(self, ranks: Ranks, now: float) -> None:
        if self.failed_at is None:
            return
        if self.termed_at is None and now - self.failed_at >= self.notice_s:
            self.termed_at = now
            ranks.signal(signal.SIGTERM)
        elif self.termed_at is not None and now - self.termed_at >= self.grace_s:
            ranks.signal(signal.SIGKILL)


def _watch(ranks: Ranks, stop: _Stop, stop_timeout: float,
           on_interrupt: Callable[[], None] = lambda: None) -> Optional[str]:
    """Wait until every rank ended, stopping the others after a failure and acting on the
    launcher's signals; return the request seen (interrupt | stop | None)."""
    sent = None
    with _Requests() as req:
        while not ranks.done():
            ended_now = ranks.collect(POLL_S)
            ranks.scan()                # before leftovers die: their shared memory is named after them
            for rank in ended_now:
                ended = ranks.exits[rank]
                if ended.code != 0:
                    ranks.kill_leftovers(rank)
                    if ended.failed_by_itself and stop.failed_at is None:
                        stop.failed_at = ended.at
            now = time.monotonic()
            if req.kind and sent != req.kind:
                sent = req.kind
                if req.kind == "interrupt":
                    on_interrupt()
                    ranks.signal(signal.SIGINT)      # with their workers, as a terminal does
                else:
                    ranks.signal(signal.SIGUSR1, group=False)
            if req.kind:
                limit = GRACE_S if req.kind == "interrupt" else stop_timeout
                if now - req.at > limit:
                    ranks.signal(signal.SIGKILL)
            else:
                stop.step(ranks, now)
        return req.kind


def _end(ranks: Ranks) -> List[str]:
    """After the job: kill whatever of it is left and remove the shared memory its
    processes left in /dev/shm (a process killed by a signal never cleans up)."""
    ranks.kill_everything()
    deadline = time.monotonic() + 2.0
    while ranks.alive_members() and time.monotonic() < deadline:
        time.sleep(0.02)    # SIGKILLed workers, orphans we cannot wait for, still exiting
    return remove_segments(set(ranks.members) | set(ranks.pids))


def log_opener(log_dir: Path, key: str = "the ranks' log directory", fix: str = "") -> Callable[[str, int], int]:
    """An opener for the files of `log_dir`, made when missing and checked all the way
    (security/ownpath.py), with no link in it (Paddle's launcher writes its workerlog.N
    through any link there): refused in one line (exit 2) otherwise. `key`, `fix`: what
    named the directory, and what to do, for that line.

    Example:
        with open("launcher.err", "w", opener=log_opener(Path("log"))) as err: ...
    """
    fix = fix or ("" if key.startswith("-") else "-o output.run_dir=...")     # "": `--log_dir DIR`
    fd = ownpath.open_dir(log_dir, key, create=True, fix=fix)
    try:
        ownpath.refuse_links(fd, log_dir, depth=1)
    except BaseException:
        os.close(fd)
        raise
    return ownpath.opener(fd, log_dir)      # holds the directory open for the job's life


class Supervision:
    """One job's processes under supervision, whichever way they start: `start()` them,
    `wait()` until the job ended (acting on signals meanwhile; nothing of the job outlives
    it) for its JobResult, and `close()`, which kills whatever is left (also on an error
    before wait()). `run()` does all three and reports the result (outcome.report)."""

    def start(self) -> None:
        raise NotImplementedError

    def wait(self) -> JobResult:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def run(self) -> int:
        """The job's exit code; its report printed once when it failed or was stopped."""
        try:
            self.start()
            result = self.wait()
        finally:
            self.close()
        return report(result)


class LaunchSupervision(Supervision):
    """`python -m paddle.distributed.launch ...` as the one child, which starts and watches
    the ranks itself. Its own messages go to <log_dir>/launcher.err instead of the
    terminal: they blame whichever rank it killed last, and paddle_dist reports the root
    cause. `start_timeout` (> 0): a launcher that has started no rank after that many
    seconds (a multi-node launch whose nodes never meet in Paddle's rendezvous) is stopped:
    exit 3. A stop request before any rank started ends the launcher at once (exit 143 or
    130). `meeting`: what the machines of a multi-node launch learnt when they met (the
    report names the other machines from it)."""

    def __init__(self, argv: List[str], child_env: Dict[str, str], run_dir: Optional[Path],
                 stop_timeout: float, log_dir: Path, start_timeout: float = 0,
                 meeting: Optional[Meeting] = None):
        self.argv, self.child_env, self.run_dir, self.stop_timeout = argv, child_env, run_dir, stop_timeout
        self.log_dir, self.start_timeout, self.meeting = log_dir, start_timeout, meeting
        self.err_path = log_dir / "launcher.err"
        self.proc: Optional[subprocess.Popen] = None
        self.ranks: set = set()    # Paddle's launcher puts every rank in a session of its own
        self.places: Dict[int, Tuple[int, int, int]] = {}    # rank pid: (local rank, global rank, nnodes)
        self.late = False          # no rank started within start_timeout

    def start(self) -> None:
        opener = log_opener(self.log_dir)
        self.started_at = time.monotonic()
        with open(self.err_path.name, "w", opener=opener) as err:
            self.proc = subprocess.Popen(self.argv, env=self.child_env, start_new_session=True, stderr=err,
                                         preexec_fn=die_with_parent)

    def _finished(self) -> bool:
        self.ranks.update(children_of(self.proc.pid))
        for pid in self.ranks - set(self.places):     # read once each rank runs with its own variables
            place = place_of(pid)
            if place is not None:
                self.places[pid] = place
        if (not self.ranks and self.start_timeout > 0 and not self.late
                and time.monotonic() - self.started_at > self.start_timeout):
            self.late = True
            self._everyone(signal.SIGKILL)
        return self.proc.poll() is not None

    def _everyone(self, sig) -> None:
        for group in [self.proc.pid] + sorted(self.ranks):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self) -> JobResult:
        try:
            request = _wait_loop(self._finished, lambda: sorted(self.ranks), self._everyone, self.stop_timeout)
        finally:
            self.close()
        code = self.proc.returncode
        if not self.ranks and (self.late or request):
            return JobResult(request, launcher_code=code, launcher_log=self.err_path, started=False,
                             start_timeout=self.start_timeout, meeting=self.meeting)
        number = global_ranks(self.places.values(), self.meeting)
        logs = {number(int(log.suffix[1:])): str(log) for log in sorted(self.log_dir.glob("workerlog.*"))
                if log.suffix[1:].isdigit()}
        codes = {number(r): c for r, c in launcher_exit_codes(self.err_path).items()}
        return JobResult(request, run_dir=self.run_dir, logs=logs, exit_codes=codes, launcher_code=code,
                         launcher_log=self.err_path, machines=machines_of(self.places.values(), self.meeting, number))

    def close(self) -> None:
        if self.proc is not None:
            self._everyone(signal.SIGKILL)       # nothing of the job outlives its launcher


class RankSupervision(Supervision):
    """`argv` once per rank (with `rank_envs[r]` added), each in a session of its own with
    its output in <log_dir>/workerlog.<r> (rank 0's on this terminal too): every rank's exit
    code or signal is known first hand. `script`: the ranks run a user's script (its own
    grace, report and command)."""

    def __init__(self, argv: List[str], child_env: Dict[str, str], rank_envs: List[Dict[str, str]],
                 run_dir: Optional[Path], stop_timeout: float, log_dir: Path,
                 script: Optional[UserScript] = None):
        self.argv, self.child_env, self.rank_envs, self.run_dir = argv, child_env, rank_envs, run_dir
        self.stop_timeout, self.log_dir, self.script = stop_timeout, log_dir, script
        self.procs: List[subprocess.Popen] = []
        self.console = Console(filtered=script is not None)
        self.tee_thread: Optional[threading.Thread] = None
        self.ranks: Optional[Ranks] = None
        self.closed = False

    def start(self) -> None:
        opener = log_opener(self.log_dir)
        for rank, extra in enumerate(self.rank_envs):
            with open(f"workerlog.{rank}", "wb", opener=opener) as log:
                self.procs.append(subprocess.Popen(
                    self.argv, env=dict(self.child_env, **extra), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if rank == 0 else log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=die_with_parent))
            if rank == 0:
                self.tee_thread = threading.Thread(target=tee, daemon=True, args=(
                    self.procs[0].stdout, self.log_dir / "workerlog.0", self.console))
                self.tee_thread.start()
        self.ranks = Ranks([p.pid for p in self.procs], [p.wait for p in self.procs], sessions=True)

    def wait(self) -> JobResult:
        try:
            stop = _Stop(SCRIPT_NOTICE_S, SCRIPT_GRACE_S) if self.script else _Stop(GRACE_S, self.stop_timeout)
            request = _watch(self.ranks, stop, self.stop_timeout, on_interrupt=self.console.mute)
        finally:
            self.close()
        run_dir = self.run_dir
        if self.script is not None and run_dir is None:
            run_dir = pointed_run(self.script.run_pointer)
        return JobResult(request, exits=[self.ranks.exits[r] for r in sorted(self.ranks.exits)], run_dir=run_dir,
                         logs={rank: str(self.log_dir / f"workerlog.{rank}") for rank in range(len(self.procs))},
                         rerun=self.script.command if self.script else ())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for p in self.procs:                   # nothing of the job outlives its launcher
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
        if self.ranks is not None:
            self.ranks.collect(0)
            _end(self.ranks)
        if self.tee_thread is not None:
            self.tee_thread.join(timeout=5)


def _join_code(p) -> int:
    """A spawned rank's exit code, once it has ended (waitpid: a pipe-based sentinel would
    stay open while the rank's forked DataLoader workers live)."""
    p.join()
    return p.exitcode


class SpawnSupervision(Supervision):
    """paddle.distributed.spawn's ranks: `spawn()` starts them and returns its context (its
    `.processes` in rank order)."""

    def __init__(self, spawn: Callable, run_dir: Optional[Path], stop_timeout: float):
        self.spawn, self.run_dir, self.stop_timeout = spawn, run_dir, stop_timeout
        self.procs: list = []
        self.ranks: Optional[Ranks] = None
        self.closed = False

    def start(self) -> None:
        self.procs = self.spawn().processes
        self.ranks = Ranks([p.pid for p in self.procs], [lambda p=p: _join_code(p) for p in self.procs],
                           sessions=False)

    def wait(self) -> JobResult:
        try:
            request = _watch(self.ranks, _Stop(GRACE_S, self.stop_timeout), self.stop_timeout)
        finally:
            self.close()
        return JobResult(request, exits=[self.ranks.exits[r] for r in sorted(self.ranks.exits)], run_dir=self.run_dir)

    def close(self) -> None:
        if self.closed or self.ranks is None:
            return
        self.closed = True
        self.ranks.signal(signal.SIGKILL)
        for p in self.procs:
            p.join(timeout=5)
        self.ranks.collect(0)
        _end(self.ranks)
