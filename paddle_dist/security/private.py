"""Where a job keeps its files on a shared machine: a directory no other user can enter.

/dev/shm (memory, where there is one) is world-writable and its names are guessable, so a
file opened there by name may be another user's symlink, and a file read there may be
another user's plant. Nothing of a job is kept there directly. Each user has one
directory, `/dev/shm/paddle_dist-<uid>` (0700, checked to be a real directory the user
owns: never followed through a link), and each job a directory inside it:
- `job-<pid>-<random>`: made by the launcher (mkdtemp) for its whole job, named to the
  ranks by PADDLE_DIST_JOB_DIR (env.JOB_DIR); it holds the job token, the ranks'
  heartbeats and stacks and the shared-memory transport's segment, and is removed when
  the job ends;
- `key-<key>`: made by the ranks of a job started without paddle_dist's launcher (Paddle's
  own launcher, mpirun on another machine), named by the job's secret (key()).

When another user holds that name first, a launcher's job gets a directory of its own
straight in /dev/shm (mkdtemp: random name, 0700), and a rank without one keeps its
heartbeat alone (the watchdog then judges that rank by itself) and says why once.

What a killed job leaves (its directory, its token among it) is removed by the next job of
the same user, or by `python -m paddle_dist.runs --clean` (clean()).

This module imports nothing but the standard library and errors.py (which imports nothing
else): the launcher and the watchdog use it.

Example:
    folder = make_job_dir()            # '/dev/shm/paddle_dist-1000/job-4711-k2j3h4'
    fd = create(os.path.join(folder, "token"))
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pwd
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from ..errors import UserError

SHM = "/dev/shm"
LAUNCHED = re.compile(r"^job-(\d+)-")           # in the user's directory: job-<launcher pid>-<random>
# straight in /dev/shm: paddle_dist-job-<uid>-<launcher pid>-<random> (a directory), and
# the files of earlier versions, paddle_dist-token-<pid>-... and paddle_dist-beat-<pid>-...
LEFT_IN_SHM = re.compile(r"^paddle_dist-(?:job-\d+|token|beat)-(\d+)-")
BEAT = re.compile(r"^beat-(\d+)-rank(\d+)(?:\.stack)?$")
_said: set = set()


def base() -> str:
    """/dev/shm where this machine has one, else the temporary directory."""
    return SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else tempfile.gettempdir()


def owned(path: str) -> bool:
    """True when `path` is a directory itself (not a link to one), owned by this process's
    user and closed to everyone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077


def user_dir() -> Optional[str]:
    """This user's directory (module docstring), made when missing; None when the name is
    another user's, or not a private directory."""
    path = os.path.join(base(), f"paddle_dist-{os.geteuid()}")
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(path, 0o700)
    if owned(path):
        return path
    _say_once(path, f"paddle_dist: {path} is not a private directory of this user (another user made "
                    "it, or a link): not used; remove it, or ask who made it")
    return None


def make_job_dir() -> str:
    """A new directory for one job (module docstring), after removing what killed jobs of
    this user left."""
    clean()
    parent = user_dir()
    if parent is not None:
        return tempfile.mkdtemp(prefix=f"job-{os.getpid()}-", dir=parent)
    return tempfile.mkdtemp(prefix=f"paddle_dist-job-{os.geteuid()}-{os.getpid()}-", dir=base())


def key(token: bytes, name: str) -> str:
    """What names a job's directory when no launcher made one: its token (the secret)
    with `name` (the run directory), or the name alone when the job has no token."""
    return hashlib.sha256(token + b"\0" + name.encode()).hexdigest()[:16]


def rank_dir(job_key: str, given: str = "") -> Optional[str]:
    """The directory a rank keeps its files in: `given`, its launcher's (env.DistEnv.job_dir),
    else this user's `key-<job_key>`; None when neither is private (module docstring)."""
    if given and owned(given):
        return given
    parent = user_dir()
    if parent is None:
        return None
    path = os.path.join(parent, f"key-{job_key}")
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(path, 0o700)
    return path if owned(path) else None


WORKERS = "workers"       # a job directory's list of DataLoader worker pids (note_worker)


