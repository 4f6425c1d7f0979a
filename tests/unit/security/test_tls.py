"""Mutual TLS for the node gate (paddle_dist/security/tls.py), with certificates made by the openssl
command line and real loopback sockets: the right certificates (and token) meet; a
plaintext machine, a certificate of another CA, an expired one and none are each refused
(in one line where the machine is paddle_dist) while node 0 waits on for the right machine;
a machine refuses a node 0 it cannot trust; a slow or silent handshake holds up nobody."""

import os
import shutil
import socket
import ssl
import subprocess
from dataclasses import replace

import pytest

from paddle_dist.launch import launcher, rendezvous, preflight
from paddle_dist.security import credentials, tls
from paddle_dist.config import load
from paddle_dist.errors import UserError
from paddle_dist.runtime.devices import GpuInfo

from tests.unit.security.test_auth import _token_file
from tests.unit.launch.test_rendezvous import _listening, _Node

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None,
                                reason="needs the openssl command line to make certificates")

CA_CONF = """[ca]
default_ca = job
[job]
database = index
new_certs_dir = .
serial = serial
default_md = sha256
policy = any
[any]
commonName = supplied
"""


def _openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(cwd, name):
    _openssl(cwd, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-days", "30", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", f"{name}.key", "-out", f"{name}.pem")


