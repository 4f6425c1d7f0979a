"""The `machine` fixture: a shared machine of its own for a test, with another user on it.

A mount namespace with its own /dev/shm (a fresh tmpfs) and a network namespace with its
own loopback, both kept by bind mounts in a private folder under /run, so that the job
and the other user (uid 65534, dropped to with setpriv) meet there and nowhere else: what
the other user plants or connects to touches no other job on this machine. Everything is
unmounted afterwards, whatever happens; a machine that cannot build it (not root, no
unshare, nsenter or setpriv) skips the test, saying why.

Example:
    def test_x(machine):
        procs.run(machine.cmd([PY, "train.py", ...]))
        procs.run(machine.outsider(["read", "/some/file"]))
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterator, List

import pytest

from .procs import PY, ROOT

NOBODY = "65534"
OUTSIDER = str(ROOT / "tests" / "integration" / "scripts" / "outsider.py")


@dataclass(frozen=True)
class Machine:
    folder: str

    def cmd(self, argv: List[str]) -> List[str]:
        """`argv` run on this machine (its /dev/shm, its network), from the repository root."""
        return ["nsenter", f"--mount={self.folder}/mnt", f"--net={self.folder}/net", f"--wd={ROOT}",
                "--", *argv]

    def outsider(self, argv: List[str]) -> List[str]:
        """tests/integration/scripts/outsider.py `argv`, run on this machine as uid 65534."""
        return self.cmd(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                         PY, OUTSIDER, *argv])


def unavailable_reason() -> str:
    if os.geteuid() != 0:
        return "needs root: another user is played by uid 65534 (setpriv), in namespaces of the test's own"
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "mount", "ip") if shutil.which(tool) is None]
    return f"needs {', '.join(missing)} (util-linux, iproute2)" if missing else ""


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def make_machine() -> Iterator[Machine]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    folder = tempfile.mkdtemp(prefix="paddle_dist-machine-", dir="/run" if os.access("/run", os.W_OK) else None)
    mounted: List[str] = []
    try:
        try:
            _run("mount", "--bind", folder, folder)
            mounted.append(folder)
            _run("mount", "--make-private", folder)
            for name in ("mnt", "net"):
                open(os.path.join(folder, name), "w").close()
            _run("unshare", f"--mount={folder}/mnt", f"--net={folder}/net", "--propagation", "private", "true")
            mounted[:0] = [f"{folder}/mnt", f"{folder}/net"]
            _run("nsenter", f"--mount={folder}/mnt", "mount", "-t", "tmpfs", "-o", "mode=1777,size=1g",
                 "tmpfs", "/dev/shm")
            _run("nsenter", f"--net={folder}/net", "ip", "link", "set", "lo", "up")
        except (OSError, subprocess.SubprocessError) as e:
            pytest.skip(f"cannot build a namespace of the test's own here: {e}")
        yield Machine(folder)
    finally:
        for path in mounted:
            subprocess.run(["umount", "--lazy", path], capture_output=True, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def machine() -> Iterator[Machine]:
    with make_machine() as built:
        yield built
