"""Say where this Slurm task or batch job runs: one JSON line with its node's name, id and
addresses (`hostname -I`: inside a network namespace, that namespace's) and the job's
SLURM_JOB_NUM_NODES and SLURM_RESTART_COUNT (null where Slurm sets none).

--wait FILE: then wait for FILE to appear, bounded by --limit seconds: exit 0 once it
does, 3 if it never does (tests/integration/test_slurm_nodes.py holds a job running so).
"""

import argparse
import json
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wait", default="")
    parser.add_argument("--limit", type=float, default=60)
    args = parser.parse_args()
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    env = {name: os.environ.get(name) for name in ("SLURMD_NODENAME", "SLURM_NODEID", "SLURM_JOB_NUM_NODES",
                                                   "SLURM_RESTART_COUNT", "SLURM_STEP_ID")}
    print(json.dumps(dict(env, addresses=addresses, waits=bool(args.wait))), flush=True)
    deadline = time.monotonic() + args.limit
    while args.wait and not os.path.exists(args.wait):
        if time.monotonic() > deadline:
            print(f"{args.wait} did not appear in {args.limit}s", file=sys.stderr)
            return 3
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
