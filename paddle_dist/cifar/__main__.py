"""`python -m paddle_dist.cifar fake DIR ...` (see fake.py)."""

from ..options import run
from .fake import main

if __name__ == "__main__":
    run(main)
