"""Screenshot of VisualDL's scalar page for a run, rendered by headless Chromium (for the docs).

Usage:
    python tools/visualdl_shot.py RUN_DIR OUT.png [--width 1400 --height 900] [--chromium PATH]
                                  [--dump-dom DOM.html]

RUN_DIR is a run directory (its `vdl/` is shown) or any directory holding VisualDL logs,
e.g. `runs` to compare every run in it. The tool starts VisualDL on 127.0.0.1 on a free
port, loads its scalar page in `chromium --headless` with every tag group open, writes the
screenshot once every chart is drawn, and stops VisualDL. `--dump-dom` also saves the
rendered page's DOM (`chromium --dump-dom`), which is how the tests check the page.

Chromium reaches VisualDL through a small same-origin proxy that adds PAGE_SCRIPT to the
page, because VisualDL opens only the first tag group (`eval`) and takes no URL argument
to open more, and because headless Chromium takes its picture at the page's load event,
before the charts exist. The script opens every group and holds the load event (through
an image the proxy answers late) until each group's charts are on the page and drawn.
(`--virtual-time-budget`, Chromium's own way to wait, hung about one load in seven here.)

Runs are labelled by their log directory as given, so run the tool from where labels read
well (`runs/<run>/vdl` from the repository root).
Exit codes: 0 written; 1 VisualDL or Chromium failed; 2 bad arguments or no Chromium.
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from paddle_dist.launch.launcher import free_port  # noqa: E402  (paddle-free)

PROG = "visualdl_shot"
HOST = "127.0.0.1"
SCALAR_PAGE = "/app/scalar"
CHROMIUM_NAMES = ("chromium", "chromium-browser")
INSTALL_HINT = "install it with `apt-get install chromium` (as root) or pass --chromium PATH"

READY, DRAWN = "/__visualdl_shot/ready", "/__visualdl_shot/drawn"
SETTLE_MS = 1000            # charts whose pixels stayed the same this long are drawn

# A closed group's header (an <h3> title, then a span.total with its number of charts) has
# no sibling: its charts are not on the page at all, and only a click opens it. A chart is
# drawn once its canvas stops changing (ECharts animates; VisualDL fits the axes to the data
# in a worker, later). The image holds the load event until the proxy hears DRAWN.
PAGE_SCRIPT = f"""<img src="{READY}" alt="" style="display:none"><script>
(function () {{
  var pixels = "", since = 0;
  var timer = setInterval(function () {{
    var totals = document.querySelectorAll("h3 + .total"), expected = 0;
    totals.forEach(function (total) {{
      expected += Number(total.textContent);
      if (!total.parentElement.nextElementSibling) total.parentElement.click();
    }});
    var charts = document.querySelectorAll("[_echarts_instance_]");
    var now = Array.prototype.map.call(document.querySelectorAll("[_echarts_instance_] canvas"),
                                       function (canvas) {{ return canvas.toDataURL(); }}).join();
    if (now !== pixels) {{ pixels = now; since = Date.now(); }}
    if (totals.length && charts.length === expected && Date.now() - since > {SETTLE_MS}) {{
      clearInterval(timer);
      fetch("{DRAWN}");
    }}
  }}, 200);
}})();
</script>""".encode()

# In a process group of its own (so it goes with its helpers in one kill) but in this
# session, so whoever started this tool still sees anything left behind. Popen's
# process_group is Python 3.11+; setpgrp before exec does the same on older versions.
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}

# Set by the proxy itself for the body it sends, or only about one connection.
HOP_HEADERS = ("connection", "content-length", "date", "server", "transfer-encoding")


class UsageError(Exception):
    """Bad arguments or a missing Chromium: one line, exit 2."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None             # hand 3xx to the browser as they are


# 127.0.0.1 only, never through an http_proxy from the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


def vdl_logdir(run_dir: Path) -> Path:
    """The VisualDL log directory of `run_dir`: its `vdl/` when it has one, else itself.

    Example:
        vdl_logdir(Path("runs/mnist_lenet-20250101-120000"))  # runs/mnist_lenet-.../vdl
    """
    logdir = run_dir / "vdl" if (run_dir / "vdl").is_dir() else run_dir
    if not logdir.is_dir() or not any(logdir.rglob("vdlrecords.*")):
        raise UsageError(f"no VisualDL logs (vdlrecords.*) under {run_dir}: pass a run directory "
                         "(runs/<run>, whose rank 0 wrote vdl/) or a directory of runs")
    return logdir


