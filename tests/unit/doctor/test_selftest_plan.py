"""Unit tests for paddle_dist.doctor.selftest_plan: every check has a name of its own and a deadline."""

from __future__ import annotations

from paddle_dist.doctor import selftest
from paddle_dist.doctor.selftest_rank import CHECKS

from tests.unit.doctor.test_selftest import NAMES


def test_every_check_has_a_deadline_and_a_unique_name():
    assert len(set(NAMES)) == len(NAMES)
    assert all(0 < c.seconds <= 120 for c in CHECKS)
    assert selftest.job_deadline() == sum(c.seconds for c in CHECKS) + selftest.RENDEZVOUS_S + selftest.MARGIN_S
