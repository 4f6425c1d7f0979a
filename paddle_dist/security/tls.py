"""Mutual TLS for the machines' meeting (launch/rendezvous.py): who may even speak to node 0.

With `dist.tls_ca`, `dist.tls_cert` and `dist.tls_key` (all three or none) the machines of
a job meet over TLS 1.3, and both sides must show a certificate signed by the job's CA.
The certificate says "one of our machines"; the job token (auth.py), still proven inside
the TLS channel, says "a machine of this job". Without the keys nothing here runs.

Host names: a machine checks that node 0's certificate names the host of dist.master (an
IP address or DNS subject alternative name), as a browser checks a web server's: a
certificate of the CA stolen from any other machine then cannot pose as node 0. Node 0
checks no host name of the machines that connect: their addresses are whatever their
route gives (NAT, several interfaces), and which machine it is matters less than which
job it belongs to, which the token proves.

This module imports nothing but the standard library.

Example:
    files = configured("/etc/pd/ca.pem", "/etc/pd/node.pem", "/etc/pd/node.key")
    check(files, "10.0.0.1:6170", serves=True)     # a UserError if node 0 could not serve with them
    shake = Accepting(server_context(files), accepted_socket)   # node 0, step by step
    sock = Client(files, "10.0.0.1:6170").wrap(connected_socket)  # the other machines
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass
from typing import Optional

from ..errors import UserError
from . import auth

KEYS = ("tls_ca", "tls_cert", "tls_key")
HANDSHAKE_RECORD = b"\x16"    # the first byte of a TLS ClientHello (a handshake record)
ENDED_LIMIT = 3               # handshakes node 0 ends in a row before this machine gives up
MAKE = "make them with the openssl commands in docs/security.md"
PLAINTEXT = ("node 0 admits only machines that speak TLS; give this machine the job's "
             "dist.tls_ca, dist.tls_cert and dist.tls_key")
WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)

# OpenSSL's X509_V_ERR_* codes (include/openssl/x509_vfy.h) for a certificate of another CA:
# no issuer certificate, a self-signed certificate or chain, a leaf that cannot be verified.
FOREIGN = (2, 18, 19, 20, 21)
EXPIRED, NOT_YET_VALID, HOST_MISMATCH, IP_MISMATCH = 10, 9, 62, 64

# Node 0's alerts, as the OpenSSL reasons that carry them, in plain words.
ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "is not signed by node 0's dist.tls_ca; give every machine a "
                              "certificate of the job's CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "has expired; renew it (docs/security.md)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "was refused; it must be signed by the job's CA and allow "
                                   "client use (extendedKeyUsage clientAuth)",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "was refused; it must allow client use "
                                           "(extendedKeyUsage clientAuth)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "was refused; it must be signed by the job's CA and "
                                       "allow client use (extendedKeyUsage clientAuth)",
}


@dataclass(frozen=True)
class Files:
    """This machine's TLS files: the job's CA, its certificate and that certificate's key."""
    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class Contents:
    """What the TLS files hold, read once (security/credentials.py): contexts made from it
    open none of the files again."""
    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def read(cls, files: Files) -> "Contents":
        """Each file once, when it is the user's (auth.read_own): the key the user's alone,
        the CA and the certificate writable by no one else."""
        return cls(**{name: auth.read_own(getattr(files, name), f"dist.tls_{name}", MAKE, private=name == "key")
                      for name in ("ca", "cert", "key")})


def configured(ca: str = "", cert: str = "", key: str = "") -> Optional[Files]:
    """The TLS files, None when TLS is off (no key given); a one-line UserError naming the
    missing keys when only some are given.

    Example:
        configured("ca.pem", "node.pem", "")   # UserError: ... missing dist.tls_key; ...
    """
    given = dict(zip(KEYS, (ca, cert, key)))
    missing = [f"dist.{k}" for k, v in given.items() if not v]
    if len(missing) == len(KEYS):
        return None
    if missing:
        raise UserError(f"dist.tls_ca, dist.tls_cert and dist.tls_key go together: missing "
                        f"{' and '.join(missing)}; give all three (docs/security.md) or none")
    return Files(ca, cert, key)


