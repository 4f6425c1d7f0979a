"""Processes as Linux's /proc describes them: found by their relations (parent, session),
never matched by name, and who holds or uses a TCP port. Each function returns nothing
rather than raise when a process is gone or /proc is missing. Also the one request a
child makes of the kernel about its parent (die_with_parent).

The standard library only: the watchdog process (runtime/_deadline.py, a plain script)
imports this file itself and through runtime/watchdog.py and runtime/gloocheck.py.

Example:
    [pid for pid, state, parent, session in process_table() if parent == os.getpid()]
    cmdline(parent_of(os.getpid()))      # ['python', '-m', 'paddle.distributed.launch', ...]
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import signal
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

PR_SET_PDEATHSIG = 1
TCP_LISTEN = "0A"                 # the `st` column of /proc/net/tcp (include/net/tcp_states.h)


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


def children_of(pid: int) -> List[int]:
    """Direct children of `pid`."""
    return [child for child, _, parent, _ in process_table() if parent == pid]


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


def start_time(pid: int) -> str:
    """When `pid` started (clock ticks since boot; "" when gone): a pid and its start time
    name one process, even after the pid is reused."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def state_of(pid) -> str:
    """The state letter of /proc/<pid>/stat (R, S, D, T, Z...); '' when there is none."""
    fields = _stat(pid)
    return fields[0] if fields else ""


def owned_by_me(pid) -> bool:
    """Whether process `pid` is this user's (False when it is gone)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.geteuid()
    except OSError:
        return False


def is_zombie(pid: int) -> bool:
    """Whether `pid` has ended and waits to be reaped (True when it is gone altogether)."""
    fields = _stat(pid)
    return fields[0] == "Z" if fields else True


def environ_of(pid: int) -> Optional[Dict[bytes, bytes]]:
    """The variables `pid` was started with (None when they cannot be read: gone, or
    another user's process)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)


def boot_and_namespaces() -> List[str]:
    """This boot of the kernel (its boot_id) and this process's mount, pid and network
    namespaces, as /proc names them: equal for two processes exactly when they share them.

    Example:
        boot_and_namespaces()   # ['5f3c...-...', 'mnt:[4026531841]', 'pid:[4026531836]', 'net:[4026531840]']
    """
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/mnt", "/proc/self/ns/pid",
                 "/proc/self/ns/net"):
        try:
            parts.append(os.readlink(path) if "/ns/" in path else Path(path).read_text().strip())
        except OSError:
            parts.append(f"unknown-{os.getpid()}")   # unknown: never equal to another's
    return parts


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child, before exec: the kernel sends it `sig` if its parent dies (Linux), so a
    job's processes never outlive a launcher that was itself killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


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


def socket_inodes(pid="self") -> Set[str]:
    """The inodes of the sockets process `pid` holds now (empty when its descriptors cannot
    be read), as /proc/net/tcp's last column names them.

    Example:
        socket_inodes()     # {'493778', '493802'}
    """
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:                      # closed meanwhile
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


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


def port_holder(port: int, proc: str = "/proc") -> Optional[Tuple[int, str]]:
    """(pid, command line) of a process listening on TCP `port`, or None when there is none
    or it is not visible to us (another user's process, another PID namespace).

    Example:
        port_holder(6170)   # (1234, 'python -m http.server 6170')
    """
    inodes = _listening_inodes(port, Path(proc))
    return _socket_owner(inodes, Path(proc)) if inodes else None


def _listening_inodes(port: int, proc: Path) -> Set[str]:
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = row.split()
            if (len(fields) > 9 and fields[3] == TCP_LISTEN and fields[9] != "0"
                    and int(fields[1].rpartition(":")[2], 16) == port):
                found.add(fields[9])
    return found


def _socket_owner(inodes: Set[str], proc: Path) -> Optional[Tuple[int, str]]:
    links = {f"socket:[{inode}]" for inode in inodes}
    # Lowest pid first: after a fork parent and children share the socket; name the parent.
    for pid in sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit()):
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:   # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in links:
                    return pid, _command_text(proc / str(pid))
            except OSError:
                continue
    return None


def _command_text(pid_dir: Path, limit: int = 200) -> str:
    """A process's command line as one line of at most `limit` characters ("?" when unknown)."""
    try:
        words = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w) or "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."
