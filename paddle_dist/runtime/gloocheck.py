"""When Paddle's process group fails to form on this machine: was it something outside the job?

gloo connects every pair of ranks through listeners on ephemeral ports, published in
Paddle's unauthenticated store. Another user who connects to such a listener first is
taken for the peer, and the real peer's connection is refused; one who rewrites an
address in the store sends a rank to a socket of its own. Either way Paddle only says
`connect [...]: Connection refused`, or the ranks wait until the rendezvous deadline.

`outsiders()` looks for both, from this machine's /proc (the ranks' own sockets, readable
by their user) and the store:
- a connection to a socket of one of the job's ranks here, from a process that is not one
  of them (gloo's port, not the store's: the store's clients are checked by attest.py);
- an address in gloo's keys of the store (`<gid>/<rank>` and `<rank>`: for each peer, a
  136-byte sockaddr and a sequence number) that a process other than that rank listens on
  or holds;
- a key rewritten to an address nobody here holds (`_moved`): a rank here listens for gloo
  on a socket that none of its keys gives, while a key of its gives an address no process
  here holds. gloo publishes each listener right after it opens it and closes it once its
  pair is connected, and Paddle closes them all when the process group fails, so only a
  rank still in the rendezvous can be judged: the rank itself when its deadline passes
  (its sockets from before the rendezvous aside), or the peer whose address a failing rank
  was refused at. A finding must still hold CONFIRM_S later.
Each finding is one line naming the socket and the process. The ranks here are this
process, its siblings (Paddle's, paddle_dist's and spawn's launchers start the ranks as
children of one process) and the processes whose environment names the same store and a
rank (ranks started by hand).

Standard library only: the rendezvous watchdog (_deadline.py) runs it too.

Example:
    outsiders("127.0.0.1", 40123, world=2, rank=1)
    # ["rank 0's gloo socket 127.0.0.1:37163 is connected from 127.0.0.1:47814, held by pid 26979 (python3 probe.py), not by a rank of the job"]
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from typing import Collection, Dict, List, Optional, Set, Tuple

try:
    from .. import procfs
    from ..security import storewire
except ImportError:            # run from _deadline.py as a script, which puts their folders on sys.path
    import procfs
    import storewire

ADDRESS_BYTES = 136            # gloo::transport::tcp::Address: sockaddr_storage (128) + int64 sequence
ESTABLISHED, LISTEN = "01", "0A"
CONFIRM_S = 1.0                # a key is published as soon as its listener opens; a rewrite stays
# gloo's error when a pair's connect fails: `connect [127.0.0.1]:2304: Connection refused`
# (Paddle 3.x; the port printed in network byte order, 2304 for port 9).
REFUSED = re.compile(r"connect \[([^\]]+)\]:(\d+)")


def outsiders(store_host: str, store_port: int, world: int, rank: int, pid: int = 0, gid: int = 0,
              before: Collection[str] = (), error: str = "") -> List[str]:
    """The lines naming what outside the job took part in gloo's connections here (module
    docstring), for rank `rank` (process `pid`, this one by default); [] when nothing was
    seen. `error`: Paddle's error, when the process group failed (the peer it names is
    judged); else rank `rank` is judged, its sockets `before` (inodes) aside."""
    ranks = rank_pids(f"{store_host}:{store_port}", rank, pid)
    me, refused = pid or os.getpid(), refused_at(error)
    owners, sockets, published = _look(store_host, store_port, world, gid)
    lines = _connections(ranks, owners, sockets, store_port)
    lines += _rewritten(ranks, owners, sockets, published)
    # After a failure, this rank's own listeners are closed already: only the peer can be judged.
    moved = _moved(ranks, owners, sockets, published, store_port, me, set(before), refused) \
        if refused or not error else []
    if moved and not lines:
        time.sleep(CONFIRM_S)
        again = _moved(ranks, *_look(store_host, store_port, world, gid), store_port, me, set(before), refused)
        lines = [line for line in moved if line in again]
    return lines


def refused_at(error: str) -> Optional[Tuple[str, int]]:
    """The peer address in gloo's connect error (REFUSED), its port as printed; None without one."""
    found = REFUSED.search(error or "")
    return (found.group(1), int(found.group(2))) if found else None


