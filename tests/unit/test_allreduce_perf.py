"""paddle_dist/allreduce_perf.py (tools/allreduce_perf.py): a bad flag is one line and exit 2, said
before paddle's import, run here in this process. tests/integration/test_allreduce_perf.py runs
the sweep, and one bad flag as a real process for the exit-code path."""

import pytest

from paddle_dist import allreduce_perf

from tests.oracles import ending


@pytest.mark.parametrize("flags", [["-d", "bfloat16"], ["-b", "1M", "-e", "1K"],
                                   ["--transport", "shm", "-d", "half"]])
def test_bad_flags_exit_2_with_one_line(capfd, flags):
    done = ending(capfd, lambda: allreduce_perf.run(flags))
    assert done.code == 2
    assert len(done.lines) == 1 and done.lines[0].startswith("error: allreduce_perf: "), done.lines
    assert done.out == ""
