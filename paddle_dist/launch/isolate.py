"""dist.isolate: a one-machine job in a network of its own, where no other user can see or
reach its listeners (Paddle's store, gloo's, NCCL's, the job's gate).

The launcher moves itself, before it starts anything, into a new network namespace that
holds only a loopback interface, and its ranks inherit it: their 127.0.0.1 is not the
machine's, and /proc/net/tcp of other users shows none of their sockets. As root that is
unshare(CLONE_NEWNET); as another user, a user namespace too (CLONE_NEWUSER), mapping the
user and group to themselves, so that files keep their owner. The cost: the job has no
network beyond itself (no downloads from the training script), and it needs a kernel that
allows it (user.max_user_namespaces > 0 for a user other than root).

A user other than root must do it before the process has threads, which importing numpy
starts: the launcher then runs its own command again through this file as a script
(rerun_inside), which imports nothing else.

Example:
    enter()      # raises Unavailable('unshare(CLONE_NEWUSER|CLONE_NEWNET): Operation not permitted ...')
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
from typing import List

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = "16sH22x"
MARK = "PADDLE_DIST_ISOLATED"          # set once a launcher moved itself (its ranks inherit it)


class Unavailable(OSError):
    """The kernel refused the namespaces; the message says why."""


def enter() -> None:
    """Move this process (and whatever it starts from now on) into a private network
    namespace with loopback up. Must come before this process has threads: a process with
    threads cannot enter a new user namespace."""
    uid, gid = os.geteuid(), os.getegid()
    flags, names = (CLONE_NEWNET, "CLONE_NEWNET") if uid == 0 else \
        (CLONE_NEWUSER | CLONE_NEWNET, "CLONE_NEWUSER|CLONE_NEWNET")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        hint = {errno.EINVAL: " (this process already has threads)",
                errno.EPERM: " (namespaces are not allowed here: a container without CAP_SYS_ADMIN, or "
                             "user namespaces switched off)",
                errno.ENOSPC: " (user.max_user_namespaces is 0 or reached)"}.get(code, "")
        raise Unavailable(code, f"unshare({names}): {os.strerror(code)}{hint}")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags_now = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags_now | IFF_UP))
    os.environ[MARK] = "1"


def isolated() -> bool:
    return os.environ.get(MARK) == "1"


def rerun_inside(command: List[str]) -> None:
    """Replace this process by `command` (its own, argv[0] an executable) run inside a
    private network namespace (enter), through this file as a script. Returns only if the
    command could not be started; a refusal ends it with one line and exit 2."""
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *command])


if __name__ == "__main__":
    try:
        enter()
    except Unavailable as e:
        print(f"paddle_dist: dist.isolate=true: this machine refuses a private network namespace: {e}; "
              "run without -o dist.isolate=true (docs/security.md)", file=sys.stderr, flush=True)
        sys.exit(2)
    os.execv(sys.argv[1], sys.argv[1:])
