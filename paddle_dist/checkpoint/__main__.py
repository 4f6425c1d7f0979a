"""`python -m paddle_dist.checkpoint show CKPT | export CKPT OUT.pdparams` (errors are one
line on stderr, exit code 2)."""

from __future__ import annotations

import json
from typing import List, Optional

from ..options import ArgParser, run
from .io import export_pdparams, load


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m paddle_dist.checkpoint show CKPT` | `export CKPT OUT.pdparams`."""
    parser = ArgParser(prog="python -m paddle_dist.checkpoint",
                     description="Inspect a paddle_dist checkpoint or export its weights.")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="print the checkpoint's meta data as JSON")
    show.add_argument("checkpoint", help="a ckpt_* directory, a checkpoints root or a run dir")
    export = commands.add_parser("export", help="write the weights as a .pdparams file, for "
                                 "paddle_dist.checkpoint.load_weights(net, file)")
    export.add_argument("checkpoint", help="a ckpt_* directory, a checkpoints root or a run dir")
    export.add_argument("out", help="output file, e.g. model.pdparams")
    args = parser.parse_args(argv)
    if args.command == "show":
        print(json.dumps(load(args.checkpoint).meta, indent=1, sort_keys=True))
    else:
        print(f"wrote {export_pdparams(args.checkpoint, args.out)}")
    return 0


if __name__ == "__main__":
    run(main)
