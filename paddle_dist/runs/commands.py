"""Command lines: how this process was started (its own command, or the outermost launcher's
that runs it on every rank), recorded in a run's run.json, and the exact command that
continues a run (the one that started it, naming the run when it would not find it again).

Example:
    rundir.choose(cfg, world_size=2, command=invoking_command())
    resume_command(Path("runs/mnist_lenet-20261123-061500"))    # 'python train.py -o dist.nprocs=2'
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from ..procfs import cmdline, parent_of
from .rundir import diverged, read_run
from .layout import Run


def resume_command(path: Path) -> str:
    """The exact command that continues run `path` ("" when unknown, or when the run
    diverged: it is never continued): the command that started it, when that finds the
    run again by itself; otherwise that command naming the run (`-o output.run_dir=...`)
    and, when there is a checkpoint, resuming from it.

    Example:
        resume_command(Path("runs/mnist_lenet-20261123-061500"))   # 'python train.py -o dist.nprocs=2'
    """
    info = read_run(path)
    command = [str(word) for word in info.get("command", [])]
    if not command or diverged(path):
        return ""
    if not info.get("same_command_continues"):
        command = drop_overrides(command, ("output.run_dir", "checkpoint.resume"))
        command += ["-o", f"output.run_dir={Path(path).resolve()}"]
        if Run(path).has_checkpoints():
            command += ["-o", "checkpoint.resume=auto"]
    return shlex.join(command)


def drop_overrides(argv: Sequence[str], keys: Sequence[str]) -> List[str]:
    """`argv` without the overrides (-o KEY=..., -oKEY=..., --override KEY=...,
    --override=KEY=...) of `keys`.

    Example:
        drop_overrides(["a.py", "-o", "x.y=1", "-ox.z=2"], ["x.y"])     # ['a.py', '-ox.z=2']
    """
    kept: List[str] = []
    i = 0
    while i < len(argv):
        word, pair, width = argv[i], None, 1
        if word in ("-o", "--override") and i + 1 < len(argv):
            pair, width = argv[i + 1], 2
        elif word.startswith("--override="):
            pair = word.split("=", 1)[1]
        elif word.startswith("-o") and not word.startswith("--") and len(word) > 2:
            pair = word[2:]
        if pair is None or pair.split("=", 1)[0].strip() not in keys:
            kept += argv[i:i + width]
        i += width
    return kept


def main_module() -> str:
    """The module this process was started as (`python -m NAME`: "NAME"); "" for a script,
    `-c` or an interactive interpreter. (sys.argv[0] is then the module's file, which
    must not be run again as a script: see launcher.python_args.) A package is named as
    it was run: `python -m paddle_dist.launch`, not its `paddle_dist.launch.__main__`.

    Example:
        main_module()     # 'paddle_dist.train' under `python -m paddle_dist.train`
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name if spec is not None else ""
    return name[:-len(".__main__")] if name.endswith(".__main__") else name


def own_command(argv: Optional[Sequence[str]] = None, module: str = "") -> List[str]:
    """This process's command line as a shell would run it: `python train.py -o ...`, or
    `python -m paddle_dist.train -o ...` for `module`. Without `argv`: this process's
    own (sys.argv and main_module()).

    Example:
        own_command(["/x/paddle_dist/train.py", "-o", "a=1"], "paddle_dist.train")
        # ['python', '-m', 'paddle_dist.train', '-o', 'a=1']
    """
    if argv is None:
        argv, module = sys.argv, main_module()
    argv = list(argv)
    if module:
        return [_python(), "-m", module] + argv[1:]
    return [_python()] + argv if argv and argv[0].endswith(".py") else argv


def invoking_command(argv: Optional[Sequence[str]] = None, module: str = "") -> List[str]:
    """The command line that started this job: under launchers that run the script (or
    `-m module`) on each rank (paddle.distributed.launch, mpirun, paddle_dist.launch), the
    outermost of the parent processes, one above the other, whose commands name this
    script (or module); else this process's own (own_command). Without `argv`: this
    process's own (sys.argv and main_module()).

    Example:
        invoking_command(["train.py", "-o", "a=1"])   # ['python', '-m', 'paddle.distributed.launch', ...]
    """
    if argv is None:
        argv, module = sys.argv, main_module()
    argv = list(argv)
    script = os.path.basename(argv[0]) if argv else ""

    def names_it(words: List[str]) -> bool:
        return module in words if module else any(os.path.basename(w) == script for w in words)

    found: List[str] = []
    pid = os.getppid()
    for _ in range(4):
        words = cmdline(pid) if pid > 1 and (module or script.endswith(".py")) else []
        if not names_it(words) or not launches(words, script):
            break
        found, pid = words, parent_of(pid)
    return found or own_command(argv, module)


# Programs that start ranks of a script they name (a Python launcher is recognised by its
# interpreter: paddle.distributed.launch, paddle_dist.launch, train.py starting itself).
RANK_STARTERS = ("mpirun", "mpiexec", "orterun", "prterun", "srun", "paddle-dist-launch")


def launches(words: Sequence[str], script: str = "") -> bool:
    """Whether a parent's command `words` is a launcher of ranks, not a wrapper around one:
    an MPI launcher, srun, or Python running a module or `script` itself. `timeout 600
    python ...`, `bash -c "python ..."`, `nohup`, `env` or `python wrapper.py` are not,
    and running one of them again would start the wrapper, not continue the run.

    Example:
        launches(["python", "-m", "paddle.distributed.launch", "train.py"], "train.py")   # True
        launches(["timeout", "600", "python", "train.py"], "train.py")                  # False
    """
    if not words:
        return False
    program = os.path.basename(words[0])
    if program in RANK_STARTERS:
        return True
    if not re.fullmatch(r"python[0-9.]*", program):
        return False
    runs = next((word for word in words[1:] if not word.startswith("-")), "")
    return not runs.endswith(".py") or os.path.basename(runs) == script


def _python() -> str:
    """How this interpreter is named on the command line: `python` or `python3` when that
    finds it on PATH, else its full path."""
    for name in ("python", "python3"):
        if shutil.which(name) == sys.executable:
            return name
    return sys.executable