def visualdl_argv(logdir: Path, port: int) -> List[str]:
    """The command users type (`visualdl`, installed beside this Python), else the module it
    runs. Telemetry off: nothing leaves this machine.

    Example:
        visualdl_argv(Path("runs/x/vdl"), 8040)  # [.../visualdl, --logdir, runs/x/vdl, ...]
    """
    exe = Path(sys.executable).with_name("visualdl")
    command = [str(exe)] if exe.is_file() else [sys.executable, "-m", "visualdl.server.app"]
    return command + ["--logdir", str(logdir), "--host", HOST, "--port", str(port),
                      "--disable-telemetry"]


class Server(NamedTuple):
    url: str                    # http://127.0.0.1:PORT
    proc: subprocess.Popen


@contextmanager
def serve(logdir: Path, timeout_s: float = 60.0) -> Iterator[Server]:
    """Run VisualDL over `logdir` until the block ends; yields once it answers HTTP.

    Example:
        with serve(Path("runs/x/vdl")) as vdl:
            urllib.request.urlopen(vdl.url + "/app/api/runs")
    """
    port = free_port(HOST)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(visualdl_argv(logdir, port), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, **OWN_GROUP)
        try:
            url = f"http://{HOST}:{port}"
            _wait_until_live(proc, url, time.monotonic() + timeout_s, log)
            yield Server(url, proc)
        finally:
            stop(proc)


def _wait_until_live(proc: subprocess.Popen, url: str, deadline: float, log) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"VisualDL exited with {proc.returncode} before serving: {_tail(log)}")
        try:
            with OPENER.open(url + "/alive", timeout=2):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"VisualDL did not answer on {url} in time: {_tail(log)}")
        time.sleep(0.1)


def _tail(log) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return " | ".join(lines[-5:]) or "(no output)"


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group, SIGKILL to whatever is left after `grace_s`."""
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)   # helpers that outlived their leader go too
    proc.wait()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ the page, drawn
class PageProxy:
    """VisualDL (at `target`) on another 127.0.0.1 port with PAGE_SCRIPT added to its pages:
    same origin for the page and its API calls, so nothing else changes. Holds each page's
    load event until the page reports its charts drawn, or `hold_s` passed.

    Example:
        with PageProxy(vdl.url) as proxy:
            run_chromium(chromium_argv(..., proxy.url + SCALAR_PAGE, ...), 120)
            assert proxy.undrawn == 0
    """

    def __init__(self, target: str, hold_s: float = 60.0):
        self.target, self.hold_s = target, hold_s
        self.drawn = threading.Event()
        self.undrawn = 0        # pages let go after hold_s without their charts
        self.server = http.server.ThreadingHTTPServer((HOST, 0), self._handler())
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "PageProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.drawn.set()        # a page still held lets go
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def _hold(self) -> None:
        if not self.drawn.wait(self.hold_s):
            self.undrawn += 1
        self.drawn.clear()      # the next page waits for its own charts

    def _pass_on(self, path: str, sent: dict):
        status, headers, body = _fetch(urllib.request.Request(self.target + path, headers=sent))
        if headers.get_content_type() == "text/html" and "Content-Encoding" not in headers:
            body = body.replace(b"</body>", PAGE_SCRIPT + b"</body>", 1)
        return status, [(k, v) for k, v in headers.items() if k.lower() not in HOP_HEADERS], body

    def _handler(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                # The browser's headers (VisualDL picks its language from them), minus those
                # that would let the answer come compressed or be about this hop.
                sent = {k: v for k, v in self.headers.items()
                        if k.lower() not in ("host", "connection", "accept-encoding")}
                if self.path == READY:
                    proxy._hold()
                    return self._send(204, [], b"")
                if self.path == DRAWN:
                    proxy.drawn.set()
                    return self._send(204, [], b"")
                try:
                    answer = proxy._pass_on(self.path, sent)
                except OSError as err:
                    return self.send_error(502, f"VisualDL at {proxy.target}: {err}")
                self._send(*answer)

            def _send(self, status: int, headers, body: bytes) -> None:
                try:
                    self.send_response(status)
                    for name, value in headers:
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except ConnectionError:
                    pass            # the browser stopped waiting (it had what it needed)

            def log_message(self, *args):
                pass

        return Handler


def _fetch(request: urllib.request.Request):
    """(status, headers, body) of `request`, error statuses included."""
    try:
        with OPENER.open(request, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


# ------------------------------------------------------------------ chromium
def find_chromium(explicit: Optional[str] = None) -> str:
    """Path of the Chromium to use: `explicit` if given, else the first on PATH."""
    found = shutil.which(explicit) if explicit else next(
        filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    if not found:
        what = f"--chromium {explicit}" if explicit else "chromium"
        raise UsageError(f"{what} not found: {INSTALL_HINT}")
    return found


def chromium_argv(chromium: str, url: str, out: Path, width: int, height: int, profile: Path,
                  dump_dom: bool = False) -> List[str]:
    """Headless Chromium loading `url` and, at its load event, writing a screenshot to `out`
    (and printing the DOM when `dump_dom`), with its own profile in `profile`.

    Example:
        chromium_argv("chromium", "http://127.0.0.1:8041/app/scalar", Path("shot.png"),
                      1400, 900, Path("/tmp/profile"))
    """
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-proxy-server", "--no-first-run", "--lang=en-US", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", f"--screenshot={out}"] + \
        (["--dump-dom"] if dump_dom else []) + [url]


def run_chromium(argv: List[str], timeout_s: float) -> str:
    """Run Chromium to the end (killed with its helpers after `timeout_s`); its stdout."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **OWN_GROUP)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"Chromium did not finish in {timeout_s:.0f} s: "
                           f"{' '.join(argv)}") from None
    finally:
        _killpg(proc.pid, signal.SIGKILL)   # its zygote and renderers, if any outlived it
        proc.communicate()
    if proc.returncode != 0:
        tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])
        raise RuntimeError(f"Chromium exited with {proc.returncode}: {tail}")
    return out.decode(errors="replace")


