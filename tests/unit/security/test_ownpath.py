"""paddle_dist/security/ownpath.py on real directories: every directory from / down to the one
a job names is checked (owner, mode, links), what is missing is made and checked, and links
inside a run are refused. Another user's directories are made by chown to uid 65534 (root
only), which is all that their owner changes."""

import os
import stat

import pytest

from paddle_dist.security import ownpath
from paddle_dist.security.private import LinkRefused

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")


@pytest.fixture
def shared(tmp_path):
    """A directory every user may add to, as /tmp is (sticky, world-writable)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def theirs(path, mode=0o755):
    """A directory of the other user's at `path`."""
    path.mkdir()
    path.chmod(mode)
    os.chown(path, NOBODY, NOBODY)
    return path


def opened(path, **kw):
    fd = ownpath.open_dir(path, "output.run_dir", **kw)
    if fd is not None:
        os.close(fd)
    return fd is not None


def test_a_missing_directory_is_made_all_the_way_and_never_open_to_others(shared):
    old = os.umask(0)                 # even so: what is made is not writable by others
    try:
        assert opened(shared / "a" / "b" / "run", create=True)
    finally:
        os.umask(old)
    for path in (shared / "a", shared / "a" / "b", shared / "a" / "b" / "run"):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022


def test_a_missing_directory_is_not_made_unless_asked(shared):
    assert not opened(shared / "a" / "run")
    assert list(shared.iterdir()) == []


@as_root
def test_a_directory_inside_another_users_is_refused_naming_it_and_nothing_is_made(shared):
    """The parent swap (issue 53, finding 1): their exp/, our run1 inside it."""
    exp = theirs(shared / "exp")
    with pytest.raises(ownpath.NotOwn, match=rf"^output.run_dir {exp}/run1 is inside {exp}, which is not "
                                             r"yours alone \(it belongs to user nobody \(uid 65534\)\): .*"
                                             r"\(-o output.run_dir=\.\.\.\)$"):
        opened(exp / "run1", create=True)
    assert list(exp.iterdir()) == []
    with pytest.raises(ownpath.NotOwn, match=r"is inside .*/exp, which is not yours alone"):
        opened(exp / "deeper" / "run1")


@as_root
def test_the_named_directory_made_first_by_another_user_is_refused(shared):
    with pytest.raises(ownpath.NotOwn, match=r"output.run_dir .*/run is not yours alone \(it belongs to user nobody"):
        opened(theirs(shared / "run"), create=True)


def test_a_directory_others_can_write_is_refused_unless_sticky(shared):
    open_to_all = shared / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    with pytest.raises(ownpath.NotOwn, match=r"is inside .*/open, which is not yours alone \(other users can "
                                             r"write into it: mode 0777\)"):
        opened(open_to_all / "run", create=True)
    assert list(open_to_all.iterdir()) == []
    group = shared / "group"
    group.mkdir()
    group.chmod(0o770)
    with pytest.raises(ownpath.NotOwn, match=r"mode 0770"):
        opened(group, create=True)
    open_to_all.chmod(0o1777)               # sticky: others add entries of their own only
    assert opened(open_to_all / "run", create=True)


@as_root
def test_a_link_above_is_followed_only_when_the_user_or_root_made_it(shared, tmp_path):
    (tmp_path / "real").mkdir()
    (shared / "mine").symlink_to(tmp_path / "real")
    assert opened(shared / "mine" / "run", create=True)
    assert (tmp_path / "real" / "run").is_dir()
    (shared / "planted").symlink_to(tmp_path / "real")
    os.chown(shared / "planted", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(ownpath.NotOwn, match=r"is inside .*/planted, which is not yours alone \(it is a "
                                             r"symbolic link of user nobody"):
        opened(shared / "planted" / "run2", create=True)
    assert not (tmp_path / "real" / "run2").exists()


def test_the_named_directory_is_never_a_link(shared, tmp_path):
    (shared / "run").symlink_to(tmp_path)
    with pytest.raises(ownpath.NotOwn, match=r"output.run_dir .*/run is not yours alone \(it is a symbolic link\)"):
        opened(shared / "run", create=True)


def test_a_file_on_the_way_is_named(shared):
    (shared / "file").write_text("")
    with pytest.raises(ownpath.NotOwn, match=r": .*/file is not a directory; give a directory"):
        opened(shared / "file" / "run", create=True)


def test_dots_and_relative_paths_are_walked_as_the_kernel_would(shared, monkeypatch):
    monkeypatch.chdir(shared)
    assert opened("a/../b/./run", create=True)
    assert sorted(p.name for p in shared.iterdir()) == ["b"] and (shared / "b" / "run").is_dir()


def test_a_link_at_any_depth_inside_a_run_is_refused(tmp_path):
    """Linked checkpoints/ or logs/ (issue 53, finding 6): every file there would be read or
    written where the link points."""
    run = tmp_path / "run"
    (run / "checkpoints" / "ckpt_000000010").mkdir(parents=True)
    (run / "logs").mkdir()
    fd = ownpath.open_dir(run, "output.run_dir")
    try:
        ownpath.refuse_links(fd, run)                     # none: nothing said
        (run / "status").symlink_to(tmp_path)
        with pytest.raises(LinkRefused, match=rf"^{run}/status is a symbolic link, and paddle_dist writes no "
                                              "file of a run through one; remove the link$"):
            ownpath.refuse_links(fd, run)
        (run / "status").unlink()
        (run / "checkpoints" / "ckpt_000000010" / "model.npz").symlink_to(tmp_path / "elsewhere.npz")
        with pytest.raises(LinkRefused, match=r"ckpt_000000010/model.npz is a symbolic link"):
            ownpath.refuse_links(fd, run)
    finally:
        os.close(fd)


def test_a_file_is_opened_inside_the_directory_held_never_through_a_link(tmp_path):
    target = tmp_path / "canary"
    target.write_text("kept\n")
    (tmp_path / "log").mkdir()
    fd = ownpath.open_dir(tmp_path / "log", "--log_dir")
    try:
        opener = ownpath.opener(fd, tmp_path / "log")
        with open("workerlog.0", "w", opener=opener) as f:
            f.write("rank 0\n")
        (tmp_path / "log" / "workerlog.1").symlink_to(target)
        with pytest.raises(LinkRefused, match=r"log/workerlog.1 is a symbolic link"):
            open("workerlog.1", "w", opener=opener)
    finally:
        os.close(fd)
    assert (tmp_path / "log" / "workerlog.0").read_text() == "rank 0\n" and target.read_text() == "kept\n"


def test_the_fix_named_in_the_line_is_the_callers(tmp_path):
    (tmp_path / "log").symlink_to(tmp_path)
    with pytest.raises(ownpath.NotOwn, match=r"\(--log_dir DIR\)$"):
        ownpath.open_dir(tmp_path / "log", "--log_dir")


@as_root
def test_a_directory_another_user_makes_between_the_look_and_mkdir_is_refused(shared, monkeypatch):
    """The race of finding 9: they win it (their mkdir first), and theirs is refused, not taken."""
    real = os.mkdir

    def raced(name, mode=0o777, *, dir_fd=None):
        real(name, 0o777, dir_fd=dir_fd)
        os.chown(name, NOBODY, NOBODY, dir_fd=dir_fd)
        raise FileExistsError(name)
    monkeypatch.setattr(os, "mkdir", raced)
    with pytest.raises(ownpath.NotOwn, match=r"run is not yours alone \(it belongs to user nobody"):
        opened(shared / "run", create=True)
