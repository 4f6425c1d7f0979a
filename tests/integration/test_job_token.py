"""A job token for the meeting of the machines (dist.token_file), with real processes on
loopback: a machine holding another token is refused in one line (exit 2) while node 0
waits on; the machine holding the job's token then joins and both train to the same
weights. The token is in no file of the run, in no command line and in no environment."""

import os
from pathlib import Path

import pytest

from ..oracles import free_port, rank_statuses
from .netns import two_hosts  # noqa: F401  (fixture)
from .procs import PY, check, finish, run, start
from .test_missing_node import JOB


def _token_file(path: Path) -> str:
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return str(path)


def _node(rank, port, run_dir, token_file):
    return JOB + ["-o", f"dist.master=127.0.0.1:{port}", "-o", f"dist.node_rank={rank}",
                  "-o", "dist.rendezvous_timeout=60", "-o", f"output.run_dir={run_dir}",
                  "-o", f"dist.token_file={token_file}"]


def test_only_machines_holding_the_job_token_meet(tmp_path):
    token, other = _token_file(tmp_path / "job.token"), _token_file(tmp_path / "other.token")
    port, run_dir = free_port(), tmp_path / "run"
    node0, killer = start(_node(0, port, run_dir, token), limit=180)
    for line in node0.stdout:                          # node 0 waits for the other machine
        if "waiting for the other machines" in line:
            break
    intruder = run(_node(1, port, tmp_path / "intruder", other), timeout=60)
    assert intruder.returncode == 2, intruder.stderr
    [said] = [line for line in intruder.stderr.splitlines() if line.strip()]
    assert "wrong job token" in said
    # Issue 53, finding 9: the job's token, and another job's config (of the same user).
    other_job = run(_node(1, port, tmp_path / "other-job", token) + ["-o", "train.lr=0.5"], timeout=60)
    assert other_job.returncode == 2, other_job.stderr
    [said] = [line for line in other_job.stderr.splitlines() if line.strip()]
    assert "belongs to another job than node 0's: its config is not node 0's: train.lr differs" in said
    assert node0.poll() is None                        # still waiting, for the right machine
    node1 = check(run(_node(1, port, run_dir, token), timeout=120))
    out, err = finish(node0, killer, timeout=120)
    assert node0.returncode == 0, err
    records = rank_statuses(run_dir)
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]
    secret = Path(token).read_text().strip()
    for text in [out, err, node1.stdout, node1.stderr] + [
            p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file() and p.stat().st_size < 10 ** 7]:
        assert secret not in text and bytes.fromhex(secret).hex().upper() not in text


def test_a_token_file_open_to_others_is_refused_before_anything_starts(tmp_path):
    token = _token_file(tmp_path / "job.token")
    os.chmod(token, 0o644)
    result = run(_node(0, free_port(), tmp_path / "run", token), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"dist.token_file {token} is open to others (mode 0644); run: chmod 600 {token}" in result.stderr
    assert not (tmp_path / "run").exists()            # refused before the run directory


@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")
def test_another_users_token_file_is_refused_before_anything_starts(tmp_path):
    """Issue 53, finding 8: another user (uid 65534) made the file first, 0600; the user filled
    it with the docs' command. Node 0 refuses it in one line before it listens."""
    token = Path(_token_file(tmp_path / "job.token"))
    os.chown(token, 65534, 65534)                     # theirs, as when they made it first
    port = free_port()
    result = run(_node(0, port, tmp_path / "run", str(token)), timeout=60)
    assert result.returncode == 2, result.stderr
    [said] = [line for line in result.stderr.splitlines() if line.strip()]
    assert f"dist.token_file {token} belongs to user nobody (uid 65534), not to you" in said
    assert not (tmp_path / "run").exists()


def test_two_hosts_a_second_job_and_a_stranger_on_host_b_are_refused_and_the_job_goes_on(two_hosts, tmp_path):
    """A 2-host job with dist.token_file, in two network namespaces. While node 0 (host a)
    waits: a second job's node 0 at the same master cannot listen there, and a second
    job's node 1 on host b, holding another token, is refused by this job's node 0; each
    gets one line and exit 2. Then this job's node 1 joins and both ranks attest in
    Paddle's store with the token and train to the same weights."""
    token, other = _token_file(tmp_path / "job.token"), _token_file(tmp_path / "other.token")
    master, run_dir = f"{two_hosts.ip_a}:6177", tmp_path / "run"

    def node(rank, host, token_file, where):
        return two_hosts.cmd(host, [PY] + JOB + [
            "-o", f"dist.master={master}", "-o", f"dist.node_rank={rank}", "-o", "dist.rendezvous_timeout=60",
            "-o", f"output.run_dir={where}", "-o", f"dist.token_file={token_file}"])

    node0, killer = start(node(0, two_hosts.a, token, run_dir), limit=240)
    head = []
    for line in node0.stdout:
        head.append(line)
        if "waiting for the other machines" in line:
            break
    second = run(node(0, two_hosts.a, other, tmp_path / "second0"), timeout=60)
    stranger = run(node(1, two_hosts.b, other, tmp_path / "second1"), timeout=60)
    for refused, why in ((second, f"port 6177 of dist.master {master} is taken by pid {node0.pid} "),
                         (stranger, "wrong job token")):
        assert refused.returncode == 2, refused.stderr
        [said] = [line for line in refused.stderr.splitlines() if line.strip()]
        assert why in said
    assert node0.poll() is None                        # still waiting, for its own node 1
    node1 = check(run(node(1, two_hosts.b, token, run_dir), timeout=180))
    out, err = finish(node0, killer, timeout=180)
    assert node0.returncode == 0, err
    records = rank_statuses(run_dir)
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]
    assert f"meeting at {master} (token of {token})" in "".join(head)
    assert "paddle_dist: security:" not in out + node1.stdout + node1.stderr