def render(run_dir: Path, out: Path, width: int = 1400, height: int = 900,
           chromium: Optional[str] = None, dump_dom: Optional[Path] = None,
           timeout_s: float = 120.0) -> None:
    """Screenshot VisualDL's scalar page for `run_dir` into `out` (and its DOM into `dump_dom`).

    Example:
        render(Path("runs/synthetic_lenet-20250101-120000"), Path("docs/img/visualdl.png"))
    """
    logdir, browser = vdl_logdir(run_dir), find_chromium(chromium)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with serve(logdir) as vdl, PageProxy(vdl.url, hold_s=timeout_s / 2) as proxy, \
            tempfile.TemporaryDirectory(prefix="visualdl_shot-") as profile:
        page = run_chromium(chromium_argv(browser, proxy.url + SCALAR_PAGE, out.resolve(), width,
                                          height, Path(profile), dump_dom is not None), timeout_s)
        if proxy.undrawn:
            raise RuntimeError(f"VisualDL's page did not draw its charts in {proxy.hold_s:.0f} s")
    if dump_dom is not None:
        dump_dom.write_text(page)
    if not out.is_file() or out.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise RuntimeError(f"Chromium wrote no PNG to {out}")


# ------------------------------------------------------------------ command line
def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.exit(code)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        _fail(f"{message} (see --help)", 2)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def main(argv: Optional[List[str]] = None) -> int:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="run directory (or a directory of runs)")
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("--width", type=_positive, default=1400)
    parser.add_argument("--height", type=_positive, default=900)
    parser.add_argument("--chromium", help="Chromium executable (default: chromium on PATH)")
    parser.add_argument("--dump-dom", type=Path, help="also save the rendered page's DOM here")
    args = parser.parse_args(argv)
    # SIGTERM ends this tool through its `finally`s, so VisualDL and Chromium end with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        render(args.run_dir, args.out, args.width, args.height, args.chromium, args.dump_dom)
    except UsageError as err:
        _fail(str(err), 2)
    except RuntimeError as err:
        _fail(str(err), 1)
    print(f"wrote {args.out} ({args.width}x{args.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
