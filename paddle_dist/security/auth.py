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
    """The token in `path`; a one-line UserError when it cannot be one: missing, not the
    user's own (read_own), or not 64 hexadecimal digits."""
    text = read_own(path, "dist.token_file", CREATE, limit=4 * TOKEN_BYTES).decode("ascii", "replace").strip()
    try:
        token = bytes.fromhex(text)
    except ValueError:
        token = b""
    if len(token) != TOKEN_BYTES:
        raise UserError(f"dist.token_file {path} does not hold {2 * TOKEN_BYTES} hexadecimal digits; {CREATE}")
    return token


# ------------------------------------------------------------------ the user's own files
def read_own(path: str, what: str, fix: str, private: bool = True, limit: int = 1 << 20) -> bytes:
    """What credential file `path` holds (at most `limit` bytes), once it is the user's, as
    OpenSSH's StrictModes asks of a key (check_own); a one-line UserError naming `what`
    ("dist.token_file") and how to fix it otherwise. Checked on the descriptor it reads.

    Example:
        read_own("/home/me/.paddle_dist.token", "dist.token_file", CREATE, limit=128)
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))   # a FIFO never blocks
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}") from None
    try:
        _refuse_unless_own(os.fstat(fd), path, what, private)
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_own(path: str, what: str, fix: str, private: bool = True) -> None:
    """A one-line UserError unless credential file `path` is the user's: owned by the user
    (or root); readable and writable by no one else (`private`: a token, a key) or at
    least writable by no one else (a certificate); and in directories, up to /, that no
    other user owns or can write, but sticky ones such as /tmp, where others add entries of
    their own and cannot replace ours. A file another user made first, or can swap for one
    of theirs, would let them choose the job's secret, or read it.

    Example:
        check_own("/tmp/theirs.token", "dist.token_file", CREATE)
        # UserError: dist.token_file /tmp/theirs.token belongs to user nobody (uid 65534) ...
    """
    try:
        found = os.stat(path)
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}); {fix}") from None
    _refuse_unless_own(found, path, what, private)


def _refuse_unless_own(found: os.stat_result, path: str, what: str, private: bool) -> None:
    mode = stat.S_IMODE(found.st_mode)
    if not stat.S_ISREG(found.st_mode):
        raise UserError(f"{what} {path} is not a regular file; give the path of a file of your own")
    if found.st_uid not in (os.geteuid(), 0):
        raise UserError(f"{what} {path} belongs to {_user(found.st_uid)}, not to you: another user "
                        "made it or can change it; remove it and make your own")
    if private and mode & 0o077:
        raise UserError(f"{what} {path} is open to others (mode {mode:04o}); run: chmod 600 {path}")
    if mode & 0o022:
        raise UserError(f"{what} {path} can be changed by others (mode {mode:04o}); run: chmod go-w {path}")
    folder = os.path.dirname(os.path.realpath(path))
    while True:
        there = os.stat(folder)
        if there.st_uid not in (os.geteuid(), 0):
            why = f"belongs to {_user(there.st_uid)}"
        elif there.st_mode & 0o022 and not there.st_mode & stat.S_ISVTX:
            why = f"other users can write into (mode {stat.S_IMODE(there.st_mode):04o})"
        else:
            why = ""
        if why:
            raise UserError(f"{what} {path} is in {folder}, which {why}, so they could replace it; "
                            "keep it in a directory only you can write")
        if folder == os.path.dirname(folder):
            return
        folder = os.path.dirname(folder)


def _user(uid: int) -> str:
    try:
        import pwd
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


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
