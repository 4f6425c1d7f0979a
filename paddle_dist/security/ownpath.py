"""The directories a job writes or reads its run from, checked all the way down.

A check of the last directory alone says nothing of the ones above it: whoever owns or
can write a directory on the way can rename what is inside away and put a directory of
their own in its place. So a directory of the job (`output.root`, `output.run_dir`, a
launcher's `--log_dir`, the directory of the run pointer) is opened one component at a
time from `/`, each relative to the one above (openat, without following links), and each
checked with fstat on its descriptor:
- above the named directory: owned by this user or root, and not writable by others
  unless sticky (as /tmp is: there others can add entries of their own, not replace
  ours); a link there is followed only when this user or root made it (such a link can
  change only as the directory holding it can);
- the named directory and whatever the job makes on the way: owned by this user, not
  writable by others unless sticky, never a link.
What is missing is made with mkdir (never exist_ok) and checked the same way. The answer
is a descriptor of the directory: what is opened relative to it cannot be redirected.

In a user namespace that maps no root (dist.isolate as a user other than root), files of
root and of unmapped users all show the overflow uid: there the directories above the
named one may show it too (the launcher checked them before it entered the namespace).

This module imports nothing but the standard library, errors.py and private.py.

Example:
    fd = open_dir("runs/job-1", "output.run_dir", create=True)
    # UserError: output.run_dir /srv/shared/exp/run1 is inside /srv/shared/exp, which is not
    # yours alone (it belongs to user nobody (uid 65534)): ...
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import Callable, List, Optional, Set, Tuple

from ..errors import UserError
from .private import LinkRefused, user_name

_PATH = getattr(os, "O_PATH", os.O_RDONLY)      # search permission is enough (a 0711 home)
_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40                                  # as the kernel's own limit (ELOOP)


class NotOwn(UserError):
    """A directory of the job that is not this user's alone (exit 2): the line names it."""


def open_dir(path, key: str, create: bool = False, mode: int = 0o755, fix: str = "") -> Optional[int]:
    """A readable descriptor of directory `path`, every directory from `/` down checked
    (module docstring); missing ones made (`create`; `mode` narrowed by the umask, never
    writable by others). None when `path` is missing and not `create`. `key`: what named
    the path (`output.run_dir`, `--log_dir`), for the line that refuses it (NotOwn), which
    ends with `fix` (by default: give `key` another directory).

    Example:
        fd = open_dir(Path("log"), "--log_dir", create=True)
        os.open("launcher.err", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=fd)
    """
    walk = _Walk(os.fspath(path), key, create, mode & 0o755, fix)
    try:
        found = walk.run()
        return None if found is None else os.open(".", os.O_RDONLY | _DIR, dir_fd=found)
    finally:
        walk.close()


def check(path, key: str) -> None:
    """Refuse (NotOwn) directory `path` unless it and the directories above it are checked
    as open_dir() checks them; a missing path is checked as far as it exists."""
    fd = open_dir(path, key)
    if fd is not None:
        os.close(fd)


