"""Another user of a shared machine (run as uid 65534 by tests/integration/test_shared_machine.py),
doing what such a user can: plant files in /dev/shm under names a job may use, write into
Paddle's store, connect to the job's listening sockets, read the job's files. Standard
library only (paddle_dist.security.storewire for the store's protocol). Each action prints one JSON
line of what it did; those that run beside a job go on until their stdin closes.

Usage:
    outsider.py squat                       make /dev/shm/paddle_dist-<uid of root> a link to a folder of ours
    outsider.py plant TARGET RUN_DIR        while the job runs: at every heartbeat and stack name
                                            the job's ranks could use in /dev/shm, a link to TARGET,
                                            and a heartbeat of ours that claims progress for ever
    outsider.py forge                       a verdict "ok" in the job's store (the new listener bound
                                            to every address)
    outsider.py poke                        a bare connection to every new listener, kept open
    outsider.py rewrite [PORT]              gloo's address key of one rank of two in the job's store,
                                            to PORT (256), which nobody listens on
    outsider.py read PATH...                which of PATHs it can read
"""

import hashlib
import json
import os
import select
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from paddle_dist.security import storewire  # noqa: E402

SHM = "/dev/shm"
BEAT_FORMAT = "<dqq24sqqd"         # paddle_dist/runtime/watchdog.py
POLL_S = 0.005


def stdin_open(seconds: float = POLL_S) -> bool:
    return not select.select([sys.stdin], [], [], seconds)[0]


def say(**what) -> None:
    print(json.dumps(what), flush=True)


def squat() -> None:
    mine = os.path.join(SHM, f"outsider-{os.getpid()}")
    os.mkdir(mine)
    os.chmod(mine, 0o777)
    os.symlink(mine, os.path.join(SHM, "paddle_dist-0"))
    say(squatted=os.path.join(SHM, "paddle_dist-0"), to=mine)


def rank_pids(seen: set) -> list:
    """Processes running paddle_dist's built-in job (their command lines are public)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in seen:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"train.py") for a in argv):
            found.append(int(entry))
    return found


def plant(target: str, run_dir: str) -> None:
    """The names a job's ranks used in /dev/shm: paddle_dist-beat-<pid>-<sha1(run dir)[:12]>-rank<N>
    (and .stack); a link to `target` at each, for every process of the job as it appears."""
    key = hashlib.sha1(run_dir.encode()).hexdigest()[:12]
    beat = os.path.join(SHM, f"paddle_dist-beat-{os.getpid()}-{key}-rank7")
    with open(beat, "wb") as f:
        f.write(struct.pack(BEAT_FORMAT, 1e12, 10 ** 6, 1, b"", 0, 0, 0.0))
    os.chmod(beat, 0o644)
    seen, links = set(), []
    while stdin_open():
        for pid in rank_pids(seen):
            seen.add(pid)
            for rank in range(4):
                for suffix in ("", ".stack"):
                    path = os.path.join(SHM, f"paddle_dist-beat-{pid}-{key}-rank{rank}{suffix}")
                    try:
                        os.symlink(target, path)
                        links.append(path)
                    except OSError:
                        pass
    say(links=len(links), processes=len(seen), beat=beat)


def listeners(everywhere_only: bool) -> set:
    """(address, port) of the TCP sockets listening now, as /proc/net/tcp shows them."""
    found = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, _, state = line.split()[1:4]
            if state != "0A":
                continue
            host, port = local.split(":")
            if everywhere_only and host != "00000000":
                continue
            address = socket.inet_ntoa(struct.pack("<I", int(host, 16)))
            found.add(("127.0.0.1" if address == "0.0.0.0" else address, int(port, 16)))
    return found


def forge() -> None:
    before = listeners(True)
    while stdin_open():
        new = listeners(True) - before
        if new:
            host, port = sorted(new)[0]
            with storewire.Connection(host, port, timeout=30, deadline=time.monotonic() + 30) as store:
                store.set("paddle_dist/verdict", b"ok")
                say(forged=f"{host}:{port}")
                while stdin_open(1.0):
                    pass
            return
    say(forged=None)


def rewrite(port: int = 256) -> None:
    """As soon as both ranks of a job of two have published their gloo address (keys `0` and
    `1`), give the one that waits for its peer `port` instead, which nobody listens on.
    gloo decides which side of a pair connects from the addresses: the higher IPv4 address,
    then the higher port as the machine reads its stored bytes (little-endian here). 256
    (stored 01 00) makes the peer the one to connect, and it is refused there, while the
    rank keeps listening where nothing comes; 65279 (FE FF) makes both wait."""
    before = listeners(True)
    while stdin_open():
        new = listeners(True) - before
        if new:
            with storewire.Connection(*sorted(new)[0], timeout=60, deadline=time.monotonic() + 60) as store:
                values = {key: store.get(key) for key in ("0", "1")}
                key = min(values, key=lambda k: (values[k][4:8], struct.unpack("<H", values[k][2:4])))
                value = bytearray(values[key])
                value[2:4] = struct.pack(">H", port)
                store.set(key, bytes(value))
                store.check(key)
                say(rewritten=key, ports={k: struct.unpack(">H", v[2:4])[0] for k, v in values.items()})
                while stdin_open(1.0):
                    pass
            return
    say(rewritten=None)


def poke() -> None:
    before, held = listeners(False), []
    while stdin_open():
        for where in sorted(listeners(False) - before):
            before.add(where)
            try:
                held.append(socket.create_connection(where, timeout=1))
            except OSError:
                pass
    say(poked=len(held))
    for conn in held:
        conn.close()


def read(paths) -> None:
    readable = []
    for path in paths:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb") as f:
                    f.read(1)
            readable.append(path)
        except OSError:
            pass
    say(readable=readable)


if __name__ == "__main__":
    action, args = sys.argv[1], sys.argv[2:]
    if action == "squat":
        squat()
    elif action == "plant":
        plant(*args)
    elif action == "forge":
        forge()
    elif action == "poke":
        poke()
    elif action == "rewrite":
        rewrite(*map(int, args))
    elif action == "read":
        read(args)
