"""All-reduce bandwidth sweep, printed in the table format of nccl-tests' `all_reduce_perf`.

Usage (every rank runs it; rank 0 prints):
    python -m paddle.distributed.launch --nproc_per_node 2 tools/allreduce_perf.py -b 8 -e 128M -f 2
    python -m paddle_dist.launch --nprocs 2 tools/allreduce_perf.py --transport shm
    # or `python -m paddle_dist.allreduce_perf` as the rank's command, under mpirun / srun /
    # torchrun-style variables, or paddle.distributed.spawn(run, args=(argv,))

Flags: -b/--minbytes (8) -e/--maxbytes (32M) -f/--stepfactor (2) -n/--iters (20)
-w/--warmup_iters (5) -c/--check (1) -d/--datatype (float32|float16|int32|int64; float,
half) --min-busbw GBPS (exit 1 below it) --inject-error (rank 1 corrupts its result: the
check must count it) --transport NAME (sync/transports.py: backend, the process group's
all_reduce; shm or another entry, the gradient sync's reducer through it; float32 only)
--json PATH (rank 0 also writes the rows as JSON). Sizes take K/M/G suffixes (powers of 1024).

What the columns mean:
- time: microseconds per all_reduce, the mean of `iters` back-to-back calls started after
  a barrier (the device is synchronised before the clock stops); the slowest rank's value.
- out-of-place: Paddle's all_reduce works in place, so each iteration first copies the
  input into a separate output tensor; that copy is INSIDE the timed region (timing each
  call alone would let a peer's copy leak into this rank's wait anyway), so out-of-place
  times are an upper bound. In-place reduces one buffer repeatedly.
- algbw = size / time (GB/s, 1e9 bytes); busbw = algbw * 2(n-1)/n, the per-link traffic
  of a ring all-reduce, comparable across world sizes.
- #wrong: with -c 1, each size is reduced once more from known inputs (small integers, so
  every sum is exact in every type) and differing elements are counted over all ranks.
  Measured with Paddle 3.3.1's CPU build: gloo's float16 all_reduce returns inf, so
  `-d half` fails the check there; it is Paddle's bug, and the check is what shows it.

Exit codes: 0; 1 when the check found wrong values or the average bus bandwidth is below
--min-busbw (every rank agrees, because the numbers are reduced across ranks); 2 for bad
flags. `paddle.distributed.launch` replaces a failing rank's code with its own non-zero one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .errors import ConfigError, UserError
from .options import ArgParser, rank_exit_code, run as run_command
from .sync import transports
from .runtime.env import DistEnv

PROG = "allreduce_perf"
UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
# --datatype -> (paddle/numpy dtype, name in the table as nccl-tests prints it, bytes)
DTYPES = {"float32": ("float32", "float", 4), "float16": ("float16", "half", 2),
          "int32": ("int32", "int32", 4), "int64": ("int64", "int64", 8)}
ALIASES = {"float": "float32", "half": "float16"}
COLUMNS = ("#       size         count      type   redop    root"
           "     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
           "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
           "            (us)  (GB/s)  (GB/s)       ")


# ---------------------------------------------------------------- flags (no paddle needed)
def parse_size(text: str) -> int:
    """Bytes from '8', '64K', '128M', '1G' (powers of 1024).

    Example:
        parse_size("128M")   # 134217728
    """
    number, unit = text.strip()[:-1], text.strip()[-1:].upper()
    if unit.isdigit():
        number, unit = text.strip(), ""
    if unit not in UNITS or not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive integer with an "
                                         "optional K, M or G suffix, e.g. 8, 64K, 128M")
    return int(number) * UNITS[unit]


def _datatype(text: str) -> str:
    name = ALIASES.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"datatype {text!r} must be one of "
                                         f"{', '.join(list(DTYPES) + list(ALIASES))}")
    return name


def _nonneg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative integer")
    return int(text)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags of nccl-tests that make sense here; bad ones exit 2 with one line.

    Example:
        parse_args(["-b", "8", "-e", "64K", "-f", "4"]).maxbytes   # 65536
    """
    p = ArgParser(prog=PROG, description="All-reduce bandwidth sweep (nccl-tests format).")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=32 * 1024 ** 2)
    p.add_argument("-f", "--stepfactor", type=_nonneg, default=2, help="multiply the size by this")
    p.add_argument("-n", "--iters", type=_nonneg, default=20)
    p.add_argument("-w", "--warmup_iters", type=_nonneg, default=5)
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1)
    p.add_argument("-d", "--datatype", type=_datatype, default="float32")
    p.add_argument("--min-busbw", type=float, default=None, metavar="GBPS",
                   help="exit 1 when the average bus bandwidth is below this (GB/s)")
    p.add_argument("--inject-error", action="store_true",
                   help="testing: rank 1 adds 1 to its result before the check")
    p.add_argument("--transport", choices=tuple(transports.REGISTRY), default=transports.BACKEND.name,
                   help="backend: the process group's all_reduce (gloo, NCCL); another: that "
                        "transport's reducer (sync/transports.py; shm: through /dev/shm, for "
                        "ranks on one machine), float32 only")
    p.add_argument("--json", metavar="PATH", help="rank 0 also writes the results here")
    args = p.parse_args(argv)
    if args.stepfactor < 2 or args.iters < 1 or args.minbytes > args.maxbytes:
        p.error("need -f >= 2, -n >= 1 and -b <= -e")
    if args.transport != transports.BACKEND.name and args.datatype != "float32":
        p.error(f"--transport {args.transport} reduces float32 only; use -d float32")
    return args


