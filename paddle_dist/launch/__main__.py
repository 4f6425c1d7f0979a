"""`python -m paddle_dist.launch [--nprocs N] [--gpus 0,1] [-c cfg] script.py [args]`."""

from .job import launch_main
from ..options import run

if __name__ == "__main__":
    run(launch_main)
