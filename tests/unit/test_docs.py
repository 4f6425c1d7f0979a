"""The docs cannot drift from the code: every config key, repository path and paddle_dist
command quoted in README.md and docs/*.md (in `code` or in code blocks) is checked.

- a config key (`train.epochs`, `-o dist.nprocs=2`) must be a key of the schema;
- a path under paddle_dist/, tools/, tests/, configs/ or docs/ must exist (`{a,b}` expanded);
- a command (`python -m paddle_dist.X`, `python train.py`, `python tools/X.py`) must run
  `--help`, and every option it is quoted with must be in that help (a subcommand's own).
"""

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from paddle_dist import config as configlib
from paddle_dist.schema import Config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SECTIONS = tuple(Config().to_dict())
KEY = re.compile(rf"(?<![\w./-])((?:{'|'.join(SECTIONS)})\.[a-z_]+(?:\.[a-z_]+)?)(?![\w/(])")
FILE_ENDINGS = ("py", "md", "yaml", "json", "npz", "txt", "log", "sh", "pdparams", "pdiparams")
PATH = re.compile(r"(?<![\w./-])((?:paddle_dist|tools|tests|configs|docs)/[\w./{},*-]*)")
COMMAND = re.compile(r"python3? (-m paddle_dist\.[\w.]+|train\.py|tools/\w+\.py)((?: +[^|;&`#]*)?)")   # up to a pipe, a `;`, a comment


# Mistakes the docs show on purpose (an error message's example) and placeholders.
NOT_REAL = {"train.epoch",          # README: "unknown config key 'train.epoch'; did you mean ..."
            "configs/x.yaml"}       # README: [-c configs/x.yaml], any config


def code_of(path: Path):
    """(line number, text) of every inline code span and code-block line of a Markdown file."""
    inside = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            inside = not inside
            continue
        if inside:
            yield number, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def expand(pattern: str):
    """`a/{b,c}.py` -> a/b.py, a/c.py."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if not match:
        return [pattern]
    return [p for part in match.group(1).split(",")
            for p in expand(pattern[:match.start()] + part + pattern[match.end():])]


def _known_key(key: str) -> bool:
    if key.rsplit(".", 1)[1] in FILE_ENDINGS:
        return True                                  # a file name such as checkpoint.py
    if key.startswith("dist.nccl.extra"):
        return True                                  # any NCCL_* variable
    try:
        configlib.get_key(Config(), key)
        return True
    except AttributeError:
        return False


@lru_cache(maxsize=None)
def help_text(command: str) -> str:
    argv = command.split()
    argv = [sys.executable, *argv] if argv[0] == "-m" else [sys.executable, *argv]
    result = subprocess.run(argv + ["--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{command} --help failed: {result.stderr[-500:]}"
    return result.stdout


def test_every_config_key_in_the_docs_exists():
    unknown = [f"{doc.name}:{n}: {key}" for doc in DOCS for n, text in code_of(doc)
               for key in KEY.findall(text) if not _known_key(key) and key not in NOT_REAL]
    assert not unknown, "config keys that are not in the schema:\n" + "\n".join(unknown)


def test_every_repository_path_in_the_docs_exists():
    missing = []
    for doc in DOCS:
        for n, text in code_of(doc):
            for found in PATH.findall(text):
                for path in expand(found.rstrip(".,:)")):
                    if "*" in path or "<" in path or path in NOT_REAL:
                        continue                             # a pattern, not a path
                    if not (ROOT / path).exists():
                        missing.append(f"{doc.name}:{n}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_command_and_option_in_the_docs_is_known():
    wrong = []
    for doc in DOCS:
        for n, text in code_of(doc):
            for command, rest in COMMAND.findall(text):
                wrong += [f"{doc.name}:{n}: {problem}" for problem in _check(command, rest)]
    assert not wrong, "commands or options the code does not know:\n" + "\n".join(wrong)


def _check(command: str, rest: str):
    """Problems of one quoted command: an unknown command, or options its help lacks. Under
    `python -m paddle_dist.launch`, what follows the script is the script's."""
    words = rest.split()
    if command == "-m paddle_dist.launch":
        script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        if script is not None:
            if COMMAND.fullmatch(f"python {words[script]}"):
                yield from _check(words[script], " " + " ".join(words[script + 1:]))
            words = words[:script]
    sub = words[0] if words and re.fullmatch(r"[a-z]+", words[0]) else ""
    try:
        known = help_text(command)
        if sub and f"{{{sub}" in known.replace(",", "{"):
            known = help_text(f"{command} {sub}")
    except AssertionError as exc:
        yield str(exc)
        return
    for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(words)):
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", known):
            yield f"{command} has no option {option}"
