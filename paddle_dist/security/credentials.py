"""The job's credentials, each read once per process: dist.token_file's token, and the TLS
contexts made from dist.tls_ca, tls_cert and tls_key. The launcher's pre-flight, its
meeting with the other machines (node 0's and theirs) and its rank gate all ask here, so
a launcher opens each file once; a file is read again only when it changed on disk (its
inode, size or modification time), as a test that rewrites one expects.

Example:
    token(cfg.dist.token_file)              # 32 bytes, or a one-line UserError
    server, client = contexts(tls.Files("ca.pem", "node0.pem", "node0.key"))
"""

from __future__ import annotations

import os
import ssl
import threading
from typing import Dict, Tuple

from . import auth, tls

_LOCK = threading.Lock()
_TOKENS: Dict[tuple, bytes] = {}
_CONTEXTS: Dict[tuple, Tuple[ssl.SSLContext, ssl.SSLContext]] = {}


def _stamp(*paths: str) -> tuple:
    """Who each file is now; a missing one stamps as itself (its read then says why)."""
    found = []
    for path in paths:
        try:
            st = os.stat(path)
            found.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            found.append((path, None))
    return tuple(found)


def token(path: str) -> bytes:
    """auth.read_token(path), read once while the file stays the same."""
    key = _stamp(path)
    with _LOCK:
        if key not in _TOKENS:
            _TOKENS[key] = auth.read_token(path)
        return _TOKENS[key]


def contexts(files: tls.Files) -> Tuple[ssl.SSLContext, ssl.SSLContext]:
    """(node 0's server context, the other machines' client context) of `files`, made from
    one read of each file (tls.Contents) while it stays the same."""
    key = _stamp(files.ca, files.cert, files.key)
    with _LOCK:
        if key not in _CONTEXTS:
            contents = tls.Contents.read(files)            # each file opened once
            _CONTEXTS[key] = (tls.server_context(files, contents), tls.client_context(files, contents))
        return _CONTEXTS[key]


def check_tls(files: tls.Files, master: str, serves: bool) -> None:
    """tls.check on the contexts the job will use (no second load of its files)."""
    server, client = contexts(files)
    with _LOCK:
        tls.check_contexts(server, client, files, master, serves)
