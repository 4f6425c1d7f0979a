"""Unit tests for paddle_dist.launch.jobprocs: what the launcher removes from /dev/shm."""

from paddle_dist.launch import jobprocs


def test_remove_segments_takes_only_the_jobs_own(tmp_path):
    names = ["paddle_4711_3_2844767769", "paddle_4712_0_1", "paddle_dist-beat-4711-ab12",
             "paddle_dist-shm-4711-99", "paddle_999_3_1", "paddle_dist-beat-999-x",
             "paddle_4711_notours", "other_4711_1_1"]
    for name in names:
        (tmp_path / name).write_text("")
    removed = jobprocs.remove_segments([4711, 4712], tmp_path)
    assert sorted(removed) == sorted(names[:4])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[4:])
