"""mpirun's part of a launch (OpenMPI): its hostfile, its master and its command line.

Example:
    mpirun_argv(4, "hosts", {"PADDLE_DIST_SUPERVISED": "1"}, ("train.py",), ["-o", "x=1"])
    # ('mpirun', '-n', '4', '--allow-run-as-root', '--hostfile', 'hosts', '-x', 'PADDLE_DIST_SUPERVISED', ...)
"""

from __future__ import annotations

import sys
from typing import Dict, Sequence, Tuple
from ..schema import Config


def _hostfile_entries(path: str):
    """The word lists of an OpenMPI hostfile's lines, comments and blank lines left out."""
    for line in open(path).read().splitlines():
        words = line.split("#")[0].split()
        if words:
            yield words


def hostfile_slots(path: str) -> int:
    """Total slots of an OpenMPI hostfile ("node1 slots=8" lines; a bare host is 1 slot)."""
    total = 0
    for words in _hostfile_entries(path):
        slots = [w.split("=", 1)[1] for w in words[1:] if w.startswith(("slots=", "max_slots="))]
        total += int(slots[0]) if slots and slots[0].isdigit() else 1
    return max(total, 1)


def hostfile_first_host(path: str) -> str:
    return next((words[0] for words in _hostfile_entries(path)), "127.0.0.1")


def master_variables(cfg: Config) -> Dict[str, str]:
    """MASTER_ADDR/MASTER_PORT for mpirun ranks: `dist.master` (resolve() fills in a free
    port on the hostfile's first host when it is not given: launch/job.py)."""
    host, _, port = cfg.dist.master.rpartition(":")
    return {"MASTER_ADDR": host, "MASTER_PORT": port}


def mpirun_argv(nprocs: int, hostfile: str, variables: Dict[str, str], program: Sequence[str],
                script_args: Sequence[str]) -> Tuple[str, ...]:
    # --allow-run-as-root: containers often run as root, where mpirun refuses to start
    # otherwise; for other users the option changes nothing.
    argv = ["mpirun", "-n", str(nprocs), "--allow-run-as-root"]
    if hostfile:
        argv += ["--hostfile", hostfile]
    for name in sorted(variables):
        argv += ["-x", name]                 # mpirun passes only the variables it is told to
    return tuple(argv + [sys.executable, *program, *script_args])
