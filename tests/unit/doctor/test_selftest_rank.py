"""Unit tests for paddle_dist.doctor.selftest_rank: a rank running its checks, each a row, and the
file that says where it is."""

from __future__ import annotations

import json

from paddle_dist.doctor import selftest_rank
from paddle_dist.doctor.checks import Row
from paddle_dist.doctor.selftest_rank import SETUP, Check, run_check

from tests.unit.doctor.test_selftest import job  # noqa: F401  (fixtures)


def test_a_check_that_raises_is_a_fail_row_with_its_time(job):
    def boom(job):
        raise ValueError("no such thing\nsecond line")

    row = run_check(Check("grad sync fused", 30, boom), job)
    assert (row.status, row.detail) == ("FAIL", "ValueError: no such thing")
    assert row.seconds > 0


def test_the_recorder_says_where_the_rank_is(tmp_path):
    rec = selftest_rank.Recorder(tmp_path / "rank1.json", 1)
    rec.start(SETUP)
    assert json.loads((tmp_path / "rank1.json").read_text())["running"] == SETUP
    rec.add(Row(SETUP, "PASS", 0.5, "gloo"))
    rec.finish()
    data = json.loads((tmp_path / "rank1.json").read_text())
    assert data["running"] is None and data["done"] is True
    assert data["rows"] == [{"check": SETUP, "status": "PASS", "seconds": 0.5, "detail": "gloo", "digest": ""}]