def server_context(files: Files, contents: Optional[Contents] = None) -> ssl.SSLContext:
    """Node 0's context: TLS 1.3 only, a client certificate of the CA required, no host name
    checked (the module's docstring says why), no session tickets (nothing resumes).

    Example:
        server_context(Files("ca.pem", "node0.pem", "node0.key")).verify_mode  # CERT_REQUIRED
    """
    context = _context(ssl.PROTOCOL_TLS_SERVER, files, contents)
    context.verify_mode = ssl.CERT_REQUIRED
    context.num_tickets = 0
    return context


def client_context(files: Files, contents: Optional[Contents] = None) -> ssl.SSLContext:
    """The other machines' context: TLS 1.3 only, node 0's certificate checked against the CA
    and against the host of dist.master (server_hostname at wrap time).

    Example:
        client_context(Files("ca.pem", "node1.pem", "node1.key")).check_hostname   # True
    """
    context = _context(ssl.PROTOCOL_TLS_CLIENT, files, contents)
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    return context


def _context(protocol: int, files: Files, contents: Optional[Contents] = None) -> ssl.SSLContext:
    """A context of `files`, or of their `contents` when given: the CA as data, the
    certificate and key from a memory file (ssl loads a key from a path only)."""
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    auth.check_own(files.key, "dist.tls_key", MAKE)
    try:
        if contents is not None:
            context.load_verify_locations(cadata=contents.ca.decode("ascii", "replace"))
        else:
            context.load_verify_locations(cafile=files.ca)
    except (OSError, ValueError) as e:       # ssl.SSLError included: no PEM certificate
        raise UserError(f"dist.tls_ca {files.ca} cannot be used as the job's CA "
                        f"({_why(e)}); {MAKE}") from None
    try:
        # A key protected by a passphrase is refused rather than asked for on a terminal
        # that a launched machine does not have.
        if contents is not None and hasattr(os, "memfd_create"):
            fd = os.memfd_create("paddle_dist-tls")
            try:
                os.write(fd, contents.cert.rstrip(b"\n") + b"\n" + contents.key)
                context.load_cert_chain(f"/proc/self/fd/{fd}", password=_no_passphrase)
            finally:
                os.close(fd)
        else:
            context.load_cert_chain(files.cert, files.key, password=_no_passphrase)
    except (OSError, ValueError) as e:
        raise UserError(f"dist.tls_cert {files.cert} and dist.tls_key {files.key} are not a "
                        f"certificate and its unencrypted private key ({_why(e)}); {MAKE}") from None
    return context


def _no_passphrase() -> bytes:
    raise ValueError("a key protected by a passphrase")


def _why(error: Exception) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return error.reason.lower().replace("_", " ")
    return getattr(error, "strerror", None) or str(error)


def host_of(master: str) -> str:
    """The host of a host:port, e.g. "10.0.0.1" of "10.0.0.1:6170"."""
    return master.rpartition(":")[0].strip("[]")


# ------------------------------------------------------------------ node 0
class Accepting:
    """Node 0's side of one connection's handshake, a step each time its socket is ready, so
    that a slow or silent machine never holds up the others (node 0 serves them all from one
    select() loop). `sock` is the connection: the accepted socket, then its TLS wrapper.

    Example:
        shake = Accepting(server_context(files), accepted)
        shake.step()    # 'read': step again once shake.sock is readable ... 'done'
    """

    def __init__(self, context: ssl.SSLContext, sock: socket.socket):
        self.context, self.sock = context, sock

    def step(self) -> str:
        """'done'; 'read' or 'write': wait until `sock` is ready so, then step again;
        'plaintext': it spoke the gate's protocol without TLS (tell it PLAINTEXT);
        'failed': drop it (no TLS, a certificate refused, gone)."""
        if not isinstance(self.sock, ssl.SSLSocket):
            first = _peek(self.sock)
            if first is None:
                return "read"
            if first != HANDSHAKE_RECORD:
                return self._refuse(first)
            try:
                self.sock = self.context.wrap_socket(self.sock, server_side=True,
                                                     do_handshake_on_connect=False)
            except OSError:
                return "failed"
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            return "read"
        except ssl.SSLWantWriteError:
            return "write"
        except OSError:            # OpenSSL has sent the alert that tells the machine why
            return "failed"
        return "done"

    def _refuse(self, first: bytes) -> str:
        # A frame of the gate's protocol starts with the high byte of a length of at most
        # 4 KiB: 0. Read what it sent first, so that closing does not reset the connection
        # before the machine has read why.
        try:
            self.sock.recv(1 << 16)
        except OSError:
            pass
        return "plaintext" if first == b"\0" else "failed"