def rank_pids(store: str, rank: int, pid: int = 0) -> Dict[int, str]:
    """{pid: "rank N"} of the job's ranks on this machine: rank `rank` (process `pid`, this
    one by default), its siblings (ranks of one launcher: Paddle's, paddle_dist's or
    spawn's), and processes whose environment gives PADDLE_TRAINER_ID and the same store
    (`store`, "host:port")."""
    me = pid or os.getpid()
    parent = procfs.parent_of(me)
    found = {me: f"rank {rank}"}
    for pid, state, its_parent, _ in procfs.process_table():
        if pid == me or state == "Z":
            continue
        environ = _environ(pid)
        number = environ.get("PADDLE_TRAINER_ID", "")
        if parent > 1 and its_parent == parent:
            found[pid] = f"rank {number}" if number.isdigit() else "a rank"
        elif number.isdigit() and store in (environ.get("PADDLE_MASTER"),
                                            f"{environ.get('MASTER_ADDR')}:{environ.get('MASTER_PORT')}"):
            found[pid] = f"rank {number}"
    return found


def _environ(pid: int) -> Dict[str, str]:
    """procfs.environ_of as text ({} when it cannot be read)."""
    raw = procfs.environ_of(pid) or {}
    return {name.decode(errors="replace"): value.decode(errors="replace") for name, value in raw.items()}


def _connections(ranks: Dict[int, str], owners: Dict[str, int], sockets, store_port: int) -> List[str]:
    """Established connections to a rank's socket whose other end, on this machine, is held
    by a process that is not a rank here."""
    by_ends = {(local, remote): inode for local, remote, _, inode in sockets if inode != "0"}
    lines = []
    for local, remote, state, inode in sockets:
        pid = owners.get(inode, 0)
        if state != ESTABLISHED or pid not in ranks or store_port in (local[1], remote[1]):
            continue
        other = owners.get(by_ends.get((remote, local), ""), 0)
        if other and other not in ranks:
            lines.append(f"{ranks[pid]}'s gloo socket {_text(local)} is connected from {_text(remote)}, "
                         f"held by {_process(other)}, not by a rank of the job")
    return lines


def _look(host: str, port: int, world: int, gid: int):
    """(socket inode -> pid, [(local, remote, state, inode)] of this machine's TCP sockets,
    _published): the sockets first, so that a key published after its listener opened is
    seen."""
    owners = procfs._socket_owners()
    sockets = [(_address(local), _address(remote), state, inode)
               for local, remote, state, inode in procfs._tcp_sockets()]
    return owners, sockets, _published(host, port, world, gid)


def _published(host: str, port: int, world: int, gid: int) -> Dict[Tuple[str, int], List[Tuple[str, int]]]:
    """{(key, rank): [(ip, port) of each of its listeners]} as gloo's keys in the store say
    now (keys not there yet are left out; {} when the store cannot be read)."""
    found = {}
    try:
        with storewire.Connection(host, port, timeout=2.0) as store:
            for key_of in (lambda r: f"{gid}/{r}", str):
                for rank in range(world):
                    if store.check(key_of(rank)):
                        found[(key_of(rank), rank)] = _addresses(store.get_now(key_of(rank)))
    except (OSError, ConnectionError):
        return {}
    return found


def _addresses(value: bytes) -> List[Tuple[str, int]]:
    out = []
    for at in range(0, len(value) - ADDRESS_BYTES + 1, ADDRESS_BYTES):
        family, port = struct.unpack_from("<H", value, at)[0], struct.unpack_from(">H", value, at + 2)[0]
        if family == socket.AF_INET:
            out.append((socket.inet_ntop(socket.AF_INET, value[at + 4:at + 8]), port))
        elif family == socket.AF_INET6:
            out.append((socket.inet_ntop(socket.AF_INET6, value[at + 8:at + 24]), port))
    return out


