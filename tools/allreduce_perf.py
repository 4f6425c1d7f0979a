"""All-reduce bandwidth sweep in nccl-tests' format; see paddle_dist/allreduce_perf.py.

    python -m paddle.distributed.launch --nproc_per_node 2 tools/allreduce_perf.py -b 8 -e 128M -f 2
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddle_dist.allreduce_perf import run  # noqa: E402

if __name__ == "__main__":
    run()
