"""Every fix a message or the docs suggest runs on this Paddle: the code is taken as the
message or the page gives it, evaluated, and run.

- the `fit(..., inputs=..., labels=...)` of a dict batch split by position (Feed.dict_hint),
  and the one docs/own_model.md quotes, build and split a batch by name;
- every `InputSpec(...)` in the docs' code builds;
- every `paddle.X.Y` a message names exists;
- every `section.key=value` a message suggests (`-o train.eval_loss=false`) is a config
  key, and a concrete value is one the config takes.
"""

import ast
import re
from pathlib import Path

import paddle

from paddle_dist import config as configlib
from paddle_dist.config_keys import with_key
from paddle_dist.trainer.feed import Feed

from tests.unit.test_docs import code_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FIT_HINT = re.compile(r"fit\(\.\.\., (.*)\)")
PADDLE_NAME = re.compile(r"(?<![\w.])paddle(?:\.[A-Za-z_]\w*)+")
SECTIONS = "|".join(configlib.Config().to_dict())
SETTING = re.compile(rf"(?<![\w.])((?:{SECTIONS})\.[a-z_.]+)=([^\s\"'`;),]*)")   # -o train.api=hapi
PLACEHOLDER = re.compile(r"^$|\.\.\.|[A-Z]{2,}|<|\|")       # PATH, HOST:PORT, ..., <key>, a|b


class OneInput(paddle.nn.Layer):
    """forward(x): a dict sample's keys name none of its arguments."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def fit_arguments(text: str) -> dict:
    """The keyword arguments of the `fit(..., k=v, ...)` in `text`, evaluated with paddle.

    Example:
        fit_arguments("e.g. fit(..., inputs=['img'])")      # {'inputs': ['img']}
    """
    found = FIT_HINT.search(text)
    assert found, f"no fit(..., ...) in {text!r}"
    call = ast.parse(f"fit({found.group(1)})", mode="eval").body
    return {k.arg: eval(compile(ast.Expression(k.value), "<hint>", "eval"), {"paddle": paddle})  # noqa: S307
            for k in call.keywords}


def paddleseg_batch() -> dict:
    """A collated PaddleSeg sample: {img, label, trans_info, gt_fields}."""
    return {"img": paddle.ones([2, 4], "float32"), "label": paddle.zeros([2, 1], "int64"),
            "trans_info": [["resize", (8, 8)]], "gt_fields": ["label"]}


def test_the_dict_samples_hint_runs_and_splits_the_batch_by_name():
    batch = paddleseg_batch()
    hint = Feed(OneInput()).dict_hint(batch)
    feed = Feed(OneInput(), **fit_arguments(hint))
    assert feed.split(batch) == ([batch["img"]], [batch["label"]])
    assert feed.dict_hint(batch) == ""             # followed, the hint is not given again
    assert OneInput()(*feed.split(batch)[0]).shape == [2, 2]


def test_the_hint_own_model_md_quotes_runs():
    quoted = [span for _, span in code_of(ROOT / "docs" / "own_model.md") if span.startswith("fit(..., inputs=")]
    assert quoted, "docs/own_model.md no longer quotes the dict samples' fix"
    batch = paddleseg_batch()
    for span in quoted:
        assert Feed(OneInput(), **fit_arguments(span)).split(batch) == ([batch["img"]], [batch["label"]])


def test_every_input_spec_in_the_docs_code_builds():
    names = {"paddle": paddle, "InputSpec": paddle.static.InputSpec, "None": None}
    found = []
    for doc in DOCS:
        for expression in _calls(doc.read_text(), r"(?:paddle\.static\.)?InputSpec\("):
            found.append(expression)
            spec = eval(expression, names)                       # noqa: S307  (the docs' own code)
            assert isinstance(spec, paddle.static.InputSpec), (doc.name, expression)
    assert found


def test_every_paddle_name_a_message_gives_exists():
    missing = [f"{where}: {name}" for where, text in _messages()
               for name in PADDLE_NAME.findall(text) if not _resolves(name)]
    assert not missing, "messages name what this Paddle lacks:\n" + "\n".join(missing)


def test_every_setting_a_message_suggests_is_a_key_and_takes_its_value():
    """`section.key=value` in a message (`-o train.eval_loss=false`): the key exists, and a
    concrete value has its type. (The settings it goes with, such as train.lr_schedule=step
    for train.lr_milestones, are the message's context.)"""
    wrong = []
    for where, text in _messages():
        for key, value in SETTING.findall(text):
            value = value.rstrip(".:")
            try:
                configlib.get_key(configlib.Config(), key)
                if not PLACEHOLDER.search(value):
                    with_key(configlib.Config(), key, value, from_text=True)
            except Exception as exc:  # noqa: BLE001  (any refusal is the finding)
                wrong.append(f"{where}: {key}={value}: {exc}")
    assert not wrong, "\n".join(wrong)


def _calls(text: str, start: str):
    """Each whole call expression in `text` that begins with the pattern `start`."""
    for match in re.finditer(start, text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        yield text[match.start():end + 1]


def _messages():
    """(file:line, text) of every string in paddle_dist/ that is not a docstring or a
    comment: what a message, a help text or a hint says (an f-string's fixed parts)."""
    for path in sorted((ROOT / "paddle_dist").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node.value


def _resolves(dotted: str) -> bool:
    """Whether `paddle.a.b.C` is a module or an attribute this Paddle has."""
    import importlib

    parts = dotted.split(".")
    obj = paddle
    for i, part in enumerate(parts[1:], 2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return False
    return True


def test_fit_arguments_reads_a_hints_keywords():
    assert fit_arguments("e.g. fit(..., inputs=['img'], labels=2)") == {"inputs": ["img"], "labels": 2}
