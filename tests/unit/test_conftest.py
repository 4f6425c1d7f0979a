"""tests/conftest.py's guard: a test that leaks an environment variable fails, monkeypatch's changes
are no leak, and environ_diff says what changed."""

import os

from tests.conftest import environ_diff


# ---------------------------------------------------------------- the conftest leak guard
def test_environ_diff_reports_each_kind_of_change():
    before = {"KEEP": "1", "CHANGE": "a", "REMOVE": "x"}
    after = {"KEEP": "1", "CHANGE": "b", "ADD": "y"}
    assert environ_diff(before, after) == ["ADD added", "CHANGE changed", "REMOVE removed"]
    assert environ_diff(before, dict(before)) == []


def test_environ_diff_ignores_pytests_own_variable():
    assert environ_diff({"PYTEST_CURRENT_TEST": "a (setup)"}, {"PYTEST_CURRENT_TEST": "a (call)"}) == []


LEAK_GUARD_TESTS = """
import os
import pytest

NAME = "PADDLE_DIST_LEAK_CHECK"


@pytest.fixture
def patched_by_fixture(monkeypatch):
    monkeypatch.setenv(NAME + "_FIXTURE", "1")


def test_monkeypatch_setenv_is_not_a_leak(monkeypatch):
    monkeypatch.setenv(NAME + "_MP", "1")
    monkeypatch.delenv("PADDLE_DIST_LEAK_PRESET")


def test_monkeypatch_in_a_fixture_is_not_a_leak(patched_by_fixture):
    assert os.environ[NAME + "_FIXTURE"] == "1"


def test_raw_assignment_is_a_leak():
    os.environ[NAME + "_RAW"] = "1"


def test_raw_change_is_a_leak():
    os.environ["PADDLE_DIST_LEAK_PRESET"] = "changed"


def test_raw_delete_is_a_leak():
    del os.environ["PADDLE_DIST_LEAK_PRESET"]


def test_zz_leaks_were_undone():
    assert NAME + "_RAW" not in os.environ
    assert NAME + "_MP" not in os.environ
    assert os.environ["PADDLE_DIST_LEAK_PRESET"] == "preset"
"""


def test_leak_guard_fails_raw_changes_but_not_monkeypatch(pytester, monkeypatch):
    monkeypatch.setenv("PADDLE_DIST_LEAK_PRESET", "preset")
    pytester.makeconftest("from tests.conftest import no_environ_leak  # noqa: F401\n")
    pytester.makepyfile(test_guard=LEAK_GUARD_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=6, errors=3)
    result.stdout.fnmatch_lines([
        "*test_raw_assignment_is_a_leak leaked environment variables: "
        "PADDLE_DIST_LEAK_CHECK_RAW added*",
        "*test_raw_change_is_a_leak leaked environment variables: PADDLE_DIST_LEAK_PRESET changed*",
        "*test_raw_delete_is_a_leak leaked environment variables: PADDLE_DIST_LEAK_PRESET removed*",
    ])
    assert "test_monkeypatch_setenv_is_not_a_leak leaked" not in result.stdout.str()
    assert "test_monkeypatch_in_a_fixture_is_not_a_leak leaked" not in result.stdout.str()
    assert "PADDLE_DIST_LEAK_CHECK_RAW" not in os.environ
