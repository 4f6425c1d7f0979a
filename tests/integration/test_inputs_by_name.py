"""Dict samples named like a Llama's forward reach the right parameters at both API levels
(issue 52, item 5); a key forward does not take is refused in one line, exit 2.

scripts/by_name.py's model asserts inside its forward that the mask arrived as
`attention_mask`: by position, it would be read as `position_ids`.
"""

import pytest

from .procs import ROOT, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "by_name.py")


@pytest.mark.parametrize("api", ["loop", "hapi"])
@pytest.mark.parametrize("named_by", ["input_specs", "forward"])
def test_the_mask_reaches_attention_mask(tmp_path, api, named_by):
    extra = ["--forward-names"] if named_by == "forward" else []
    done = run([SCRIPT, str(tmp_path / "run"), api, *extra], timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "steps 4" in done.stdout


def test_a_key_forward_does_not_take_is_refused_in_one_line(tmp_path):
    done = run([SCRIPT, str(tmp_path / "run"), "loop", "--misnamed"], timeout=180)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("paddle_dist: error:")]
    assert len(said) == 1 and "attn_mask" in said[0], done.stderr
    assert "(its parameters: input_ids, position_ids, attention_mask)" in said[0]
    assert "Traceback" not in done.stderr
