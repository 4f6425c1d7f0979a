"""watchdog.judge: when a job is hung and whom to blame, from every rank's heartbeat; and the
heartbeat files themselves, written by monitor.Heartbeat and read by watchdog.read_beats."""

import os
import time

from paddle_dist.runtime import monitor as rank_monitor, watchdog
from paddle_dist.runtime.watchdog import Beat, judge

NOW, T = 1000.0, 30.0


def _beat(rank, age, step=812, kind="", count=0, size=0, since_age=None, state="S"):
    since = NOW - (age if since_age is None else since_age) if kind else 0.0
    return Beat(rank, 100 + rank, NOW - age, step, 3, kind, count, size, since, state)


def test_a_live_rank_means_no_hang_even_when_the_others_wait_long():
    """A slow peer still beats: its peers' long wait in the all-reduce is not a hang."""
    beats = [_beat(0, 45, kind="all-reduce", count=1624), _beat(1, 2, step=811),
             _beat(2, 45, kind="all-reduce", count=1624)]
    assert judge(beats, NOW, T, world=3) is None


def test_a_silent_rank_is_blamed_and_the_waiters_are_listed():
    beats = [_beat(0, 31, kind="all-reduce", count=1624, size=4_200_000), _beat(1, 31),
             _beat(2, 31, kind="all-reduce", count=1624, size=4_200_000),
             _beat(3, 31, kind="all-reduce", count=1624, size=4_200_000)]
    verdict = judge(beats, NOW, T, world=4)
    assert (verdict.culprits, verdict.why, verdict.names_a_rank) == ([1], "silent", True)
    assert verdict.message == ("rank 1 silent for 31 s at step 812 (no heartbeat); "
                               "ranks 0, 2, 3 in all-reduce #1624 (4.2 MB) at step 812 since 31 s")


def test_a_stopped_process_is_blamed_even_inside_the_collective():
    beats = [_beat(0, 40, kind="all-reduce", count=7), _beat(1, 40, kind="all-reduce", count=7, state="T")]
    verdict = judge(beats, NOW, T, world=2)
    assert verdict.culprits == [1]
    assert verdict.message.startswith("rank 1 stopped by a signal (process state T) at step 812, in all-reduce #7")
    assert "rank 0 in all-reduce #7" in verdict.message


def test_a_rank_in_another_collective_is_a_mismatch_and_the_odd_one_is_blamed():
    beats = [_beat(0, 35, kind="all-reduce", count=9, size=4), _beat(1, 35, kind="all-reduce", count=9, size=800),
             _beat(2, 35, kind="all-reduce", count=9, size=4)]
    verdict = judge(beats, NOW, T, world=3)
    assert verdict.culprits == [1]
    assert verdict.message.startswith("collective mismatch: rank 1 in all-reduce #9 (800 B)")
    assert "ranks 0, 2 in all-reduce #9 (4 B)" in verdict.message


def test_two_ranks_in_different_collectives_blame_both():
    beats = [_beat(0, 35, kind="all-reduce", count=9), _beat(1, 35, kind="barrier", count=9)]
    verdict = judge(beats, NOW, T, world=2)
    assert verdict.culprits == [0, 1] and verdict.message.startswith("collective mismatch")


def test_everyone_here_waiting_names_the_ranks_elsewhere():
    beats = [_beat(2, 33, kind="all-reduce", count=5), _beat(3, 33, kind="all-reduce", count=5)]
    verdict = judge(beats, NOW, T, world=4)
    assert (verdict.culprits, verdict.why, verdict.names_a_rank) == ([], "elsewhere", False)
    assert verdict.message.endswith("waiting for ranks 0, 1 (not on this machine)")


def test_every_rank_in_the_same_collective_blames_the_collective():
    beats = [_beat(0, 33, kind="broadcast", count=5), _beat(1, 33, kind="broadcast", count=5)]
    verdict = judge(beats, NOW, T, world=2)
    assert verdict.culprits == [0, 1] and "the communication itself is stuck" in verdict.message
    assert not verdict.names_a_rank


def test_no_beats_no_verdict():
    assert judge([], NOW, T, world=2) is None


class _Env:
    global_rank, world_size = 3, 4


def test_heartbeats_are_found_by_job_and_carry_the_collective(tmp_path):
    """Written through monitor.Monitor (a collective entered and left), read through
    watchdog.read_beats from the job's folder; another job's heartbeat is not read."""
    monitor = rank_monitor.Monitor(_Env(), tmp_path)
    mine, theirs = tmp_path / "job", tmp_path / "other"
    mine.mkdir(), theirs.mkdir()
    other = rank_monitor.Heartbeat(str(theirs), 0, time.monotonic())
    monitor.folder, monitor.shared = str(mine), True
    monitor._heartbeat = rank_monitor.Heartbeat(str(mine), 3, time.monotonic())
    try:
        with monitor.phase("comm", "all-reduce", 4096):
            with monitor.phase("comm", "all-reduce", 8):        # nested: the same wait
                [beat] = watchdog.read_beats(str(mine))
        assert (beat.rank, beat.pid, beat.kind, beat.count, beat.size) == (3, os.getpid(), "all-reduce", 1, 4096)
        [beat] = watchdog.read_beats(str(mine))
        assert not beat.in_collective and monitor.collectives == 1
    finally:
        monitor._heartbeat.close()
        other.close()
    assert watchdog.read_beats(str(mine)) == []


def test_a_beat_of_another_user_or_through_a_link_is_not_read(tmp_path):
    """Only a regular file of this user, of a process of this user, counts: a link to a
    beat, a beat of a process of another user (pid 1 here is this user's only as root:
    the file is then chowned instead) are skipped."""
    folder = tmp_path / "job"
    folder.mkdir()
    beat = rank_monitor.Heartbeat(str(folder), 0, time.monotonic())
    try:
        os.symlink(beat.path, folder / f"beat-{os.getpid()}-rank1")
        assert [b.rank for b in watchdog.read_beats(str(folder))] == [0]
        if os.geteuid() == 0:
            os.chown(beat.path, 65534, 65534)
            assert watchdog.read_beats(str(folder), {}) == []
    finally:
        beat.close()
