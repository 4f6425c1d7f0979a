"""Training throughput across a slow link: paddle_dist's sync options side by side, with
the ranks on two "hosts" (network namespaces) joined by a rate-limited veth pair.

Usage (root; iproute2's `ip`, and `tc` unless --link none):
    python tools/bench_link.py --model lenet --link 100mbit [--reps 3] [--json out.json]
    python tools/bench_link.py --link none --variants dataparallel,fused
    python tools/bench_link.py --variant default= --ranks-per-host 2

The two hosts are 198.18.0.1 and 198.18.0.2 (tools/netns.py), built for this run
and deleted afterwards, whatever happens. `--link RATE` shapes both ends of the veth
pair with `tc qdisc add dev VETH root tbf rate RATE burst 32kb latency 400ms` (a token
bucket: bandwidth, no added delay; a larger burst would let each step's gradients through
unshaped). Each host runs `train.py -o dist.nnodes=2 -o dist.node_rank=R -o
dist.master=198.18.0.1:PORT -o dist.nprocs=K` on synthetic MNIST-shaped data
(configs/synthetic_lenet.yaml), so every gradient sync crosses the link.

What is measured: samples/s as train.py reports it in metrics.json (rank 0's training
time over all `--steps` steps; start-up and evaluation excluded, the first step included).
Every process runs one OpenMP thread. The variants run interleaved (rep 1 of each, then
rep 2, ...), each rep in a rotated order, as in bench_train.py; the table shows medians.

- vs ref = samples/s / that of the reference, dataparallel (sync.mode=dataparallel),
  the median of the ratios within each rep; the reference is always measured
- link MB/step = bytes the veth pair carried during the run (both directions, start-up
  and evaluation included) / steps

Variants (--variants, comma-separated; default: all four):
- dataparallel: paddle.DataParallel's reducer inside backward() (sync.mode=dataparallel)
- fused: one flat all-reduce per optimizer step (sync.mode=fused)
- overlap: buckets all-reduced during backward() as they fill (sync.mode=overlap)
- bf16: fused, with the gradients all-reduced in bfloat16 (sync.compress=bf16): half the bytes
- NAME=key=value,key=value (--variant, repeatable): config overrides; NAME= alone is
  the default config (e.g. --variant default=)

Where the hosts cannot be built (not root, no `ip`, no `tc`, namespaces refused) it says
why in one line and exits 0, with "status": "skipped" in --json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench_train  # noqa: E402  (one-line errors, threads per rank, running commands together)
from paddle_dist import config as configlib  # noqa: E402  (paddle-free)
import netns  # noqa: E402  (tools/netns.py)
from paddle_dist.errors import UserError  # noqa: E402

PROG = "bench_link"
CONFIG = "configs/synthetic_lenet.yaml"
REFERENCE = "dataparallel"
# Each names its mode, so that a change of the default sync changes no variant here.
BUILTIN = {"dataparallel": ["sync.mode=dataparallel"], "fused": ["sync.mode=fused"],
           "overlap": ["sync.mode=overlap"], "bf16": ["sync.mode=fused", "sync.compress=bf16"]}
DEFAULT_STEPS = {"lenet": 200, "mlp": 100}
FIRST_PORT = 6170          # node 0's rendezvous; a new one per run (the namespaces are ours alone)
# tc's rate: a number and an optional unit (tc_util.c's get_rate; no unit = bits/s).
RATE = re.compile(r"(\d+\.?\d*|\.\d+)(bit|[kmgt]i?bit|bps|[kmgt]i?bps)?", re.IGNORECASE)


def _fail(message: str) -> None:
    bench_train._fail(message, PROG)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = bench_train._Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    positive = bench_train._positive
    p.add_argument("--link", default="100mbit", help="tc rate of the link, e.g. 100mbit, 1gbit; "
                                                     "none: no shaping (100mbit)")
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    p.add_argument("--ranks-per-host", type=int, choices=(1, 2), default=1,
                   help="ranks on each of the two hosts (1)")
    p.add_argument("--batch", type=positive, default=64, help="samples per rank per step (64)")
    p.add_argument("--steps", type=positive, help="steps per run (lenet 200, mlp 100)")
    p.add_argument("--reps", type=positive, default=3, help="repetitions of each run (3)")
    p.add_argument("--variants", default=",".join(BUILTIN),
                   help=f"comma-separated, from {', '.join(BUILTIN)} (default: all)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=[KEY=VALUE[,KEY=VALUE]]",
                   help="an extra variant with config overrides (repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=positive, default=600, help="seconds per run (600)")
    args = p.parse_args(argv)
    if args.link != "none" and not _is_rate(args.link):
        _fail(f"--link {args.link!r} is not a tc rate; give e.g. 100mbit, 1gbit, 500kbit, or none")
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    args.variants = _variants(args)
    for overrides in args.variants.values():
        _check_overrides(args, overrides)
    return args


def _is_rate(text: str) -> bool:
    match = RATE.fullmatch(text)
    return bool(match) and float(match.group(1)) > 0


def _variants(args) -> Dict[str, List[str]]:
    """{name: config overrides}, the reference first."""
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    for name in names:
        if name not in BUILTIN:
            _fail(f"unknown variant {name!r}; choose from {', '.join(BUILTIN)} or add one with "
                  "--variant NAME=key=value")
    found = {name: BUILTIN[name] for name in [REFERENCE] + names}
    for text in args.variant:
        name, sep, overrides = text.partition("=")
        items = [item for item in overrides.split(",") if item]
        if not sep or not name.strip() or any("=" not in item for item in items):
            _fail(f"--variant {text!r} must look like NAME=key=value[,key=value] (NAME= alone: "
                  "the default config)")
        if name in found:
            _fail(f"--variant {name!r}: a variant of that name is already measured; pick another name")
        found[name] = items
    return found


def _check_overrides(args, overrides: List[str]) -> None:
    """Load the job's whole config now: a bad key or value stops here, before any
    namespace exists."""
    try:
        configlib.load(str(ROOT / CONFIG), _job(args, "198.18.0.1:6170", Path("run"), 0) + overrides)
    except UserError as e:
        _fail(f"{' '.join(overrides) or 'the default config'}: {e}")


def _job(args, master: str, run_dir: Path, node_rank: int) -> List[str]:
    """The overrides of one host's train.py (the variant's come after them)."""
    world = 2 * args.ranks_per_host
    return [f"model.name={args.model}", "data.name=synthetic",
            f"data.num_samples={args.batch * world * args.steps}", "data.num_eval_samples=64",
            "train.epochs=1", f"train.batch_size={args.batch}", "train.log_every=1000000",
            "checkpoint.every_epochs=0", "dist.nnodes=2", f"dist.node_rank={node_rank}",
            f"dist.master={master}", f"dist.nprocs={args.ranks_per_host}",
            f"output.run_dir={run_dir}"]


# ---------------------------------------------------------------- the driver
def run_once(args, hosts: netns.TwoHosts, overrides: List[str], port: int, workdir: Path) -> dict:
    """One job across the two hosts: rank 0's metrics.json plus the bytes the link carried."""
    run_dir = workdir / f"run-{port}"
    master = f"{hosts.ip_a}:{port}"
    cmds = []
    for node_rank, ns in enumerate((hosts.a, hosts.b)):
        sets = _job(args, master, run_dir, node_rank) + overrides
        cmds.append(hosts.cmd(ns, [sys.executable, str(ROOT / "train.py"), "-c", str(ROOT / CONFIG)]
                              + [arg for item in sets for arg in ("-o", item)]))
    before = netns.sent_bytes(hosts)
    failed = bench_train.run_together(cmds, dict(os.environ, **bench_train.THREADS), workdir,
                                      args.timeout)
    carried = netns.sent_bytes(hosts) - before
    metrics = run_dir / "metrics.json"
    if failed or not metrics.is_file():
        code, output = failed or (0, "(no metrics.json written)")
        raise RuntimeError(f"{' '.join(overrides) or 'default config'} failed (exit {code}):\n{output}")
    return dict(json.loads(metrics.read_text()), link_bytes=carried)


