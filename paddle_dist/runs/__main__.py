"""`python -m paddle_dist.runs [--root runs] [--last N] [--json]`: recent runs and how each ended."""

from ..options import run
from .listing import main

if __name__ == "__main__":
    run(main)