def note_worker(job_dir: str) -> None:
    """Add this process's pid to the job directory's list of DataLoader workers, whose
    shared memory the launcher removes when the job ends (a worker killed with its rank
    leaves its segments in /dev/shm)."""
    if not (job_dir and owned(job_dir)):
        return
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(job_dir, WORKERS), flags, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)


def noted_workers(job_dir: str) -> List[int]:
    """The pids note_worker() wrote in `job_dir`."""
    try:
        with open(os.path.join(job_dir, WORKERS)) as f:
            return [int(line) for line in f if line.strip().isdigit()]
    except OSError:
        return []


def create(path: str) -> int:
    """A new file at `path`, readable by its owner alone: never an existing file, never
    through a link. Returns its descriptor."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


class LinkRefused(UserError):
    """A file of a run is a symbolic link, which paddle_dist never writes through (exit 2)."""


def nofollow(path, flags: int) -> int:
    """An opener for open(): the file at `path` itself, never through a symbolic link (a
    run's files: one another user planted would have us write where they chose).

    Example:
        with open(run_dir / "samples.tsv", "a", opener=nofollow) as out: ...
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise LinkRefused(f"{path} is a symbolic link, and paddle_dist writes no file of a run "
                              "through one; remove the link") from None
        raise


def write_text(path, text: str) -> None:
    """`path`'s text, written without following a link (nofollow)."""
    with open(path, "w", opener=nofollow) as f:
        f.write(text)


def clean() -> List[str]:
    """Remove what this user's killed jobs left: job directories whose launcher is gone,
    in `key-` directories the heartbeats of processes that are gone (the directory too
    once empty), and the token and heartbeat files that versions before these directories
    left in /dev/shm itself. Returns the paths removed.

    Example:
        clean()       # ['/dev/shm/paddle_dist-1000/job-4711-k2j3h4']
    """
    removed: List[str] = []
    shared, uid = base(), os.geteuid()
    for name in _names(shared):
        path, made_by = os.path.join(shared, name), _maker(LEFT_IN_SHM, name)
        if made_by is None or _alive(made_by):
            continue
        if name.startswith(f"paddle_dist-job-{uid}-") and owned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        elif _own_file(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    mine = user_dir()
    for name in _names(mine) if mine else ():
        path, made_by = os.path.join(mine, name), _maker(LAUNCHED, name)
        if made_by is not None and not _alive(made_by) and owned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        elif name.startswith("key-") and owned(path):
            removed += _clean_beats(path)
    return removed


def _names(folder: str) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _maker(pattern, name: str) -> Optional[int]:
    match = pattern.match(name)
    return int(match.group(1)) if match else None


def _own_file(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _clean_beats(folder: str) -> List[str]:
    removed = []
    for name in _names(folder):
        match = BEAT.match(name)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
    with contextlib.suppress(OSError):
        os.rmdir(folder)                    # only when empty
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def closed_umask(share: str = "private") -> int:
    """Make what this process and its children create this user's alone (output.share
    private: umask 077) or the group's too (group: 027), never looser than it was.
    Returns the umask it replaced."""
    old = os.umask(0o077)
    os.umask(old | (0o027 if share == "group" else 0o077))
    return old


def restrict(path: Path, share: str = "private") -> None:
    """Close a directory of the job (a run directory, a log directory) to other users:
    0700, or 0750 with output.share=group. Only a directory this user owns is changed."""
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.geteuid():
            path.chmod(0o750 if share == "group" else 0o700)


def _say_once(what: str, line: str) -> None:
    if what not in _said:
        _said.add(what)
        print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the user's own directories
def not_own(path: Path) -> str:
    """Why `path` is not this user's alone ("" when it is): another user owns it, or other
    users may write into it (a sticky directory such as /tmp lets them add entries of
    their own only, which the checks of those entries refuse).

    Example:
        not_own(Path("/tmp/theirs"))     # 'it belongs to user nobody (uid 65534)'
    """
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(found.st_mode):
        return "it is a symbolic link"
    if found.st_uid != os.geteuid():
        return f"it belongs to {user_name(found.st_uid)}"
    if found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX:
        return "other users can write into it"
    return ""


def user_name(uid: int) -> str:
    """How a line names user `uid`: 'user nobody (uid 65534)'."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
