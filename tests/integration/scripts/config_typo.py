"""A user's script with a typo in its config, as the README's example is written:

    python config_typo.py [--override KEY=VALUE ...] [--catch] [--spawn N]

The overrides go to `paddle_dist.load_config` (default: `train.epoch=4`, a typo of
train.epochs); a config it accepts is set up (`paddle_dist.setup`) and said on stdout.
`--catch`: the script catches paddle_dist's ConfigError itself and goes on with the
defaults. `--spawn N`: the config is loaded here, before `paddle.distributed.spawn` starts
N ranks that set it up (what docs/faults.md advises, so that a typo stops the script
before any rank starts).

Run it as is, under `python -m paddle_dist.launch` or `python -m paddle.distributed.launch`.
"""

import argparse

import paddle_dist            # first: it silences Paddle's import-time warnings
from paddle_dist.errors import ConfigError


def set_up(cfg):
    env = paddle_dist.setup(cfg)
    print(f"rank {env.global_rank}: config accepted, {cfg.train.epochs} epochs", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--override", action="append", default=None)
    parser.add_argument("--catch", action="store_true")
    parser.add_argument("--spawn", type=int, default=0)
    opts = parser.parse_args()
    overrides = ["train.epoch=4"] if opts.override is None else opts.override
    try:
        cfg = paddle_dist.load_config(overrides=overrides)
    except ConfigError as exc:
        if not opts.catch:
            raise
        print(f"caught {type(exc).__name__}: {exc}", flush=True)
        cfg = paddle_dist.load_config()
    if opts.spawn:
        import paddle.distributed

        paddle.distributed.spawn(set_up, args=(cfg,), nprocs=opts.spawn)
    else:
        set_up(cfg)


if __name__ == "__main__":
    main()
