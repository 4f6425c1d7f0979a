"""paddle_dist's own variables: what its launcher tells the ranks it starts (PADDLE_DIST_*).

Written by the launcher (launch/launcher.py, launch/job.py) into the children's environment,
read here by the ranks: `detect()` for SUPERVISED and the job's gate, `launch_options()` for
a script's -c and -o, `run_pointer()` for where rank 0 names its run directory,
`sync_buffers()` for a script's --sync-buffers (`script_hooks()` gives what carries it).

Example:
    launch_options({"PADDLE_DIST_CONFIG": "configs/mnist_mlp.yaml"})   # ('configs/mnist_mlp.yaml', [])
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional, Tuple

SUPERVISED = "PADDLE_DIST_SUPERVISED"   # set for the ranks that paddle_dist's launcher starts
# `python -m paddle_dist.launch -c CONFIG -o KEY=VALUE ... script.py`: for the script's
# paddle_dist.load_config() and fit() (launch_options()).
LAUNCH_CONFIG, LAUNCH_OVERRIDES = "PADDLE_DIST_CONFIG", "PADDLE_DIST_OVERRIDES"
# `python -m paddle_dist.launch script.py`: a file where the script's fit() (rank 0) writes
# the run directory it chose, so that the launcher can read the ranks' status records and
# name the command that continues the run (run_pointer()).
RUN_POINTER = "PADDLE_DIST_RUN_POINTER"
# A rank that paddle_dist's launcher admitted (rankgate.py): the job, and the path of the
# file holding its token (never the token), for the rank's attestation (attest.py).
JOB, TOKEN_FILE = "PADDLE_DIST_JOB", "PADDLE_DIST_TOKEN_FILE"
# The job's private directory in /dev/shm, made by its launcher (private.py).
JOB_DIR = "PADDLE_DIST_JOB_DIR"
# The built-in job's config as its launcher resolved it (launch/job.py), as JSON: its
# ranks run this instead of reading their command line's -c and -o again (resolved_config()).
JOB_CONFIG = "PADDLE_DIST_JOB_CONFIG"
# `python -m paddle_dist.launch --sync-buffers script.py`: every paddle.DataParallel the
# script makes keeps its BatchNorm statistics equal on every rank (runtime/scripthooks/).
SYNC_BUFFERS = "PADDLE_DIST_SYNC_BUFFERS"
# The directory, holding only a sitecustomize.py, put first on a script's ranks' PYTHONPATH:
# Python runs it at start-up, and it hooks paddle.DataParallel once paddle is imported.
SCRIPT_HOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripthooks", "pythonpath")


def launch_variables(config: Optional[str], overrides: List[str]) -> Dict[str, str]:
    """What `python -m paddle_dist.launch` hands the script's ranks of its -c and -o.

    Example:
        launch_variables(None, ["train.epochs=1"])   # {'PADDLE_DIST_OVERRIDES': '["train.epochs=1"]'}
    """
    out = {LAUNCH_OVERRIDES: json.dumps(list(overrides))} if overrides else {}
    if config:
        out[LAUNCH_CONFIG] = config
    return out


def launch_options(environ: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], List[str]]:
    """(config path or None, overrides) given to `python -m paddle_dist.launch` for this
    script; (None, []) otherwise.

    Example:
        launch_options({"PADDLE_DIST_OVERRIDES": '["train.epochs=1"]'})   # (None, ['train.epochs=1'])
    """
    environ = os.environ if environ is None else environ
    try:
        overrides = json.loads(environ.get(LAUNCH_OVERRIDES, "[]"))
    except ValueError:
        overrides = []
    return environ.get(LAUNCH_CONFIG) or None, [str(item) for item in overrides]


def script_hooks(sync_buffers: bool, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """What `python -m paddle_dist.launch` adds to a script's ranks so that their
    paddle.DataParallel is hooked (runtime/scripthooks/) without changing the script or its
    command line: SCRIPT_HOOKS first on PYTHONPATH, and SYNC_BUFFERS when it was asked for.

    Example:
        script_hooks(True, {"PYTHONPATH": "/mine"})
        # {'PYTHONPATH': '.../runtime/scripthooks/pythonpath:/mine', 'PADDLE_DIST_SYNC_BUFFERS': '1'}
    """
    environ = os.environ if environ is None else environ
    given = environ.get("PYTHONPATH", "")      # kept as it is (an empty entry means the cwd)
    if given.split(os.pathsep)[0] != SCRIPT_HOOKS:
        given = os.pathsep.join([SCRIPT_HOOKS, given]) if given else SCRIPT_HOOKS
    out = {"PYTHONPATH": given}
    if sync_buffers:
        out[SYNC_BUFFERS] = "1"
    return out


def sync_buffers(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this script's launcher was given --sync-buffers.

    Example:
        sync_buffers({"PADDLE_DIST_SYNC_BUFFERS": "1"})   # True
    """
    environ = os.environ if environ is None else environ
    return environ.get(SYNC_BUFFERS, "") == "1"


def job_config(config: dict) -> Dict[str, str]:
    """What the built-in job's launcher hands its ranks of the config it resolved.

    Example:
        job_config({"train": {"epochs": 1}})   # {'PADDLE_DIST_JOB_CONFIG': '{"train": {"epochs": 1}}'}
    """
    return {JOB_CONFIG: json.dumps(config, sort_keys=True)}


def resolved_config(environ: Optional[Mapping[str, str]] = None) -> Optional[dict]:
    """The config this rank's launcher resolved for it (a dict, as Config.to_dict() gives),
    or None for any process that paddle_dist's launcher did not start for the built-in job.

    Example:
        resolved_config({"PADDLE_DIST_SUPERVISED": "1", "PADDLE_DIST_JOB_CONFIG": "{}"})   # {}
    """
    environ = os.environ if environ is None else environ
    if not environ.get(SUPERVISED) or JOB_CONFIG not in environ:
        return None
    return json.loads(environ[JOB_CONFIG])


def run_pointer(environ: Optional[Mapping[str, str]] = None) -> str:
    """The file in which rank 0 of a `fit()` under `python -m paddle_dist.launch` writes its
    run directory ("" when no paddle_dist launcher asked for it).

    Example:
        run_pointer({"PADDLE_DIST_RUN_POINTER": "log/run_dir"})   # 'log/run_dir'
    """
    environ = os.environ if environ is None else environ
    return environ.get(RUN_POINTER, "")
