"""paddle_dist/security/private.py on real files: a job's directory in /dev/shm is a real
directory of this user closed to others, never one reached through a link or made by
another user; what killed jobs left is removed, and nothing of a live job."""

import os
import subprocess
import sys

import pytest

from paddle_dist.security import private


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """A folder standing for /dev/shm (world-writable, sticky)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    folder.chmod(0o1777)
    monkeypatch.setattr(private, "base", lambda: str(folder))
    return folder


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_job_directory_is_private_and_inside_the_users_own(shm):
    folder = private.make_job_dir()
    assert os.path.dirname(folder) == str(shm / f"paddle_dist-{os.geteuid()}")
    assert os.path.basename(folder).startswith(f"job-{os.getpid()}-")
    assert private.owned(folder) and private.owned(os.path.dirname(folder))
    fd = private.create(os.path.join(folder, "token"))
    os.close(fd)
    assert (os.stat(os.path.join(folder, "token")).st_mode & 0o777) == 0o600
    with pytest.raises(FileExistsError):
        private.create(os.path.join(folder, "token"))          # never an existing file


def test_a_link_at_a_name_is_never_followed(shm, tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, shm / "planted")
    with pytest.raises(FileExistsError):
        private.create(str(shm / "planted"))
    assert target.read_text() == "keep"


def test_the_users_directory_taken_by_a_link_or_left_open_is_not_used(shm, tmp_path, capsys):
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir()
    os.symlink(elsewhere, shm / f"paddle_dist-{os.geteuid()}")
    assert private.user_dir() is None
    assert "is not a private directory of this user" in capsys.readouterr().err
    folder = private.make_job_dir()                    # a random directory of its own instead
    assert os.path.dirname(folder) == str(shm) and private.owned(folder)
    assert os.path.basename(folder).startswith(f"paddle_dist-job-{os.geteuid()}-{os.getpid()}-")
    assert list(elsewhere.iterdir()) == []
    os.unlink(shm / f"paddle_dist-{os.geteuid()}")
    os.mkdir(shm / f"paddle_dist-{os.geteuid()}", 0o777)
    os.chmod(shm / f"paddle_dist-{os.geteuid()}", 0o777)
    assert private.user_dir() is None and private.rank_dir("k") is None


def test_a_launchers_directory_is_used_by_its_ranks_only_when_private(shm):
    folder = private.make_job_dir()
    assert private.rank_dir("k", folder) == folder
    os.chmod(folder, 0o755)
    assert private.rank_dir("k", folder) == str(shm / f"paddle_dist-{os.geteuid()}" / "key-k")


def test_what_killed_jobs_left_is_removed_and_live_jobs_kept(shm):
    dead = _dead_pid()
    mine = private.user_dir()
    left = os.path.join(mine, f"job-{dead}-abcd1234")
    live = os.path.join(mine, f"job-{os.getpid()}-abcd1234")
    os.mkdir(left, 0o700), os.mkdir(live, 0o700)
    open(os.path.join(left, "token"), "w").close()
    keyed = os.path.join(mine, "key-0123")
    os.mkdir(keyed, 0o700)
    open(os.path.join(keyed, f"beat-{dead}-rank1"), "w").close()
    open(os.path.join(keyed, f"beat-{os.getpid()}-rank0"), "w").close()
    old_token = shm / f"paddle_dist-token-{dead}-x1y2"       # as earlier versions left it
    old_token.write_text("00")
    removed = private.clean()
    assert sorted(removed) == sorted([left, os.path.join(keyed, f"beat-{dead}-rank1"), str(old_token)])
    assert os.path.isdir(live) and os.listdir(keyed) == [f"beat-{os.getpid()}-rank0"]


def test_restrict_closes_a_directory_and_the_umask_only_tightens(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o755)
    private.restrict(folder)
    assert (folder.stat().st_mode & 0o777) == 0o700
    private.restrict(folder, "group")
    assert (folder.stat().st_mode & 0o777) == 0o750
    old = os.umask(0o002)
    try:
        assert private.closed_umask("group") == 0o002 and os.umask(0o002) == 0o027
        assert private.closed_umask() == 0o002 and os.umask(0o077) == 0o077
        assert private.closed_umask("group") == 0o077 and os.umask(old) == 0o077    # never looser
    finally:
        os.umask(old)


def test_a_run_file_is_never_opened_through_a_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("theirs")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(private.LinkRefused, match=r"link is a symbolic link, .* remove the link"):
        private.write_text(tmp_path / "link", "mine")
    with pytest.raises(private.LinkRefused):
        open(tmp_path / "link", "a", opener=private.nofollow)
    assert target.read_text() == "theirs"
    private.write_text(tmp_path / "plain", "mine")
    assert (tmp_path / "plain").read_text() == "mine"


def test_a_status_record_is_never_written_through_a_link(tmp_path):
    from paddle_dist.runs import status

    target = tmp_path / "target"
    target.write_text("theirs")
    record = status.RankStatus.make(rank=0, state=status.RUNNING)
    path = tmp_path / "rank0.json"
    (tmp_path / f"rank0.json.tmp-{os.getpid()}").symlink_to(target)
    with pytest.raises(OSError):
        record.write(path)
    assert target.read_text() == "theirs" and not path.exists()
