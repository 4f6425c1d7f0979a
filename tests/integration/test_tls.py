"""Mutual TLS and a job token for the meeting of the machines, with real processes on
loopback: a machine whose certificate is of another CA is refused in one line (exit 2)
while node 0 waits on; the machine with the job's certificate and token then joins and
both train to the same weights. TLS files that cannot be used are refused before the run
directory exists."""

import re

from tests.unit.security.test_tls import pki  # noqa: F401  (fixture: certificates made by openssl)
from ..oracles import free_port, rank_statuses
from .procs import ROOT, check, finish, run, start
from .test_job_token import _node as _token_node
from .test_job_token import _token_file


def _node(rank, port, run_dir, token_file, files):
    return _token_node(rank, port, run_dir, token_file) + [
        "-o", f"dist.tls_ca={files.ca}", "-o", f"dist.tls_cert={files.cert}", "-o", f"dist.tls_key={files.key}"]


def test_only_machines_with_a_certificate_of_the_ca_and_the_token_meet(tmp_path, pki):  # noqa: F811
    token = _token_file(tmp_path / "job.token")
    port, run_dir = free_port(), tmp_path / "run"
    node0, killer = start(_node(0, port, run_dir, token, pki["node0"]), limit=180)
    for line in node0.stdout:                          # node 0 waits for the other machine
        if "waiting for the other machines" in line:
            break
    # The intruder even holds the token, but its certificate and CA are another's: it cannot
    # trust node 0, and node 0 would not trust it (tests/unit/security/test_tls.py tries each side).
    intruder = run(_node(1, port, tmp_path / "intruder", token, pki["other_ca"]), timeout=60)
    assert intruder.returncode == 2, intruder.stderr
    [said] = [line for line in intruder.stderr.splitlines() if line.strip()]
    assert f"node 0's certificate at 127.0.0.1:{port} is not signed by dist.tls_ca" in said
    assert node0.poll() is None                        # still waiting, for the right machine
    check(run(_node(1, port, run_dir, token, pki["node1"]), timeout=120))
    out, err = finish(node0, killer, timeout=120)
    assert node0.returncode == 0, err
    records = rank_statuses(run_dir)
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]


def test_tls_files_that_cannot_be_used_are_refused_before_anything_starts(tmp_path, pki):  # noqa: F811
    token = _token_file(tmp_path / "job.token")
    partial = _token_node(0, free_port(), tmp_path / "run", token) + ["-o", f"dist.tls_ca={pki['node0'].ca}"]
    result = run(partial, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "missing dist.tls_cert and dist.tls_key; give all three" in result.stderr
    result = run(_node(1, free_port(), tmp_path / "run", token, pki["expired"]), timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"dist.tls_cert {pki['expired'].cert} has expired; renew it" in result.stderr
    assert not (tmp_path / "run").exists()            # refused before the run directory


COUNTING = ROOT / "tests" / "integration" / "scripts" / "counting_reads.py"


def test_each_launcher_reads_the_token_and_each_tls_file_once(tmp_path, pki):  # noqa: F811
    """The pre-flight, the meeting of the machines and the rank gate share what one read
    gave (security/credentials.py): each launcher process opens the token file once, and
    each TLS file once (its server and client contexts are made from that read; the
    pre-flight's handshake in memory uses those same contexts)."""
    token, port, run_dir = _token_file(tmp_path / "job.token"), free_port(), tmp_path / "run"

    def counted(rank):
        files = pki[f"node{rank}"]
        return [str(COUNTING), ",".join([token, files.ca, files.cert, files.key])] + _node(rank, port, run_dir,
                                                                                          token, files)
    node0, killer = start(counted(0), limit=180)
    for line in node0.stdout:                          # node 0 waits for the other machine
        if "waiting for the other machines" in line:
            break
    node1 = check(run(counted(1), timeout=120))
    out, err = finish(node0, killer, timeout=120)
    assert node0.returncode == 0, err
    for rank, stderr in ((0, err), (1, node1.stderr)):
        files = pki[f"node{rank}"]
        counts = {path: int(n) for n, path in re.findall(r"^read (\d+) (\S+)$", stderr, re.M)}
        assert counts == {token: 1, files.ca: 1, files.cert: 1, files.key: 1}, (rank, counts)
