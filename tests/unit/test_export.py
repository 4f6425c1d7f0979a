"""export's command line: what is wrong with its input is said in one line before paddle's
import (about a second), and nothing is written; `python -m` runs where importing paddle
fails, which proves the order."""

from paddle_dist import export


def test_a_missing_run_a_taken_or_unwritable_output_are_refused_before_paddle(tmp_path, without_paddle):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    (tmp_path / "a_file").write_text("x")
    cases = {
        "not found": [str(tmp_path / "nowhere")],
        "already exists": [str(tmp_path), "--out", str(tmp_path / "taken")],
        "cannot write": [str(tmp_path), "--out", str(tmp_path / "a_file" / "out")],
    }
    for words, args in cases.items():
        done = without_paddle("-m", "paddle_dist.export", *args)
        err = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(err) == 1 and words in err[0], (args, done.stderr)
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine" and (tmp_path / "a_file").read_text() == "x"


def test_an_output_below_missing_directories_is_checked_where_they_would_be_made(tmp_path):
    deeper = tmp_path / "new" / "deeper" / "out"
    assert export.check_out(deeper) == deeper and not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    assert export.check_out(tmp_path / "empty") == tmp_path / "empty"      # an empty directory is fine