def _rewritten(ranks: Dict[int, str], owners: Dict[str, int], sockets,
               published: Dict[Tuple[str, int], List[Tuple[str, int]]]) -> List[str]:
    """Addresses in gloo's keys that a process other than the rank that published them
    listens on or holds here."""
    holders: Dict[Tuple[str, int], Set[int]] = {}
    for local, _, state, inode in sockets:
        if inode != "0" and state in (LISTEN, ESTABLISHED):
            holders.setdefault(local, set()).add(owners.get(inode, 0))
    lines = []
    for (key, rank), addresses in sorted(published.items()):
        for address in addresses:
            strangers = {pid for pid in holders.get(address, ()) if pid and pid not in ranks}
            if strangers:
                lines.append(f"gloo's key '{key}' in Paddle's store gives {_text(address)} as rank {rank}'s "
                             f"address, but {_process(min(strangers))} holds it: something outside the job "
                             "rewrote the key")
    return lines


def _moved(ranks: Dict[int, str], owners: Dict[str, int], sockets,
           published: Dict[Tuple[str, int], List[Tuple[str, int]]], store_port: int, me: int,
           before: Set[str], refused: Optional[Tuple[str, int]]) -> List[str]:
    """A key of one rank here rewritten to an address nobody here holds (module docstring):
    the rank whose key gives `refused`, or, without it, rank `me` (its sockets `before` aside)."""
    pid, number = _judged(ranks, published, me, refused)
    keys = [(key, at, address) for (key, rank), addresses in sorted(published.items()) if rank == number
            for at, address in enumerate(addresses)]
    given = {address for _, _, address in keys}
    listening = sorted(local for local, _, state, inode in sockets
                       if state == LISTEN and owners.get(inode) == pid and local[1] != store_port
                       and local[0] not in ("0.0.0.0", "::") and local not in given
                       and not (pid == me and inode in before))
    held = {local for local, _, state, inode in sockets if inode != "0" and state in (LISTEN, ESTABLISHED)}
    # A pair this rank connected from its side: the listener its record gives is closed, rightly.
    remotes = {remote for _, remote, state, inode in sockets if state == ESTABLISHED and owners.get(inode) == pid}
    wrong = [(key, address) for key, at, address in keys
             if address not in held and (refused is None or _same(address, refused))
             and _peer_record(published, key, number, at) not in remotes]
    if not (pid and listening and wrong):
        return []
    key, address = wrong[0]
    return [f"gloo's key '{key}' in Paddle's store gives {_text(address)} as {ranks[pid]}'s address, "
            f"but {ranks[pid]} (pid {pid}) listens on {_text(listening[0])}, which no key of it gives, and "
            "nothing here holds that address: something outside the job rewrote the key"]


def _judged(ranks: Dict[int, str], published, me: int, refused: Optional[Tuple[str, int]]) -> Tuple[int, int]:
    """(pid, rank) that _moved judges: with `refused`, the rank here, other than `me`,
    whose key gives that address; else `me`. (0, -1) when there is none."""
    if refused is None:
        number = ranks[me].rpartition(" ")[2]
        return (me, int(number)) if number.isdigit() else (0, -1)
    for (_, rank), addresses in sorted(published.items()):
        pid = next((pid for pid, label in ranks.items() if label == f"rank {rank}" and pid != me), 0)
        if pid and any(_same(address, refused) for address in addresses):
            return pid, rank
    return 0, -1


def _peer_record(published, key: str, rank: int, at: int) -> Optional[Tuple[str, int]]:
    """The address the peer of record `at` in rank `rank`'s `key` gave for that pair: gloo's
    key of a rank lists one listener per peer, in rank order, itself left out."""
    prefix = key[:len(key) - len(str(rank))]
    peer = at if at < rank else at + 1
    records = published.get((f"{prefix}{peer}", peer), [])
    mine = rank if rank < peer else rank - 1
    return records[mine] if mine < len(records) else None


def _same(address: Tuple[str, int], printed: Tuple[str, int]) -> bool:
    """Whether `address` is the one gloo's error printed (its port as stored: byte-swapped
    on a little-endian machine)."""
    return address[0] == printed[0] and address[1] in (printed[1], socket.ntohs(printed[1]))


def _address(kernel: Tuple[str, int]) -> Tuple[str, int]:
    return procfs._ip(kernel[0]), kernel[1]


def _text(address: Tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def _process(pid: int) -> str:
    return f"pid {pid} ({' '.join(procfs.cmdline(pid))[:80]})"
