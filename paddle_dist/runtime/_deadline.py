"""Stop a rank that missed a deadline. Run as a plain script, with `python -S`: it imports
only the standard library and the modules beside it (no site-packages, no Paddle).

Why a separate process: native code can hold Python's GIL for as long as it runs (Paddle's
rendezvous while it waits for peers; a C or CUDA call that never returns), and then no
thread of the rank itself can run to notice the time.

Usage:
    python _deadline.py PID SECONDS MESSAGE [STATUS_FILE RANK [STORE WORLD [SOCKETS]]]
        after SECONDS, print MESSAGE, record it in STATUS_FILE and end PID: SIGQUIT, which
        the rank made _exit(3) (monitor.deadline), then SIGKILL if it is still there. When
        something outside the job took part in gloo's connections (gloocheck.py, given
        Paddle's STORE as host:port and the job's WORLD; SOCKETS: the inodes of the
        sockets PID held before, comma-separated), that is printed and recorded instead,
        as a breach (exit 6).
    python _deadline.py --heartbeat PID BEAT_FILE SECONDS STATUS_FILE RANK STACK_FILE LOG FOLDER WORLD BEAT_FD STACK_FD
        the hang watchdog: BEAT_FILE is the rank's heartbeat (monitor.Heartbeat), BEAT_FD and
        STACK_FD the descriptors of it and of STACK_FILE, handed on by the rank (the names
        only serve to remove them); FOLDER is the job's private directory, holding the
        heartbeats of its other ranks on this machine ('' for none), WORLD is the job's
        number of ranks. When no rank has made progress for SECONDS (watchdog.judge),
        the watchdog of a rank to blame acts at once; the others wait GRACE_S more, in
        case the blame lies with a rank whose watchdog cannot act (on another machine).
        Acting: ask the rank for its Python stack (SIGUSR2: faulthandler writes it to
        STACK_FILE, even while native code holds the GIL; not asked of a stopped process),
        record "hung" and the verdict in STATUS_FILE, print them, and SIGKILL PID.
Both exit quietly when their stdin closes or brings a line (the rank finished in time, or
died). The rank starts them in a process group of their own, so a terminal's Ctrl+C
(which the rank handles) never reaches them, not even while this interpreter is still
starting.
"""

import os
import select
import signal
import sys
import time

gloocheck = procfs = watchdog = RankStatus = FAILED = HUNG = None       # _load()


def _load() -> None:
    """Import the modules beside this one, which acting needs: a deadline met (the rank's
    rendezvous done in time, the common case) ends without them, its start-up about
    half as long."""
    global gloocheck, procfs, watchdog, RankStatus, FAILED, HUNG
    try:
        from . import gloocheck, watchdog
        from .. import procfs
        from ..runs.status import FAILED, HUNG, RankStatus
    except ImportError:
        # Run as a script. Its own folder is on sys.path only without Python's safe-path
        # mode (-P, PYTHONSAFEPATH, which the ranks' children inherit), so it goes first
        # here, with what it and the modules beside it import: above it (procfs.py), in
        # security/ (storewire.py) and in runs/ (the record's type). All are paddle_dist's.
        here = os.path.dirname(os.path.abspath(__file__))
        package = os.path.dirname(here)
        sys.path[0:0] = [here, package, os.path.join(package, "security"), os.path.join(package, "runs")]
        import gloocheck
        import procfs
        import watchdog
        from status import FAILED, HUNG, RankStatus


EXIT_RENDEZVOUS = 3
EXIT_SECURITY = 6              # errors.EXIT_SECURITY
SECURITY_LINE = "paddle_dist: security: "       # attest.SECURITY_LINE: the report finds it
POLL_S = 1.0
STACK_WAIT_S = 3.0
QUIT_WAIT_S = 3.0
GRACE_S = STACK_WAIT_S + 3 * POLL_S    # time for the watchdog of a rank to blame to act first
# Rank 0 holds Paddle's store: ended, it takes the store with it, and the watchdogs of the
# other ranks, whose deadlines pass a little later, could no longer read their gloo keys.
STORE_KEPT_S = 5.0


def main(pid: int, seconds: float, message: str, status_file: str = "", rank: str = "0",
         store: str = "", world: str = "0", sockets: str = "") -> int:
    if _stdin_closed(seconds):
        return 0
    _load()
    error, kind, code = message, "RendezvousTimeout", EXIT_RENDEZVOUS
    seen = _outsiders(pid, int(rank), store, int(world), sockets.split(","))
    if seen:
        error, kind, code = f"rank {rank}: the process group did not form: {seen[0]}", "SecurityError", EXIT_SECURITY
        sys.stderr.write(f"{SECURITY_LINE}{error}; the job was stopped (docs/security.md)\n")
    else:
        sys.stderr.write(f"paddle_dist: {message}\n")
    sys.stderr.flush()
    if status_file:
        import socket

        RankStatus(int(rank), pid=pid, host=socket.gethostname(), state=FAILED, step=0, time=time.time(),
                   error_type=kind, error=error, exit_code=code).write(status_file)
    if rank == "0" and store and int(world) > 1 and not seen:
        _stdin_closed(STORE_KEPT_S)         # or until the rank has ended (its end closes the pipe)
    if not procfs.is_zombie(pid):
        _end(pid)
    return 0