def measure(args, hosts: netns.TwoHosts) -> Dict[str, List[dict]]:
    names = list(args.variants)
    runs: Dict[str, List[dict]] = {name: [] for name in names}
    port = FIRST_PORT
    with tempfile.TemporaryDirectory(prefix="bench_link-") as tmp:
        for rep in range(args.reps):
            # Each rep starts with another variant (a run's place in the sequence shifts it).
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                found = run_once(args, hosts, args.variants[name], port, Path(tmp))
                port += 1
                runs[name].append(found)
                print(f"rep {rep + 1}/{args.reps}  {name:<16} {found['samples_per_s']:>10,.0f} "
                      f"samples/s  {found['link_bytes'] / found['steps'] / 1e6:.2f} MB/step", flush=True)
    return runs


def summarise(args, runs: Dict[str, List[dict]]) -> dict:
    """Medians; vs_reference is the median of per-rep ratios (the drift cancels out)."""
    out = {}
    for name, found in runs.items():
        speeds = [r["samples_per_s"] for r in found]
        ref = [r["samples_per_s"] for r in runs[REFERENCE]]
        out[name] = {"overrides": args.variants[name],
                     "samples_per_s": statistics.median(speeds),
                     "vs_reference": statistics.median(a / b for a, b in zip(speeds, ref)),
                     "link_mb_per_step": statistics.median(r["link_bytes"] / r["steps"] / 1e6
                                                           for r in found),
                     "world_size": found[0]["world_size"], "steps": found[0]["steps"],
                     "runs": speeds, "link_bytes": [r["link_bytes"] for r in found]}
    return out


