"""Run train.py in this process, counting how often it reads each of the given files: a
Python open() of it (an audit hook), or OpenSSL loading it as a certificate, key or CA
(ssl.SSLContext's loaders, counted). At exit, one line per file on stderr:
`read <count> <path>`.

    python counting_reads.py FILE[,FILE...] train.py -o ...
"""

import atexit
import os
import runpy
import ssl
import sys
from collections import Counter

watched = {os.path.abspath(p) for p in sys.argv[1].split(",")}
reads = Counter()


def _count(path) -> None:
    if isinstance(path, (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(path))
        if path in watched:
            reads[path] += 1


def _audit(event, args):
    if event == "open" and args:
        _count(args[0])


_chain, _verify = ssl.SSLContext.load_cert_chain, ssl.SSLContext.load_verify_locations


def load_cert_chain(self, certfile, keyfile=None, password=None):
    _count(certfile)
    _count(keyfile)
    return _chain(self, certfile, keyfile, password)


def load_verify_locations(self, cafile=None, capath=None, cadata=None):
    _count(cafile)
    return _verify(self, cafile, capath, cadata)


ssl.SSLContext.load_cert_chain, ssl.SSLContext.load_verify_locations = load_cert_chain, load_verify_locations
sys.addaudithook(_audit)
atexit.register(lambda: sys.stderr.write("".join(f"read {reads[p]} {p}\n" for p in sorted(watched))))
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