def refuse_links(fd: int, path, depth: int = 16) -> None:
    """Refuse (LinkRefused, exit 2) a symbolic link anywhere inside directory `fd` (named
    `path` in the line), `depth` levels down: a directory of a run (checkpoints/, logs/,
    status/, ...) that is a link would have every file in it read or written elsewhere."""
    with os.scandir(fd) as entries:
        found = [(e.name, e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in entries]
    for name, link, folder in found:
        inside = os.path.join(os.fspath(path), name)
        if link:
            raise LinkRefused(f"{inside} is a symbolic link, and paddle_dist writes no file of a run "
                              "through one; remove the link")
        if folder and depth > 1:
            try:
                sub = os.open(name, os.O_RDONLY | _DIR, dir_fd=fd)
            except FileNotFoundError:
                continue                # removed meanwhile (an old checkpoint another rank let go)
            try:
                refuse_links(sub, inside, depth - 1)
            finally:
                os.close(sub)


def opener(fd: int, shown) -> Callable[[str, int], int]:
    """An opener for open(): a file inside directory `fd`, never through a link (named
    `shown`/name in the line that refuses one).

    Example:
        with open("workerlog.0", "wb", opener=opener(fd, log_dir)) as log: ...
    """
    def open_inside(name: str, flags: int) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LinkRefused(f"{os.path.join(os.fspath(shown), name)} is a symbolic link, and "
                                  "paddle_dist writes no file of a run through one; remove the link") from None
            raise
    return open_inside


def trusted_above() -> Set[int]:
    """Who may own a directory above the named one: this user and root (module docstring:
    the overflow uid in a user namespace that maps no root)."""
    owners = {os.geteuid(), 0}
    try:
        with open("/proc/self/uid_map") as f:
            maps_root = any(line.split()[:1] == ["0"] for line in f)
        if not maps_root:
            with open("/proc/sys/kernel/overflowuid") as f:
                owners.add(int(f.read()))
    except (OSError, ValueError):
        pass
    return owners


class _Walk:
    """One walk from `/` to `path` (open_dir): a stack of descriptors, one per component."""

    def __init__(self, path: str, key: str, create: bool, mode: int, fix: str = ""):
        self.path, self.key, self.create, self.mode = path, key, create, mode
        self.fix = fix or (f"{key} DIR" if key.startswith("-") else f"-o {key}=...")
        parts = [p for p in os.path.abspath(path).split("/") if p]
        # (name, named): the last component is the named directory, the others are above it
        self.todo: List[Tuple[str, bool]] = [(p, i == len(parts) - 1) for i, p in enumerate(parts)]
        self.stack: List[Tuple[int, str]] = [(os.open("/", _PATH | _DIR), "/")]
        self.above, self.made, self.links = trusted_above(), False, 0

    def close(self) -> None:
        for fd, _ in self.stack:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.stack = []

    def run(self) -> Optional[int]:
        self._judge(self.stack[0][0], "/", named=not self.todo)
        tries = 0
        while self.todo:
            name, named = self.todo.pop(0)
            if name == ".":
                continue
            if name == "..":
                if len(self.stack) > 1:
                    os.close(self.stack.pop()[0])
                continue
            parent, shown = self.stack[-1]
            where = os.path.join(shown, name)
            try:
                fd = os.open(name, _PATH | _DIR, dir_fd=parent)
            except FileNotFoundError:
                if not self.create:
                    return None
                tries += 1
                if tries > 3:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, self.mode, dir_fd=parent)
                    self.made = True
                self.todo.insert(0, (name, named))
                continue
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                self._not_a_directory(name, named, where)
                continue
            tries = 0
            self.stack.append((fd, where))
            self._judge(fd, where, named)
        return self.stack[-1][0]

    def _not_a_directory(self, name: str, named: bool, where: str) -> None:
        """`name` is a link (followed above the named directory when trusted) or a file."""
        parent = self.stack[-1][0]
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISLNK(found.st_mode):
            raise NotOwn(f"{self.key} {self.path}: {where} is not a directory; give a directory "
                         f"({self.fix})")
        if named or self.made or found.st_uid not in self.above:
            owner = "" if found.st_uid in self.above else f" of {user_name(found.st_uid)}"
            self._refuse(where, named, f"it is a symbolic link{owner}")
        self.links += 1
        if self.links > MAX_LINKS:
            self._refuse(where, named, "too many symbolic links")
        target = os.readlink(name, dir_fd=parent)
        if target.startswith("/"):
            while len(self.stack) > 1:
                os.close(self.stack.pop()[0])
        self.todo[:0] = [(p, False) for p in target.split("/") if p]

    def _judge(self, fd: int, where: str, named: bool) -> None:
        found = os.fstat(fd)
        owners = {os.geteuid()} if named or self.made else self.above
        if found.st_uid not in owners:
            self._refuse(where, named, f"it belongs to {user_name(found.st_uid)}")
        if found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX:
            self._refuse(where, named, f"other users can write into it: mode {stat.S_IMODE(found.st_mode):04o}")

    def _refuse(self, where: str, named: bool, why: str) -> None:
        if named or os.path.abspath(self.path) == where:
            raise NotOwn(f"{self.key} {self.path} is not yours alone ({why}): someone else could read, "
                         f"plant or change what the job keeps there; choose a directory of your own "
                         f"({self.fix})")
        raise NotOwn(f"{self.key} {self.path} is inside {where}, which is not yours alone ({why}): "
                     "whoever can change it can put a directory of theirs in place of yours; choose a "
                     f"directory of your own ({self.fix})")