def _peek(sock: socket.socket) -> Optional[bytes]:
    """The first byte waiting on `sock`, b"" when it is closed, None when nothing came yet."""
    try:
        return sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return None
    except OSError:
        return b""


# ------------------------------------------------------------------ the other machines
class Client:
    """A machine's side: wraps each connection to node 0 in TLS, checking node 0's
    certificate, and turns node 0's refusals into one line.

    Example:
        client = Client(files, "10.0.0.1:6170")
        sock = client.wrap(socket.create_connection(("10.0.0.1", 6170), timeout=2))
    """

    def __init__(self, files: Files, master: str, context: Optional[ssl.SSLContext] = None):
        self.files, self.master, self.ended = files, master, 0
        self.context = context or client_context(files)     # context: made from `files` already

    def wrap(self, sock: socket.socket) -> Optional[ssl.SSLSocket]:
        """`sock` in TLS; None when the handshake did not finish (try again); a UserError
        when node 0's certificate cannot be trusted, node 0 refused this machine's, or node 0
        ended ENDED_LIMIT handshakes in a row (it speaks no TLS)."""
        try:
            wrapped = self.context.wrap_socket(sock, server_hostname=host_of(self.master))
        except ssl.SSLCertVerificationError as e:
            raise UserError(self._untrusted(e)) from None
        except (ssl.SSLEOFError, ConnectionError):
            sock.close()
            self.ended += 1
            if self.ended >= ENDED_LIMIT:
                raise UserError(f"paddle_dist: node 0 at {self.master} ended {self.ended} TLS "
                                "handshakes: it runs without TLS; give it the same dist.tls_ca, "
                                "dist.tls_cert and dist.tls_key as this machine") from None
            return None
        except ssl.SSLError as e:
            raise UserError(refusal(e, self.master, self.files.cert)) from None
        except OSError:            # a timeout: node 0 busy, or not node 0 (the caller says)
            sock.close()
            return None
        self.ended = 0
        return wrapped

    def _untrusted(self, error: ssl.SSLCertVerificationError) -> str:
        host = host_of(self.master)
        return (f"paddle_dist: node 0's certificate at {self.master} "
                f"{verdict(error, host, self.files.ca)}")


def verdict(error: ssl.SSLCertVerificationError, host: str, ca: str) -> str:
    """What is wrong with a certificate that failed verification, and how to fix it.

    Example:
        verdict(error, "10.0.0.1", "ca.pem")   # 'has expired; renew it ...'
    """
    code = error.verify_code
    if code in FOREIGN:
        return (f"is not signed by dist.tls_ca {ca}; give every machine a certificate of the "
                "same CA (docs/security.md)")
    if code == EXPIRED:
        return "has expired; renew it (docs/security.md)"
    if code == NOT_YET_VALID:
        return "is not valid yet; check the clock of both machines"
    if code in (HOST_MISMATCH, IP_MISMATCH):
        return (f"does not name {host}, the host of dist.master; give node 0 a certificate with "
                f"subjectAltName IP:{host} (DNS:NAME for a host name) (docs/security.md)")
    return f"cannot be verified ({error.verify_message}); {MAKE}"