def _outsiders(pid: int, rank: int, store: str, world: int, before: list) -> list:
    """What outside the job holds up the rendezvous of rank `rank` (process `pid`, which
    held the sockets `before` until then), as gloocheck.outsiders sees it from Paddle's
    `store` ("host:port") and this machine's sockets; [] when nothing, or when it cannot
    tell."""
    host, _, port = store.rpartition(":")
    if not (host and port.isdigit() and world > 0):
        return []
    try:
        return gloocheck.outsiders(host, int(port), world, rank, pid, before=before)
    except Exception:          # noqa: BLE001  (the deadline's own line must come out whatever happens)
        return []


def _end(pid: int) -> None:
    """SIGQUIT, which the rank turned into _exit(3) (monitor.deadline); SIGKILL if it is
    still there a few seconds later."""
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + QUIT_WAIT_S
    while time.monotonic() < deadline:
        if procfs.is_zombie(pid):            # ended (reaped or not)
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def watch(pid: int, beat_file: str, seconds: float, status_file: str, rank: str, stack_file: str,
          log: str, folder: str = "", world: int = 1, beat_fd: int = -1, stack_fd: int = -1) -> int:
    """The hang watchdog (module docstring). Removes the heartbeat and stack files when it
    ends, whichever way the rank ended."""
    import mmap

    _load()
    maps: dict = {}
    hung_since, own = None, None
    try:
        own = mmap.mmap(beat_fd, watchdog.BEAT_SIZE, access=mmap.ACCESS_READ)
        while not _stdin_closed(POLL_S):
            now = time.monotonic()
            beats = watchdog.read_beats(folder, maps) if folder else \
                [watchdog.Beat.unpack(int(rank), pid, own, procfs.state_of(pid))]
            verdict = watchdog.judge(beats, now, seconds, world if folder else 1)
            hung_since = None if verdict is None else (hung_since or now)
            if verdict is None or (int(rank) not in verdict.culprits and now - hung_since < GRACE_S):
                continue
            _stop_hung(pid, watchdog.Beat.unpack(int(rank), pid, own, procfs.state_of(pid)),
                       f"{verdict.message} (dist.hang_timeout={seconds:g})", status_file, stack_fd, log)
            return 0
        return 0
    finally:
        for mapped in list(maps.values()) + ([own] if own is not None else []):
            mapped.close()
        for path in (beat_file, stack_file):
            try:
                os.unlink(path)
            except OSError:
                pass


def _stop_hung(pid: int, beat, message: str, status_file: str, stack_fd: int, log: str) -> None:
    """Record and print why the job is hung, with this rank's stack, and SIGKILL the rank."""
    stack = "" if beat.state in watchdog.STOPPED_STATES else _stack_of(pid, stack_fd)
    if status_file:
        import socket

        RankStatus(beat.rank, pid=pid, host=socket.gethostname(), state=HUNG, step=beat.step, epoch=beat.epoch,
                   phase="train", collective=beat.kind, time=time.time(), log=log, message=message,
                   traceback=stack[-4000:]).write(status_file)
    sys.stderr.write(f"paddle_dist: {message}; stopping rank {beat.rank}\n{stack}")
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)


def _stdin_closed(seconds: float) -> bool:
    """Wait up to `seconds` for stdin to close or bring a line (the rank's stop); True if it did."""
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    return bool(ready)


def _stack_of(pid: int, stack_fd: int) -> str:
    """The rank's Python stacks, dumped by its faulthandler on SIGUSR2 into the file of
    `stack_fd`: wait until it has stopped growing (or STACK_WAIT_S has passed)."""
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        return ""
    deadline, size, still = time.monotonic() + STACK_WAIT_S, -1, 0
    while time.monotonic() < deadline and still < 3:
        time.sleep(0.05)
        now = _size(stack_fd)
        still = still + 1 if now == size and now > 0 else 0
        size = now
    try:
        return os.pread(stack_fd, max(_size(stack_fd), 0), 0).decode(errors="replace")
    except OSError:
        return ""


def _size(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        return 0


if __name__ == "__main__":
    # An interrupt sent to this process by name is the rank's to handle, not this watchdog's:
    # it ends when its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.argv[1] == "--heartbeat":
        pid_, beat_, seconds_, status_, rank_, stack_, log_, folder_, world_, beat_fd_, stack_fd_ = sys.argv[2:13]
        sys.exit(watch(int(pid_), beat_, float(seconds_), status_, rank_, stack_, log_, folder_, int(world_),
                       int(beat_fd_), int(stack_fd_)))
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], *sys.argv[4:9]))
