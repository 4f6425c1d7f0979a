"""The self-test's plan: its rows in order, each check's deadline and the function of
doctor/checks.py (or checks_amp.py) that runs it, with what both sides share (the first row's
name, the config file's). The standard library only: the parent (selftest.py) reads it to
size its deadline and print the table without importing paddle; each rank
(selftest_rank.py) binds every entry to its check function.

Example:
    [(c.name, c.seconds) for c in PLAN][:2]      # [('all-reduce float32', 30), ('all-reduce float64', 30)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

SETUP = "process group"       # the first row: process.setup, under its own (rendezvous) deadline
CONFIG_FILE = "config.json"   # in the job's folder: the config, as selftest.py wrote it
DTYPES = ("float32", "float64", "int32", "int64", "float16", "bfloat16")


@dataclass(frozen=True)
class PlannedCheck:
    name: str
    seconds: float                      # the deadline on each rank
    function: str                       # its function in doctor/checks.py, or "module.function" of doctor/
    args: Tuple[str, ...] = ()          # given to the function before the rank's Job
    first_only: bool = False            # global rank 0 alone (the others report nothing)


PLAN = ([PlannedCheck(f"all-reduce {d}", 30, "all_reduce", (d,)) for d in DTYPES]
        + [PlannedCheck("grad sync fused", 60, "grad_sync", ("fused",)),
           PlannedCheck("grad sync overlap", 60, "grad_sync", ("overlap",)),
           PlannedCheck("grad sync dataparallel", 60, "grad_sync", ("dataparallel",)),
           PlannedCheck("checkpoint + RNG", 60, "checkpoint_round_trip")]
        + [PlannedCheck(f"AMP {d} {level}" + (" + GradScaler" if d == "float16" else ""), 120,
                        "checks_amp.amp_step", (d, level)) for level in ("O1", "O2") for d in ("float16", "bfloat16")]
        + [PlannedCheck("export + predict", 120, "export_predict", first_only=True),
           PlannedCheck("overlap on a CUDA side stream", 60, "side_stream_overlap", first_only=True)])