def refusal(error: BaseException, master: str, cert: str) -> str:
    """The line for node 0's TLS alert `error`; "" when `error` is none (not a TLS error, or a
    connection that merely ended: the caller tries again).

    Example:
        refusal(ssl_error_unknown_ca, "10.0.0.1:6170", "node.pem")
        # "paddle_dist: node 0 at 10.0.0.1:6170 refused this machine's certificate (dist.tls_cert
        #  node.pem): it is not signed by node 0's dist.tls_ca; ..."
    """
    ended = (ssl.SSLEOFError, ssl.SSLZeroReturnError) + WANT
    if not isinstance(error, ssl.SSLError) or isinstance(error, ended):
        return ""
    if error.reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return (f"paddle_dist: node 0 at {master} requires a client certificate; give this machine "
                "dist.tls_ca, dist.tls_cert and dist.tls_key")
    if error.reason in ALERTS:
        return (f"paddle_dist: node 0 at {master} refused this machine's certificate "
                f"(dist.tls_cert {cert}): it {ALERTS[error.reason]}")
    if error.reason == "WRONG_VERSION_NUMBER":
        return (f"paddle_dist: what answers at dist.master {master} speaks no TLS: not node 0 of "
                "this job, or node 0 without dist.tls_*; give every machine the same dist.tls_* keys")
    return (f"paddle_dist: TLS with node 0 at {master} failed ({_why(error)}); node 0 and this "
            "machine need TLS 1.3 and certificates of the same CA (docs/security.md)")


# ------------------------------------------------------------------ pre-flight
def check(files: Files, master: str, serves: bool) -> None:
    """Raise a one-line UserError unless these files would pass the other side's checks:
    readable, the key owner-only, and the certificate signed by the CA, valid now, and as
    node 0's (`serves`) naming the host of `master`. A handshake in memory checks this with
    OpenSSL's own rules, before any socket or run directory exists.

    Example:
        check(Files("ca.pem", "old.pem", "old.key"), "10.0.0.1:6170", serves=False)
        # UserError: dist.tls_cert old.pem has expired; renew it (docs/security.md)
    """
    check_contexts(server_context(files), client_context(files), files, master, serves)


def check_contexts(server: ssl.SSLContext, client: ssl.SSLContext, files: Files, master: str,
                   serves: bool) -> None:
    """`check` on contexts already made from `files` (security/credentials.py: the job's own,
    loaded once): their settings are changed for the handshake in memory and put back."""
    host = host_of(master)
    kept = (server.verify_mode, client.check_hostname, client.verify_mode)
    if serves:       # node 0's certificate, as the other machines will check it
        server.verify_mode = ssl.CERT_NONE
        client.check_hostname = bool(host)
    else:            # this machine's certificate, as node 0 will check it
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    try:
        _handshake_in_memory(server, client, host or None)
    except ssl.SSLCertVerificationError as e:
        raise UserError(f"dist.tls_cert {files.cert} {verdict(e, host, files.ca)}") from None
    except ssl.SSLError as e:
        raise UserError(f"dist.tls_cert {files.cert} cannot be used with dist.tls_ca {files.ca} "
                        f"({_why(e)}); {MAKE}") from None
    finally:
        server.verify_mode = kept[0]
        client.verify_mode = kept[2]          # before check_hostname: True needs CERT_REQUIRED
        client.check_hostname = kept[1]


def _handshake_in_memory(server: ssl.SSLContext, client: ssl.SSLContext, host: Optional[str]) -> None:
    """A TLS handshake between the two contexts through memory buffers; raises what fails."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    sides = [client.wrap_bio(to_client, to_server, server_hostname=host),
             server.wrap_bio(to_server, to_client, server_side=True)]
    for _ in range(8):         # TLS 1.3 needs 2 round trips; more means something is wrong
        sides = [side for side in sides if not _done(side)]
        if not sides:
            return
    raise ssl.SSLError("the handshake in memory did not finish")


def _done(side: ssl.SSLObject) -> bool:
    try:
        side.do_handshake()
    except ssl.SSLWantReadError:
        return False
    return True
