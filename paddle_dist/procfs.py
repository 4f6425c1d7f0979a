"""Processes as Linux's /proc describes them: found by their relations (parent, session),
never matched by name. Each function returns nothing rather than raise when a process is
gone or /proc is missing.

Example:
    [pid for pid, state, parent, session in process_table() if parent == os.getpid()]
    cmdline(parent_of(os.getpid()))      # ['python', '-m', 'paddle.distributed.launch', ...]
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Iterator, List, Optional, Tuple


def _stat(pid) -> Optional[List[str]]:
    """The fields of /proc/<pid>/stat after the command name: state, parent, group, session..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> Iterator[Tuple[int, str, int, int]]:
    """(pid, state, parent pid, session id) of every process."""
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields:
            yield int(entry.name), fields[0], int(fields[1]), int(fields[3])


def parent_of(pid: int) -> int:
    """The parent's pid (0 when unknown)."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def cmdline(pid: int) -> List[str]:
    """The command line `pid` was started with ([] when unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode(errors="replace") for word in raw.split(b"\0") if word]


def pid_alive(pid) -> bool:
    """Whether process `pid` exists (signal 0 delivers nothing, it only checks): a process of
    another user counts, a falsy `pid` (a record without one) does not.

    Example:
        pid_alive(os.getpid()), pid_alive(None)     # (True, False)
    """
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tcp_sockets() -> Iterator[Tuple[Tuple[str, int], Tuple[str, int], str, str]]:
    """(local, remote, state, inode) of every TCP socket (/proc/net/tcp and tcp6); an
    address is (hex IP as the kernel writes it, port)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = (f.rsplit(":", 1) for f in fields[1:3])
            yield (local[0], int(local[1], 16)), (remote[0], int(remote[1], 16)), fields[3], fields[9]


def _ip(hex_ip: str) -> str:
    """The dotted IPv4 (also inside an IPv4-mapped IPv6 address) or compact IPv6 of a
    /proc/net/tcp address."""
    raw = bytes.fromhex(hex_ip)
    words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]    # each 32-bit word is host order
    data = b"".join(words)
    if len(data) == 4 or data[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in data[-4:])
    return str(ipaddress.IPv6Address(data))


def _socket_owners() -> dict:
    """socket inode -> pid, for every process whose descriptors this user may read."""
    owners = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:                  # closed meanwhile
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], int(entry.name))
    return owners


def peers_of(port: int) -> List[Tuple[str, int, int]]:
    """(address, port, pid or 0 when unknown) of every established TCP connection to this
    machine's `port`: who is connected to a server listening there. The pid is known for a
    peer on this machine whose process this user may read.

    Example:
        peers_of(6170)     # [('127.0.0.1', 41234, 4242), ('10.0.0.2', 50112, 0)]
    """
    sockets = list(_tcp_sockets())
    # A socket in TIME_WAIT keeps its address but has no inode ("0"): never the owner's.
    by_local = {(_ip(ip), number): inode for (ip, number), _, _, inode in sockets if inode != "0"}
    owners = _socket_owners()
    out = []
    for local, (ip, number), state, _ in sockets:
        if local[1] == port and state == "01":                       # 01: ESTABLISHED
            out.append((_ip(ip), number, owners.get(by_local.get((_ip(ip), number), ""), 0)))
    return out
