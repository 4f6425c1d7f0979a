"""paddle_dist/launch/isolate.py for real: a process (and what it starts) moved into a network
namespace of its own has a loopback of its own, up, and nothing of the machine's; as a
user other than root it keeps its uid (a user namespace mapping it to itself). The
non-root case runs as uid 65534 through isolate.py as a script, as a launcher that is not
root does (rerun_inside); it needs root to drop to that uid, and an interpreter that uid
can run."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ISOLATE = str(Path(__file__).resolve().parents[3] / "paddle_dist" / "launch" / "isolate.py")
TOKEN = b"outside"
REPORT = ("import json, os, socket, sys; s = socket.create_server(('127.0.0.1', 0)); port = sys.argv[1:] and int(sys.argv[1])\n"
          "def reached():\n"
          "    c = socket.socket(); c.settimeout(10)\n"
          "    if c.connect_ex(('127.0.0.1', port)) != 0: return False\n"
          "    try: return c.recv(16) == %r\n"
          "    except OSError: return False\n"
          "print(json.dumps({'interfaces': [n for _, n in socket.if_nameindex()], 'uid': os.geteuid(), "
          "'net': os.readlink('/proc/self/ns/net'), 'reached': bool(port) and reached()}))" % TOKEN)


@pytest.fixture
def outside():
    """A listener on this machine's loopback, which nothing inside may reach. It answers
    every connection with TOKEN, so that only a connection to it counts as reaching it: a
    connection inside to the same port number (the report's own listener drawn on it, or
    a socket connected to itself) does not."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(TOKEN)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(timeout=10)


def _inside(prefix, python, port) -> dict:
    result = subprocess.run(prefix + [python, ISOLATE, python, "-c", REPORT, str(port)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_root_gets_a_loopback_of_its_own(outside):
    if os.geteuid() != 0:
        pytest.skip("a network namespace alone needs root (other users: the next test)")
    seen = _inside([], sys.executable, outside)
    assert seen["interfaces"] == ["lo"] and seen["uid"] == 0 and not seen["reached"]
    assert seen["net"] != os.readlink("/proc/self/ns/net")


def test_another_user_keeps_its_uid_inside(outside):
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not shutil.which("setpriv") or not system_python:
        pytest.skip("needs root (to run as uid 65534 with setpriv) and /usr/bin/python3")
    seen = _inside(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"], system_python, outside)
    assert seen["interfaces"] == ["lo"] and seen["uid"] == 65534 and not seen["reached"]


def test_a_job_on_several_machines_is_refused_in_one_line():
    from paddle_dist.launch import job
    from paddle_dist import config
    from paddle_dist.errors import UserError

    cfg = config.load(None, ["dist.isolate=true", "dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    with pytest.raises(UserError) as caught:
        job.isolate_if_asked(cfg)
    assert str(caught.value) == ("dist.isolate=true keeps a job inside one machine's private loopback; a job on "
                                 "several machines cannot use it: remove -o dist.isolate=true")
