"""Which directory a job writes to: given, continued or new (no paddle needed: launchers
choose it too). The rule, also in docs/faults.md ("Which run a command continues"):

- `output.run_dir` given: that directory (it must not hold a finished or diverged run).
- `checkpoint.resume=auto` (the default): the newest run under `<output.root>/<output.name>-*`
  of the same experiment (the same config hash, see config.config_hash, as recorded in its
  run.json; on any number of ranks: trainer/sampling.py) that no live job holds. Unfinished: the job continues it, from
  its latest checkpoint if it has one. Finished, or ended with the ranks' weights
  differing (diverged: its status records say so): a new run starts, and says so.
- otherwise (`checkpoint.resume=none` or a checkpoint path): a new run
  `<output.root>/<output.name>-<YYYYmmdd-HHMMSS>`, with a suffix if taken.
- the other machines of a multi-node launch write under a directory of the name node 0
  chose by this rule and told them when the machines met (launch/rendezvous.py): `<output.root>/<name>`
  on each (node_run_dir), so a job's records carry one name on every machine and a new job
  never writes into an earlier one's; rank 0 alone reads checkpoints and sends them. Ranks
  started without paddle_dist's launcher (by hand, mpirun, srun) all use the directory
  their rank 0 chose (runtime/process.make_run_dir).

The process that chooses (paddle_dist's launcher; rank 0 of a job started without it) holds
the run with an flock on `<run>/.lock` until it exits, and chooses while holding
`<output.root>/.lock`: two jobs started at the same time never share a run directory.

Example:
    choice = choose(cfg, world_size=2, command=commands.invoking_command())
    choice.path, choice.note     # runs/mnist_lenet-20261123-061500, "continuing ..." or ""
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from ..security import ownpath, private
from ..config import config_hash, evaluates_only
from ..errors import UserError
from . import status
from .layout import RUN_FILE, Run
from .runlock import hold as _hold, holder as _holder, locked as _locked, release  # noqa: F401 - the face
from ..schema import Config

NOT_IDENTITY = ("world_size",)     # recorded in run.json, not compared (_same_job)


@dataclass
class Choice:
    path: Path
    note: str = ""               # what to tell the user (a continued run, a finished one)


def choose(cfg: Config, world_size: int, command: Sequence[str] = (), extra: Optional[dict] = None) -> Choice:
    """The run directory for `cfg` (module docstring), created if new.

    The chooser locks the run and records run.json (identity and the command that
    started it); it runs once per job, in the launcher or, for a script's fit(), in rank 0
    (the ranks of a launched job take the launcher's: chosen_by_launcher). `extra`: more of the run's identity (fit(): {"fit": its record of
    the script's model, optimizer and data}), so that only the same job continues it.
    """
    named = cfg.output.run_dir
    identity = {"name": cfg.output.name, "config_hash": config_hash(cfg.to_dict()),
                "world_size": world_size, "job": "eval" if evaluates_only(cfg) else "train",
                **(extra or {})}
    auto = str(cfg.checkpoint.resume).strip().lower() == "auto"
    if named:
        path = _given(Path(named), hold=True)
        if auto:
            _check_loadable(path, identity)
        private.restrict(path, cfg.output.share)
        _record(path, identity, command, continues=auto)
        # A run continued on fewer ranks: the records of ranks it no longer has are an
        # earlier attempt's (this attempt's ranks each write their own at their start).
        clear_status(path, [r for r in status.read_all(path) if r >= world_size])
        return Choice(path.resolve())
    root = Path(cfg.output.root)
    with _opened(root, "output.root", create=True) as root_fd, _locked(root_fd):
        previous = _previous(root, identity) if auto else None
        if previous is not None and not _ended(previous):
            _checked(previous, "output.root", release_on_error=True)
            private.restrict(previous, cfg.output.share)
            _record(previous, identity, command, continues=True)
            clear_status(previous)
            return Choice(previous.resolve(), _continuing(previous))
        if previous is not None:
            release(previous)
        other = _unfinished_other(root, identity) if auto and previous is None else None
        path = _checked(_new(root, root_fd, cfg.output.name), "output.root")
        private.restrict(path, cfg.output.share)
        _hold(path)
        _record(path, identity, command, continues=auto)
    note = (f"the last run of this config, {previous}, had finished; starting a new run in {path}"
            if previous is not None else "")
    if previous is not None and diverged(previous):
        note = (f"not continuing the last run of this config, {previous}: its ranks' weights "
                f"diverged (docs/faults.md); starting a new run in {path}")
    if other is not None:
        note = f"not continuing the unfinished run {other[0]}: {other[1]}; starting a new run in {path}"
    return Choice(path.resolve(), note)


def check(cfg: Config) -> None:
    """Refuse (one line, exit 2) an `output.run_dir` or `output.root` that another user
    could change, as far as it exists, before anything is made (security/ownpath.py):
    dist.isolate checks it before it enters a user namespace, where root's directories
    and other users' look alike."""
    named = cfg.output.run_dir
    ownpath.check(Path(named or cfg.output.root), "output.run_dir" if named else "output.root")


def _unfinished_other(root: Path, identity: dict):
    """(path, why) of the newest unfinished run of the same name and kind that this job
    does not continue because it is another job (a changed config, model, ...); None when
    there is none. Runs held by a live job are not looked at."""
    runs = []
    for path in _own_runs(root, identity["name"]):
        info = read_run(path)
        if info and info.get("job") == identity["job"] and not _ended(path):
            runs.append((info.get("created", 0), path, info))
    for _, path, info in sorted(runs, key=lambda r: r[0], reverse=True):
        if not _hold(path):
            continue
        release(path)
        return path, _difference(info, identity)
    return None


# How a difference in a run's identity reads (run.json against this job).
_IDENTITY_WORDS = {"config_hash": "its config differs",
                   "fit.model": "its model was {old}, this one is {new}",
                   "fit.parameters_digest": "its model's parameter names or shapes differ",
                   "fit.optimizer": "its optimizer was {old}, this one is {new}",
                   "fit.lr": "its lr was {old}, this one is {new}",
                   "fit.lr_scheduler": "its lr scheduler was {old!r}, this one is {new!r}",
                   "fit.weight_decay": "its weight decay was {old}, this one is {new}",
                   "fit.param_groups": "its parameter groups were {old}, these are {new}",
                   "fit.script": "it ran {old}, this job runs {new}",
                   "fit.train_samples": "it trained on {old} samples, this job on {new}",
                   "fit.eval_samples": "it evaluated {old} samples, this job {new}"}


def _difference(info: dict, identity: dict) -> str:
    """What makes a run's identity (`info`, its run.json) another job than `identity`."""
    if (info.get("fit") is None) != (identity.get("fit") is None):
        return "one is a paddle_dist.fit() run of a script's own model, the other a built-in job"
    said = []
    for key, words in _IDENTITY_WORDS.items():
        section, _, leaf = key.partition(".")
        old, new = info.get(section), identity.get(section)
        if leaf:
            old, new = (old or {}).get(leaf), (new or {}).get(leaf)
        if old != new:
            if key == "fit.script":         # as the shell would run it
                old, new = (shlex.join(map(str, value)) if isinstance(value, list) else value
                            for value in (old, new))
            said.append(words.format(old=old, new=new))
    return "; ".join(said) or "it is another job"


def point_to(path: Path, pointer: str) -> None:
    """Write run directory `path` into the file `pointer` (protocol.run_pointer(): where a
    paddle_dist launcher of a script reads which run its ranks chose). "" does nothing."""
    if not pointer:
        return
    target = Path(pointer)
    tmp = f".{target.name}.tmp-{os.getpid()}"
    try:    # in its launcher's log directory, which the launcher checked; checked again here
        folder = ownpath.open_dir(target.parent, "the run pointer's directory")
    except (UserError, OSError):
        folder = None
    if folder is None:
        return                          # the launcher then reports from exit codes alone
    try:
        with open(tmp, "x", opener=ownpath.opener(folder, target.parent)) as f:
            f.write(f"{Path(path).resolve()}\n")
        os.replace(tmp, target.name, src_dir_fd=folder, dst_dir_fd=folder)
    except (UserError, OSError):
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
    finally:
        os.close(folder)


def _given(path: Path, hold: bool, key: str = "output.run_dir") -> Path:
    """`output.run_dir` (or a machine's directory of node 0's run under `key`), checked all
    the way and made when missing (_checked), unless it holds a run never continued."""
    if path.exists() and not path.is_dir():
        raise UserError(f"output.run_dir {path} is a file; give a directory")
    _checked(path, key, create=True)
    if _finished(path):
        raise UserError(f"output.run_dir {path} already holds a finished run; "
                        "choose another output.run_dir or remove that one")
    if diverged(path):
        raise UserError(f"output.run_dir {path} holds a run whose ranks' weights diverged, which is "
                        "never continued; choose another output.run_dir (add -o checkpoint.resume="
                        f"{path} to start from its last checkpoint: docs/faults.md)")
    if hold and not _hold(path):
        raise UserError(f"output.run_dir {path} is in use by another job ({_holder(path)}); "
                        "wait for it to end or choose another output.run_dir")
    return path


def _check_loadable(path: Path, identity: dict) -> None:
    """A named run directory holding an unfinished fit() run of another model: its
    checkpoints would not load into this one, so say so before anything starts."""
    old, new = (read_run(path).get("fit") or {}), (identity.get("fit") or {})
    if old and new and old.get("parameters_digest") != new.get("parameters_digest"):
        release(path)
        raise UserError(f"output.run_dir {path} holds an unfinished run of another model "
                        f"({_difference(read_run(path), identity)}); choose another output.run_dir, "
                        "or add -o checkpoint.resume=none to start afresh there")


def _previous(root: Path, identity: dict) -> Optional[Path]:
    """The newest run of this experiment under `root` that no live job holds (now held
    by this process), or None."""
    runs = []
    for path in _own_runs(root, identity["name"]):
        info = read_run(path)
        if info and _same_job(info, identity):
            runs.append((info.get("created", 0), path))
    for _, path in sorted(runs, reverse=True):
        if _hold(path):
            return path
    return None


def _same_job(info: dict, identity: dict) -> bool:
    """Whether run.json `info` records the job `identity` (a fit() run's record must match
    too: a built-in job, which has none, never continues a fit() run). The world size is
    recorded, not compared: a run continues on any number of ranks that can share its
    steps (trainer/sampling.py; the trainer refuses the others, saying which work)."""
    return all(info.get(key) == value for key, value in identity.items() if key not in NOT_IDENTITY) and \
        info.get("fit") == identity.get("fit")


def _own_runs(root: Path, name: str):
    """The runs of `name` under `root` that this user owns and no one else can write: a run
    another user made (or could change) is never continued, written or locked."""
    return [path for path in root.glob(f"{_glob_escape(name)}-*") if not private.not_own(path)]


@contextlib.contextmanager
def _opened(path: Path, key: str, create: bool = False) -> Iterator[int]:
    """A descriptor of directory `path`, checked all the way (security/ownpath.py: refused
    in one line, exit 2, when another user could change it), made when missing (`create`)."""
    fd = ownpath.open_dir(path, key, create=create)
    if fd is None:
        raise UserError(f"{key} {path} is gone: another process of yours removed it; run again")
    try:
        yield fd
    finally:
        os.close(fd)


def _checked(path: Path, key: str, create: bool = False, release_on_error: bool = False) -> Path:
    """Run directory `path`, checked all the way (_opened), with no link inside it: a link
    at checkpoints/, logs/ or status/ would have every file there read or written elsewhere
    (security/ownpath.refuse_links). `release_on_error`: let go of the run when refused."""
    try:
        with _opened(path, key, create) as fd:
            ownpath.refuse_links(fd, path)
    except UserError:
        if release_on_error:
            release(path)
        raise
    return path


def _glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _new(root: Path, root_fd: int, name: str) -> Path:
    """A new run directory in `root` (open as `root_fd`): made by this process (mkdir,
    never an existing one), named by the time, with a suffix if taken."""
    base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder, n = base, 1
    while True:
        try:
            os.mkdir(folder, 0o700, dir_fd=root_fd)
            return root / folder
        except FileExistsError:
            n += 1
            folder = f"{base}-{n}"


def _finished(path: Path) -> bool:
    return Run(path).metrics.exists()


def diverged(path: Path) -> str:
    """The line a run ended with when its ranks' weights differed (a status record in
    state "diverged", errors.Diverged), else "". Such a run is never continued: its
    weights went wrong before the step it stopped at (docs/faults.md).

    Example:
        diverged(Path("runs/mnist_lenet-20261123-061500"))
        # "the ranks' weights differ at step 12: 'fc.weight' is one value on rank 0 and ..."
    """
    for file in status.files(path):
        record = status.read(file)
        if record is not None and record.state == status.DIVERGED:
            return str(record.error or "the ranks' weights differ")
    return ""


def _ended(path: Path) -> bool:
    """Whether run `path` is over for good: finished, or diverged."""
    return _finished(path) or bool(diverged(path))


def _continuing(path: Path) -> str:
    from_where = ("from its latest checkpoint" if Run(path).has_checkpoints()
                  else "from the start (it stopped before its first checkpoint)")
    attempt = read_run(path).get("attempts", 1)
    return f"continuing the unfinished run {path} (same config; attempt {attempt}) {from_where}"


def clear_status(path: Path, ranks: Optional[Iterable[int]] = None) -> None:
    """A continued run starts with no status records: the last attempt's would be read as
    this one's. `ranks`: only those global ranks' (a machine of a multi-node job clears its
    own ranks' records, never another machine's on shared storage)."""
    if ranks is not None:
        for rank in ranks:
            status.path_of(path, rank).unlink(missing_ok=True)
        return
    for file in status.files(path):
        file.unlink(missing_ok=True)


def chosen_by_launcher(cfg: Config) -> Path:
    """A rank's run directory when the job's launcher chose it (launch/job.py): created on a
    machine that has none yet (mpirun's other hosts), checked all the way (_checked) on
    every machine, never chosen again."""
    return joined(Path(cfg.output.run_dir), cfg.output.share)


def joined(path: Path, share: str = "private") -> Path:
    """Run `path`, which another process chose (the launcher, rank 0), as a rank takes it on
    its machine: checked all the way (_checked), made when missing, closed to others.

    Example:
        joined(Path("runs/mnist_lenet-20261123-061500"))   # refused in one line if not yours
    """
    path = _checked(path, "output.run_dir", create=True)
    private.restrict(path, share)
    return path.resolve()


def node_run_dir(cfg: Config, name: str) -> Path:
    """Where a machine other than node 0 of a multi-node launch writes its ranks' logs and
    status: `output.run_dir` when given, else `<output.root>/<name>`, `name` being node 0's
    run (rendezvous.Meeting.run), checked and created here (node 0's launcher holds the run).

    Example:
        node_run_dir(cfg, "mnist_lenet-20261123-061500")   # runs/mnist_lenet-20261123-061500
    """
    if cfg.output.run_dir:
        return _given(Path(cfg.output.run_dir), hold=False).resolve()
    if not name:
        raise UserError("node 0 did not name its run directory; run the same paddle_dist version "
                        "on every machine")
    return _given(Path(cfg.output.root) / name, hold=False, key="output.root").resolve()


# ------------------------------------------------------------------ run.json
def read_run(path: Path) -> dict:
    """A run's run.json ({} when it has none or it cannot be read)."""
    try:
        info = json.loads((Path(path) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _record(path: Path, identity: dict, command: Sequence[str], continues: bool) -> None:
    """Write run.json: the identity, the command and whether running it again continues
    the run (it does with checkpoint.resume=auto: the rule finds the run, or the command
    names it)."""
    info = read_run(path)
    info.update(identity)
    info.setdefault("created", time.time())
    info["attempts"] = info.get("attempts", 0) + 1
    if command:
        info["command"] = list(command)
    info["same_command_continues"] = continues
    tmp = path / f".{RUN_FILE}.tmp-{os.getpid()}"
    private.write_text(tmp, json.dumps(info, indent=1))
    os.replace(tmp, path / RUN_FILE)
