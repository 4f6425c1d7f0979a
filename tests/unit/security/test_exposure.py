"""What a job says it exposes (paddle_dist/security/exposure.py): every listener, where, and what
guards it, for each way a job runs; the start line and doctor's rows say the same."""

from paddle_dist.security import exposure
from paddle_dist.config import load


def _said(overrides, gate=""):
    return {p.what: (p.where, p.guard) for p in exposure.listeners(load(overrides=overrides), gate)}


def test_a_one_machine_job_names_its_gate_and_what_stays_open():
    said = _said(["dist.nprocs=2"], gate="127.0.0.1:40123")
    assert list(said) == ["gate", "Paddle's store", "gloo/NCCL"]
    assert said["gate"] == ("at 127.0.0.1:40123", "a token made for the job")
    assert said["Paddle's store"] == ("on every interface of rank 0's machine",
                                      "unauthenticated; paddle_dist's ranks attest in it")
    assert said["gloo/NCCL"] == ("on loopback", "unauthenticated, unencrypted")


def test_machines_without_a_token_are_told_how_to_get_one():
    said = _said(["dist.nnodes=2", "dist.master=10.0.0.1:6170"])
    assert said["meeting"] == ("at 10.0.0.1:6170", "unauthenticated; -o dist.token_file=PATH")
    assert said["Paddle's launchers' rendezvous"] == ("at 10.0.0.1:6170, after the meeting",
                                                      "served by paddle_dist to the machines that met alone")
    assert "-o dist.token_file=PATH has paddle_dist's ranks attest" in said["Paddle's store"][1]


def test_machines_with_a_token_say_whose_it_is(tmp_path):
    said = _said(["dist.nnodes=2", "dist.master=10.0.0.1:6170", f"dist.token_file={tmp_path}/t"])
    assert said["meeting"][1] == f"token of {tmp_path}/t"
    assert said["Paddle's store"][1] == "unauthenticated; paddle_dist's ranks attest in it"


def test_the_start_line_is_one_line_with_every_listener():
    line = exposure.start_line(load(overrides=["dist.launcher=spawn"]))
    assert "\n" not in line and line.startswith("paddle_dist: exposure: Paddle's store on every interface")
    assert line.endswith("gloo/NCCL on loopback (unauthenticated, unencrypted); docs/security.md")
    assert exposure.rows(load(overrides=["dist.launcher=spawn"]))[0][0] == "Paddle's store"


def test_machines_meeting_over_tls_say_so(tmp_path):
    said = _said(["dist.nnodes=2", "dist.master=10.0.0.1:6170", f"dist.token_file={tmp_path}/t",
                  f"dist.tls_ca={tmp_path}/ca.pem", f"dist.tls_cert={tmp_path}/n.pem", f"dist.tls_key={tmp_path}/n.key"])
    assert said["meeting"][1] == f"token of {tmp_path}/t + mutual TLS 1.3 with certificates of {tmp_path}/ca.pem"


def test_an_isolated_job_says_no_other_user_reaches_any_of_it():
    said = _said(["dist.isolate=true"])
    assert set(said) == {"gate", "Paddle's store", "gloo/NCCL"}
    for where, guard in said.values():
        assert where == "in the job's own network namespace" and guard.endswith("; no other user reaches it")
