"""The job token, and the proofs that the machines of a job hold it.

A token is 32 random bytes, kept as 64 hexadecimal digits in a file that only its owner
can read (`dist.token_file`, the same file on every machine). It never travels: each side
of the machines' meeting (launch/rendezvous.py) proves it holds the token with an
HMAC-SHA256 of fresh nonces from both sides, bound to the job, the node and a direction
label, so that a proof cannot be replayed on another connection nor reflected back to its
sender.

This module imports nothing but the standard library, so that a rank's admission
(rankgate.py, run as a plain script before the rank's own program) starts in milliseconds.

Example:
    token = read_token("/etc/paddle_dist/job.token")
    mine = proof(token, "client", "10.0.0.1:6170/2", 1, server_nonce, client_nonce)
    matches(proof(token, "client", ...), received)        # constant time
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

try:
    from ..errors import UserError
except ImportError:            # imported by rankgate.py run as a script, which puts paddle_dist/ on sys.path
    from errors import UserError

TOKEN_BYTES = 32
NONCE_BYTES = 32
PROOF_HEX = 64                 # hex digits of an HMAC-SHA256
DOMAIN = b"paddle_dist node gate v1"
CREATE = ('make one with: (umask 077; python3 -c "import secrets; print(secrets.token_hex(32))" '
          "> PATH), and copy it to the same path on every machine")


def read_token(path: str) -> bytes:
    """The token in `path`; a one-line UserError when it cannot be one: missing, readable
    or writable by anyone but its owner, or not 64 hexadecimal digits."""
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            text = f.read(4 * TOKEN_BYTES).strip()
    except OSError as e:
        raise UserError(f"dist.token_file {path} cannot be read ({e.strerror}); {CREATE}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"dist.token_file {path} is open to others (mode {stat.S_IMODE(mode):04o}); "
                        f"run: chmod 600 {path}")
    try:
        token = bytes.fromhex(text)
    except ValueError:
        token = b""
    if len(token) != TOKEN_BYTES:
        raise UserError(f"dist.token_file {path} does not hold {2 * TOKEN_BYTES} hexadecimal digits; {CREATE}")
    return token


def new_token() -> str:
    """A new token, as a token file holds it: 32 random bytes in hexadecimal."""
    return secrets.token_hex(TOKEN_BYTES)


def nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def proof(token: bytes, label: str, job: str, node_rank: int, first: str, second: str) -> str:
    """HMAC-SHA256 over the direction `label` ("server" or "client"), the job, the node and
    both nonces, the receiver's own nonce first: hex."""
    message = b"\0".join([DOMAIN, label.encode(), job.encode(), str(node_rank).encode(),
                          first.encode(), second.encode()])
    return hmac.new(token, message, hashlib.sha256).hexdigest()


def matches(expected: str, received) -> bool:
    """Whether `received` is the proof `expected`, compared in constant time."""
    return (isinstance(received, str) and len(received) == PROOF_HEX
            and hmac.compare_digest(expected.encode(), received.encode()))


def good_nonce(value) -> bool:
    return isinstance(value, str) and len(value) == 2 * NONCE_BYTES and \
        all(c in "0123456789abcdef" for c in value)
