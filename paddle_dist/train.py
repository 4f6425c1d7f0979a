"""`python -m paddle_dist.train [-c cfg] [-o key=value ...]`: the checkout's train.py, installed.

The same command line as train.py, for an installed paddle_dist (no checkout needed). When
it starts its own ranks (`-o dist.nprocs=2`), they run `python -m paddle_dist.train ...`
too, never this file as a script: a script's directory comes first on sys.path, and this
package's module names (`logger`, `data`, `env`, ...) would shadow others there.

Example:
    $ python -m paddle_dist.train -o dist.nprocs=2 -o train.epochs=1
"""

from .launch.job import train_main
from .options import run

if __name__ == "__main__":
    run(train_main)
