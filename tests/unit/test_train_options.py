"""train.py's options for a rank started by hand (`--master --world-size --rank --local-rank`):
what the command line hands the environment layer, without starting a job."""

import pytest

from paddle_dist.launch import job
from paddle_dist.train import train_main
from paddle_dist.runtime import variables as varlib
from paddle_dist.errors import UserError

HAND = ["--master", "10.0.0.1:6170", "--world-size", "2", "--rank", "1"]


@pytest.fixture
def exported(monkeypatch):
    """The variables train_main would export (nothing is exported), and no job runs."""
    seen = {}
    monkeypatch.setattr(varlib, "export", lambda variables, keep_existing=False: seen.update(variables) or {})
    monkeypatch.setattr(job, "run", lambda cfg, **kwargs: 0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return seen


def test_local_rank_picks_the_ranks_place_on_its_machine(exported):
    assert train_main(HAND + ["--local-rank", "1"]) == 0
    assert (exported["RANK"], exported["LOCAL_RANK"], exported["LOCAL_WORLD_SIZE"]) == ("1", "1", "2")


def test_without_local_rank_an_inherited_one_is_used_else_0(exported, monkeypatch):
    assert train_main(HAND) == 0
    assert exported["LOCAL_RANK"] == "0"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert train_main(HAND) == 0
    assert exported["LOCAL_RANK"] == "1"


def test_a_negative_local_rank_is_a_one_line_user_error(exported):
    with pytest.raises(UserError, match="--local-rank -1 must be in 0 .. 1") as refused:
        train_main(HAND + ["--local-rank", "-1"])
    assert "\n" not in str(refused.value) and exported == {}


def test_local_rank_alone_asks_for_the_rest(exported):
    with pytest.raises(UserError, match="needs all of --master"):
        train_main(["--local-rank", "1"])