def _machine(cwd, name, ca, san="IP:127.0.0.1", dates=None):
    """A certificate for `name` signed by `ca`: (cert, key) paths; `dates`: (start, end) as
    openssl ca takes them, for one that expired long ago."""
    (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl(cwd, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
    if dates:
        (cwd / "ca.cnf").write_text(CA_CONF)
        (cwd / "index").write_text("")
        (cwd / "serial").write_text("01\n")
        _openssl(cwd, "ca", "-batch", "-config", "ca.cnf", "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key",
                 "-in", f"{name}.csr", "-out", f"{name}.pem", "-startdate", dates[0], "-enddate", dates[1],
                 "-extfile", f"{name}.ext", "-notext")
    else:
        _openssl(cwd, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-days", "30", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    (cwd / f"{name}.key").chmod(0o600)
    return str(cwd / f"{name}.pem"), str(cwd / f"{name}.key")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """name -> (ca, cert, key): node0 and node1 of the job's CA, `foreign` of another CA,
    `expired` (2020), `elsewhere` (a certificate of the CA for 10.9.9.9, not 127.0.0.1)."""
    cwd = tmp_path_factory.mktemp("pki")
    _ca(cwd, "ca")
    _ca(cwd, "other")
    ca = str(cwd / "ca.pem")
    made = {name: _machine(cwd, name, "ca") for name in ("node0", "node1")}
    made["foreign"] = _machine(cwd, "foreign", "other")
    made["expired"] = _machine(cwd, "expired", "ca", dates=("20200101000000Z", "20200201000000Z"))
    made["elsewhere"] = _machine(cwd, "elsewhere", "ca", san="IP:10.9.9.9")
    out = {name: tls.Files(ca, cert, key) for name, (cert, key) in made.items()}
    out["other_ca"] = tls.Files(str(cwd / "other.pem"), *made["foreign"])
    return out


def _gate(port, node_rank, files=None, token_file="", timeout=10.0):
    keys = dict(tls_ca=files.ca, tls_cert=files.cert, tls_key=files.key) if files else {}
    return rendezvous.MeetingPlace(f"127.0.0.1:{port}", 2, node_rank, 1, timeout, token_file=token_file, **keys)


def _node_0(files, token_file="", timeout=10.0):
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, files, token_file, timeout))
    host.start()
    _listening(port)
    return port, host


def _refused(gate) -> str:
    with pytest.raises(UserError) as refused:
        rendezvous.meet(gate)
    said = str(refused.value)
    assert "\n" not in said
    return said


def _right_machine_joins(port, host, files, token_file=""):
    assert host.is_alive()                      # node 0 still waits, for the right machine
    right = _Node(_gate(port, 1, files, token_file))
    right.start()
    assert right.result() is None and host.result() is None


# ---------------------------------------------------------------- contexts and files
def test_both_sides_ask_tls_1_3_and_a_certificate_of_the_ca(pki):
    server, client = tls.server_context(pki["node0"]), tls.client_context(pki["node1"])
    for context in (server, client):
        assert context.minimum_version == ssl.TLSVersion.TLSv1_3
        assert context.verify_mode == ssl.CERT_REQUIRED
    assert client.check_hostname and not server.check_hostname


@pytest.mark.parametrize("given,missing", [((1, 0, 0), "dist.tls_cert and dist.tls_key"),
                                           ((1, 1, 0), "dist.tls_key"), ((0, 1, 1), "dist.tls_ca")])
def test_the_three_keys_go_together(given, missing):
    assert tls.configured() is None
    with pytest.raises(UserError, match=f"go together: missing {missing}; give all three"):
        tls.configured(*("x" if g else "" for g in given))


def test_a_key_open_to_others_missing_files_and_an_encrypted_key_are_refused(pki, tmp_path):
    right = pki["node1"]
    wide = tmp_path / "wide.key"
    wide.write_bytes(open(right.key, "rb").read())
    wide.chmod(0o644)
    with pytest.raises(UserError, match=rf"dist.tls_key {wide} is open to others \(mode 0644\); run: chmod 600"):
        tls.client_context(tls.Files(right.ca, right.cert, str(wide)))
    with pytest.raises(UserError, match="dist.tls_key .* cannot be read"):
        tls.client_context(tls.Files(right.ca, right.cert, str(tmp_path / "none.key")))
    with pytest.raises(UserError, match="dist.tls_ca .* cannot be used as the job's CA"):
        tls.client_context(tls.Files(right.key, right.cert, right.key))
    _openssl(tmp_path, "pkey", "-in", right.key, "-aes256", "-passout", "pass:secret", "-out", "locked.key")
    (tmp_path / "locked.key").chmod(0o600)
    with pytest.raises(UserError, match="are not a certificate and its unencrypted private key"):
        tls.client_context(tls.Files(right.ca, right.cert, str(tmp_path / "locked.key")))


@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")
def test_a_key_or_ca_of_another_user_is_refused(pki, tmp_path):
    """Issue 53, finding 8: the key's mode alone was checked; one another user (uid 65534)
    made first, or can change, is theirs. A CA they can change admits their machines."""
    right = pki["node1"]
    for name in ("theirs.key", "theirs.pem"):
        shutil.copy(right.key if name.endswith(".key") else right.ca, tmp_path / name)
        (tmp_path / name).chmod(0o600)
        os.chown(tmp_path / name, 65534, 65534)
    theirs = str(tmp_path / "theirs.key")
    with pytest.raises(UserError, match=rf"^dist.tls_key {theirs} belongs to user nobody \(uid 65534\), not to you"):
        tls.client_context(tls.Files(right.ca, right.cert, theirs))
    with pytest.raises(UserError, match=rf"^dist.tls_key {theirs} belongs to user nobody"):
        credentials.contexts(tls.Files(right.ca, right.cert, theirs))
    with pytest.raises(UserError, match=r"^dist.tls_ca .*theirs.pem belongs to user nobody"):
        credentials.contexts(tls.Files(str(tmp_path / "theirs.pem"), right.cert, right.key))


def test_check_names_an_expired_certificate_another_ca_and_a_missing_host_name(pki):
    master = "127.0.0.1:6170"
    tls.check(pki["node0"], master, serves=True)
    tls.check(pki["elsewhere"], master, serves=False)     # a machine's address is not checked
    with pytest.raises(UserError, match="dist.tls_cert .*expired.pem has expired; renew it"):
        tls.check(pki["expired"], master, serves=False)
    with pytest.raises(UserError, match="foreign.pem is not signed by dist.tls_ca .*ca.pem"):
        tls.check(replace(pki["foreign"], ca=pki["node0"].ca), master, serves=True)
    with pytest.raises(UserError, match="does not name 127.0.0.1, the host of dist.master"):
        tls.check(pki["elsewhere"], master, serves=True)


def test_preflight_refuses_unusable_tls_files_like_a_token_file(pki):
    def problems(*overrides):
        return preflight.refusals(load(None, list(overrides)), {}, GpuInfo())

    assert problems() == [] and problems(*_keys(pki["node0"])) == []
    [partial] = problems(f"dist.tls_ca={pki['node0'].ca}")
    assert partial.severity == "error" and "missing dist.tls_cert and dist.tls_key" in partial.message
    [expired] = problems(*_keys(pki["expired"]), "dist.node_rank=1", "dist.nnodes=2",
                         "dist.master=127.0.0.1:6170")
    assert "has expired" in expired.message


def test_the_launch_plan_gives_the_gate_the_tls_files(pki):
    cfg = load(None, ["dist.nnodes=2", "dist.master=127.0.0.1:6170", *_keys(pki["node0"])])
    gate = launcher.gate_of(cfg, 1)
    assert (gate.tls_ca, gate.tls_cert, gate.tls_key) == (cfg.dist.tls_ca, cfg.dist.tls_cert, cfg.dist.tls_key), \
        "launcher.gate_of must pass dist.tls_ca, dist.tls_cert and dist.tls_key to rendezvous.MeetingPlace"


def _keys(files):
    return [f"dist.tls_ca={files.ca}", f"dist.tls_cert={files.cert}", f"dist.tls_key={files.key}"]


# ---------------------------------------------------------------- the gate
@pytest.mark.parametrize("with_token", [True, False])
def test_machines_with_certificates_of_the_ca_meet(pki, tmp_path, with_token):
    token = _token_file(tmp_path) if with_token else ""
    port, host = _node_0(pki["node0"], token)
    _right_machine_joins(port, host, pki["node1"], token)


def test_the_token_is_still_proven_inside_the_tls_channel(pki, tmp_path):
    token = _token_file(tmp_path)
    port, host = _node_0(pki["node0"], token)
    assert "wrong job token" in _refused(_gate(port, 1, pki["node1"], _token_file(tmp_path, "other.token")))
    _right_machine_joins(port, host, pki["node1"], token)


def test_a_plaintext_machine_is_told_in_one_line_and_node_0_waits_on(pki, tmp_path):
    token = _token_file(tmp_path)
    port, host = _node_0(pki["node0"], token)
    said = _refused(_gate(port, 1, None, token))
    assert "node 0 admits only machines that speak TLS" in said
    _right_machine_joins(port, host, pki["node1"], token)


@pytest.mark.parametrize("intruder,words", [
    ("foreign", "foreign.pem): it is not signed by node 0's dist.tls_ca"),
    ("expired", "expired.pem): it has expired; renew it")])
def test_a_certificate_of_another_ca_or_an_expired_one_is_refused_and_node_0_waits_on(
        pki, tmp_path, intruder, words):
    """The intruder trusts the job's CA (its certificate is public), so node 0's certificate
    passes; node 0 refuses the intruder's, and its alert becomes the intruder's one line."""
    token = _token_file(tmp_path)
    port, host = _node_0(pki["node0"], token)
    bad = replace(pki[intruder], ca=pki["node0"].ca)
    said = _refused(_gate(port, 1, bad, token))
    assert f"node 0 at 127.0.0.1:{port} refused this machine's certificate" in said and words in said
    _right_machine_joins(port, host, pki["node1"], token)


def test_a_connection_without_a_client_certificate_is_dropped(pki, tmp_path):
    """Not a paddle_dist machine (paddle_dist always shows its certificate): a TLS client
    that shows none gets nowhere, and node 0 waits on."""
    token = _token_file(tmp_path)
    port, host = _node_0(pki["node0"], token)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(pki["node0"].ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:           # TLS 1.3: the client's handshake ends before node 0 has seen its certificate
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.sendall(rendezvous.encode({"v": rendezvous.VERSION, "node_rank": 1, "nnodes": 2, "nprocs": 1}))
                answer = sock.recv(8192)
        except OSError as e:                   # ssl.SSLError included
            answer = e
    assert not answer or isinstance(answer, OSError)       # an alert or the end, never a message
    _right_machine_joins(port, host, pki["node1"], token)


@pytest.mark.parametrize("node_0,words", [
    ("foreign", "is not signed by dist.tls_ca"),
    ("elsewhere", "does not name 127.0.0.1, the host of dist.master")])
def test_a_machine_refuses_a_node_0_it_cannot_trust(pki, node_0, words):
    port, host = _node_0(pki[node_0], timeout=3)
    said = _refused(_gate(port, 1, pki["node1"]))
    assert said.startswith(f"paddle_dist: node 0's certificate at 127.0.0.1:{port} ") and words in said
    assert isinstance(host.result(), rendezvous.NodesMissing)      # it waited on for a machine that trusts it


def test_a_tls_machine_is_told_in_one_line_when_node_0_runs_without_tls(pki):
    port, host = _node_0(None, timeout=5)
    said = _refused(_gate(port, 1, pki["node1"]))
    assert f"node 0 at 127.0.0.1:{port} ended 3 TLS handshakes: it runs without TLS" in said
    assert host.is_alive()


def test_slow_silent_and_plaintext_connections_hold_up_no_handshake(pki, tmp_path):
    """Node 0 takes each handshake a step at a time: a connection that sent half a TLS
    record, one that says nothing and one that speaks HTTP do not keep the machine out."""
    token = _token_file(tmp_path)
    port, host = _node_0(pki["node0"], token, timeout=20)
    holders = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(30)]
    try:
        holders[0].sendall(b"\x16\x03\x01\x02\x00\x01")      # the start of a ClientHello, no more
        holders[1].sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert rendezvous.meet(_gate(port, 1, pki["node1"], token, timeout=4)).nodes[1].nprocs == 1
        assert host.result() is None
    finally:
        for sock in holders:
            sock.close()