def sizes(minbytes: int, maxbytes: int, factor: int, elem: int) -> List[int]:
    """Message sizes in bytes, each a whole number of elements (at least one), no repeats.

    Example:
        sizes(8, 64 * 1024, 4, 4)   # [8, 32, 128, 512, 2048, 8192, 32768]: 131072 > 64K
        sizes(1, 16, 2, 4)          # [4, 8, 16]
    """
    out, size = [], minbytes
    while size <= maxbytes:
        rounded = max(size // elem, 1) * elem
        if not out or rounded != out[-1]:
            out.append(rounded)
        size *= factor
    return out


# ---------------------------------------------------------------- measuring
@dataclass
class Result:
    time_us: float
    wrong: Optional[int]   # None when not checked


def bandwidths(size: int, time_us: float, world: int):
    """(algbw, busbw) in GB/s.

    Example:
        bandwidths(1_000_000, 1000.0, 2)   # (1.0, 1.0)
        bandwidths(1_000_000, 1000.0, 4)   # (1.0, 1.5)
    """
    algbw = size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return algbw, algbw * 2 * (world - 1) / world


def open_reducer(env: DistEnv, name: str, count: int):
    """The reducer of transport `name` (an entry of sync/transports.py) for `count` float32
    values; None for the backend, measured as the process group's own all_reduce of the
    tensor (any dtype, GPUs too), and for a rank alone. Collective.

    Example:
        open_reducer(env, "shm", 1 << 20)      # a shm.ShmReducer on 2 ranks of one machine
    """
    if name == transports.BACKEND.name or not env.is_distributed:
        return None
    try:
        return transports.REGISTRY[name].open(env, count)
    except ConfigError as e:            # its advice names sync.transport; here it is a flag
        reason = str(e).split("; use ")[0]
        raise UserError(f"--transport {name}: {reason}; use --transport backend") from None


class Bench:
    """The collectives of one process: a no-op reduce when it is alone."""

    def __init__(self, env: DistEnv, args):
        import paddle
        import paddle.distributed as dist

        self.paddle, self.dist, self.env, self.args = paddle, dist, env, args
        self.dtype = DTYPES[args.datatype][0]
        self.reducer = open_reducer(env, args.transport, max(args.maxbytes // 4, 1))

    def reduce(self, tensor, op=None):
        if self.env.is_distributed:
            self.dist.all_reduce(tensor, op=op if op is not None else self.dist.ReduceOp.SUM)

    def reduce_data(self, tensor):
        """The measured all-reduce: through the chosen transport."""
        if self.reducer is None:
            return self.reduce(tensor)
        from . import compat

        self.reducer.all_reduce([compat.numpy_view(tensor)])

    def sync(self):
        if self.env.device.startswith("gpu"):
            self.paddle.device.synchronize()

    def barrier(self):
        self.sync()
        if self.env.is_distributed:
            self.dist.barrier()

    def fill(self, count: int):
        """This rank's check input: element i is ((i + rank) % 7) + 1; and the exact sum."""
        import numpy as np

        index = np.arange(count, dtype=np.int64)
        values = [((index + r) % 7 + 1) for r in range(self.env.world_size)]
        mine = self.paddle.to_tensor(values[self.env.global_rank].astype(self.dtype))
        return mine, np.sum(values, axis=0).astype(self.dtype)

    def timed(self, count: int, in_place: bool) -> float:
        """Microseconds per call, the slowest rank's (so every rank holds the same number)."""
        data, _ = self.fill(count)
        out = data if in_place else self.paddle.empty_like(data)
        for _ in range(self.args.warmup_iters):
            self._step(data, out, in_place)
        self.barrier()
        start = time.perf_counter()
        for _ in range(self.args.iters):
            self._step(data, out, in_place)
        self.sync()
        elapsed = (time.perf_counter() - start) / self.args.iters * 1e6
        self.barrier()   # outside the clock: only lines the ranks up for the next size
        return self.agreed(elapsed, float_max=True)

    def _step(self, data, out, in_place: bool):
        if not in_place:
            self.paddle.assign(data, output=out)   # a copy: all_reduce would overwrite data
        self.reduce_data(out)

    def wrong(self, count: int, in_place: bool) -> int:
        """Elements that differ from the exact sum after one reduce, summed over ranks."""
        data, expected = self.fill(count)
        out = data if in_place else data.clone()
        self.reduce_data(out)
        if self.args.inject_error and self.env.global_rank == 1:
            out = out + self.paddle.ones_like(out)
        return int(self.agreed(int((out.numpy() != expected).sum())))

    def agreed(self, value, float_max: bool = False):
        """`value` combined over ranks: the maximum (floats) or the sum (counts)."""
        tensor = self.paddle.to_tensor([value], dtype="float64" if float_max else "int64")
        self.reduce(tensor, self.dist.ReduceOp.MAX if float_max else None)
        return tensor.numpy()[0].item()

    def measure(self, count: int, in_place: bool) -> Result:
        time_us = self.timed(count, in_place)
        return Result(time_us, self.wrong(count, in_place) if self.args.check else None)


# ---------------------------------------------------------------- printing
def row(size: int, count: int, type_name: str, results: Sequence[Result], world: int) -> str:
    """One table line: size, count, type, redop, root, then time algbw busbw #wrong twice.

    Example:
        row(1024, 256, "float", [Result(100.0, 0), Result(90.0, 0)], 2).split()[:5]
        # ['1024', '256', 'float', 'sum', '-1']
    """
    text = f"{size:>12}  {count:>12}  {type_name:>8}  {'sum':>6}  {-1:>6}"
    for result in results:
        algbw, busbw = bandwidths(size, result.time_us, world)
        wrong = "N/A" if result.wrong is None else str(result.wrong)
        text += f"  {_time(result.time_us):>7}  {algbw:>6.2f}  {busbw:>6.2f}  {wrong:>5}"
    return text


def _time(us: float) -> str:
    return f"{us:.2f}" if us < 1e4 else f"{us:.1f}" if us < 1e6 else f"{us:.0f}"


def header(args, env: DistEnv, devices: Sequence[str]) -> List[str]:
    """The '#' lines before the table: parameters, world, one line per rank."""
    import paddle

    lines = [f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} "
             f"step: {args.stepfactor}(factor) warmup iters: {args.warmup_iters} "
             f"iters: {args.iters} validation: {args.check}",
             "#",
             f"# World size {env.world_size}, backend {env.backend}, transport {args.transport}, "
             f"launcher {env.launcher}, Paddle {paddle.__version__}",
             "# Out-of-place time includes copying the input into the output tensor "
             "(Paddle's all_reduce is in place).",
             "#",
             "# Using devices"]
    return lines + list(devices) + ["#", *COLUMNS]


def footer(wrong_total: int, checked: bool, avg_busbw: float) -> List[str]:
    """The '#' lines after the table, as nccl-tests prints them.

    Example:
        footer(0, True, 1.25)[0]   # '# Out of bounds values : 0 OK'
    """
    state = "OK" if wrong_total == 0 else "FAILED"
    shown = str(wrong_total) if checked else "N/A"
    return [f"# Out of bounds values : {shown} {state}",
            f"# Avg bus bandwidth    : {avg_busbw:.4f}", "#"]


# ---------------------------------------------------------------- entry point
def _start(args):
    """Detect this process, select its device and start the process group (paddle_dist)."""
    from . import config
    from .runtime import process

    with process.quiet_paddle():
        return process.setup(config.load())


def _devices(bench) -> List[str]:
    me = f"#  Rank {bench.env.global_rank:>2} Pid {os.getpid():>7} on {socket.gethostname()} " \
         f"device {bench.env.device}"
    if not bench.env.is_distributed:
        return [me]
    gathered: list = []
    bench.dist.all_gather_object(gathered, me)
    return gathered


def sweep(args, env: DistEnv) -> int:
    """Run every size, print the table on rank 0; returns the exit code."""
    bench = Bench(env, args)
    say = print if env.is_main else (lambda *a, **k: None)
    for line in header(args, env, _devices(bench)):
        say(line, flush=True)
    _, type_name, elem = DTYPES[args.datatype]
    busbws, wrong_total, rows = [], 0, []
    for size in sizes(args.minbytes, args.maxbytes, args.stepfactor, elem):
        results = [bench.measure(size // elem, in_place) for in_place in (False, True)]
        busbws += [bandwidths(size, r.time_us, env.world_size)[1] for r in results]
        wrong_total += sum(r.wrong or 0 for r in results)
        say(row(size, size // elem, type_name, results, env.world_size), flush=True)
        rows.append(_json_row(size, size // elem, results, env.world_size))
    avg = sum(busbws) / len(busbws)
    for line in footer(wrong_total, bool(args.check), avg):
        say(line, flush=True)
    if args.json and env.is_main:
        Path(args.json).write_text(json.dumps({
            "world_size": env.world_size, "backend": env.backend, "transport": args.transport,
            "datatype": args.datatype, "rows": rows, "avg_busbw": avg, "wrong": wrong_total}, indent=1))
    return verdict(wrong_total, avg, args.min_busbw, say)


def _json_row(size: int, count: int, results: Sequence[Result], world: int) -> dict:
    out = {"size": size, "count": count}
    for name, result in zip(("out_of_place", "in_place"), results):
        algbw, busbw = bandwidths(size, result.time_us, world)
        out[name] = {"time_us": result.time_us, "algbw": algbw, "busbw": busbw, "wrong": result.wrong}
    return out


def verdict(wrong_total: int, avg_busbw: float, min_busbw: Optional[float], say) -> int:
    """0, or 1 with one line on stderr naming what failed.

    Example:
        verdict(0, 1.2, 5.0, print)   # prints the gate line, returns 1
    """
    if wrong_total:
        say(f"{PROG}: FAILED: {wrong_total} wrong values after all_reduce", file=sys.stderr)
        return 1
    if min_busbw is not None and avg_busbw < min_busbw:
        say(f"{PROG}: FAILED: average bus bandwidth {avg_busbw:.4f} GB/s is below the "
            f"--min-busbw gate of {min_busbw:g} GB/s", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, join the process group, sweep; returns the exit code.

    Example:
        main(["-b", "8", "-e", "64K", "-f", "4"])   # 0
    """
    args = parse_args(argv)   # before importing paddle: a bad flag fails in a blink
    return sweep(args, _start(args))


def run(argv: Optional[Sequence[str]] = None) -> None:
    """`main` turned into the process's exit code (as options.run does; a spawned rank that
    ends well returns instead of exiting): the function to hand to spawn.

    Example:
        paddle.distributed.spawn(run, args=(["-e", "1M"],), nprocs=2)
    """
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - every ending becomes an exit code
        code = rank_exit_code(exc)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    run_command(main)
