"""`python -m paddle_dist.doctor [--check] [--test] [--json]`: what this machine has, and whether a job can run."""

from ..options import run
from .facts import main

if __name__ == "__main__":
    run(main)