def table(variants: dict) -> str:
    lines = ["| variant | overrides | samples/s | vs ref | link MB/step |", "|---|---|---:|---:|---:|"]
    for name, v in variants.items():
        lines.append(f"| {name} | {' '.join(v['overrides']) or '(default)'} | {v['samples_per_s']:,.0f} "
                     f"| {v['vs_reference']:.2f}x | {v['link_mb_per_step']:.2f} |")
    return "\n".join(lines)


def _write_json(args, result: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")


def _skip(args, reason: str) -> int:
    print(f"{PROG}: skipped: {reason}")
    _write_json(args, {"status": "skipped", "reason": reason})
    return 0


def _stop(signum, frame):
    # SIGTERM ends the run like Ctrl-C: the `finally` blocks kill the jobs and delete the
    # namespaces (Python's default for SIGTERM would skip them).
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    shaped = args.link != "none"
    reason = netns.unavailable_reason(shaping=shaped)
    if reason:
        return _skip(args, reason)
    signal.signal(signal.SIGTERM, _stop)
    world = 2 * args.ranks_per_host
    print(f"{PROG}: {args.model}, batch {args.batch}/rank, {args.steps} steps, 2 hosts x "
          f"{args.ranks_per_host} rank(s), link {args.link}, {args.reps} reps: "
          f"{', '.join(args.variants)}", flush=True)
    try:
        with netns.make_two_hosts() as hosts:
            if shaped:
                netns.shape(hosts, args.link)
            variants = summarise(args, measure(args, hosts))
    except netns.Unavailable as e:
        return _skip(args, str(e))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print()
    print(table(variants))
    _write_json(args, {
        "status": "ok", "model": args.model, "link": args.link, "burst": netns.BURST,
        "latency": netns.LATENCY, "ranks_per_host": args.ranks_per_host, "world_size": world,
        "batch_per_rank": args.batch, "steps": args.steps, "reps": args.reps,
        "hosts": [{"namespace": hosts.a, "ip": hosts.ip_a}, {"namespace": hosts.b, "ip": hosts.ip_b}],
        "reference": REFERENCE, "machine": bench_train.machine(), "variants": variants})
    return 0


if __name__ == "__main__":
    sys.exit(main())
