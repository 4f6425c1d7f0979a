"""A finished run's scalars, as VisualDL's web server serves them, and tools/visualdl_shot.py.

A real single-process run (2 epochs of 10 steps, a progress line every 5 steps) writes
`<run>/vdl`; `visualdl` serves it on 127.0.0.1, and its own HTTP API (what its web page
reads: /app/api/runs, /app/api/scalar/tags, /app/api/scalar/list) must list the run, every
tag of EXPECTED_TAGS, and train/loss as the run logged it. Then the screenshot tool renders
the scalar page of the same run in headless Chromium (skipped without Chromium).
"""

import json
import os
import re
import struct
import threading
import urllib.parse
import zlib
from collections import Counter

import pytest

from paddle_dist.runs.layout import Run

from ..oracles import module_from, read_metrics
from .procs import ROOT, check, run

EXPECTED_TAGS = ["train/loss", "train/lr", "train/samples_per_s", "eval/loss", "eval/accuracy"]
EPOCHS, STEPS_PER_EPOCH, LOG_EVERY = 2, 10, 5           # 640 samples, batch 64
TRAIN = ["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", f"train.epochs={EPOCHS}",
         "-o", f"train.log_every={LOG_EVERY}", "-o", f"data.num_samples={64 * STEPS_PER_EPOCH}",
         "-o", "checkpoint.every_epochs=0"]
LIFETIME_S = 120            # VisualDL is killed after this long, whatever the tests do


def _load_tool():
    """tools/visualdl_shot.py as a module (tools/ is a folder of scripts, not a package)."""
    return module_from(ROOT / "tools" / "visualdl_shot.py")


shot = _load_tool()


def _chromium_missing() -> bool:
    try:
        shot.find_chromium()
    except shot.UsageError:
        return True
    return False


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("visualdl") / "run"
    check(run(TRAIN + ["-o", f"output.run_dir={run_dir}"], timeout=180))
    return run_dir


@pytest.fixture(scope="module")
def visualdl(finished_run):
    """`visualdl --logdir <run>/vdl` on a free 127.0.0.1 port, answering HTTP; stopped with
    its whole process group after the module's tests (or after LIFETIME_S, whatever happens)."""
    with shot.serve(finished_run / "vdl") as server:
        killer = threading.Timer(LIFETIME_S, shot.stop, (server.proc,))
        killer.start()
        try:
            yield server
        finally:
            killer.cancel()
    assert server.proc.returncode is not None and not _group_alive(server.proc.pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _api(server, method: str, **query):
    """The `data` of VisualDL's answer to /app/api/<method>?<query>."""
    url = f"{server.url}/app/api/{method}?{urllib.parse.urlencode(query)}"
    with shot.OPENER.open(url, timeout=30) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == 0, f"{url}: {answer['msg']}"
    return answer["data"]


def _f32(values):
    return [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]


def _progress_losses(log_path):
    """(global step, loss) of every progress line the run logged (loss printed to 4 places)."""
    found = re.findall(r"epoch (\d+)/\d+ step (\d+)/(\d+) loss ([\d.]+)", log_path.read_text())
    return [((int(e) - 1) * int(n) + int(s), float(loss)) for e, s, n, loss in found]


def _written(vdl_dir, tag):
    """(step, value) of `tag` as the run's VisualDL record file holds it."""
    from visualdl import LogReader

    (records,) = vdl_dir.glob("vdlrecords.*")
    return [(r.id, r.value) for r in LogReader(file_path=str(records)).get_data("scalar", tag)]


def test_visualdl_serves_the_finished_runs_scalars(finished_run, visualdl):
    run_name = str(finished_run / "vdl")            # VisualDL names a run by its log directory
    assert _api(visualdl, "runs") == [run_name]
    tags = _api(visualdl, "scalar/tags")
    assert tags["runs"] == [run_name]
    missing = set(EXPECTED_TAGS) - set(tags["tags"][0])
    assert not missing, f"not served: {sorted(missing)}; served: {tags['tags'][0]}"

    served = _api(visualdl, "scalar/list", run=run_name, tag="train/loss")  # [[ms, step, value]]
    logged = _progress_losses(Run(finished_run).rank_log(0))
    steps = list(range(LOG_EVERY, EPOCHS * STEPS_PER_EPOCH + 1, LOG_EVERY))     # 5, 10, 15, 20
    assert [step for _, step, _ in served] == [step for step, _ in logged] == steps
    assert [v for _, _, v in served] == pytest.approx([v for _, v in logged], abs=5.1e-5)
    written = _written(finished_run / "vdl", "train/loss")
    assert [s for _, s, _ in served] == [s for s, _ in written]
    assert [v for _, _, v in served] == pytest.approx(_f32([v for _, v in written]), rel=1.2e-7)

    history = read_metrics(finished_run)["history"]
    eval_loss = _api(visualdl, "scalar/list", run=run_name, tag="eval/loss")
    assert [step for _, step, _ in eval_loss] == [h["epoch"] for h in history] == [1, 2]
    assert [v for _, _, v in eval_loss] == pytest.approx(_f32([h["eval_loss"] for h in history]),
                                                         rel=1.2e-7)


# ------------------------------------------------------------------ tools/visualdl_shot.py
@pytest.mark.skipif(_chromium_missing(), reason="chromium not installed: apt-get install chromium")
def test_screenshot_tool_renders_the_scalar_page(finished_run, visualdl, tmp_path):
    png, dom = tmp_path / "shot.png", tmp_path / "dom.html"
    check(run(["tools/visualdl_shot.py", str(finished_run), str(png), "--width", "800",
               "--height", "600", "--dump-dom", str(dom)], timeout=240))

    width, height, pixels = _png_pixels(png.read_bytes())
    assert (width, height) == (800, 600)
    colours = Counter(pixels)
    assert len(colours) >= 64, f"{len(colours)} colours: a blank page"
    assert colours.most_common(1)[0][1] < 0.9 * width * height, "one colour covers the page"

    # Chart titles are drawn on the canvases; the DOM shows one group per tag prefix with its
    # number of charts, every group open (one chart per tag), and the run's name.
    served = _api(visualdl, "scalar/tags")["tags"][0]
    page = dom.read_text()
    groups = dict(re.findall(r'<h3>([^<]+)</h3><span class="total">(\d+)</span>', page))
    assert groups == {prefix: str(n) for prefix, n in Counter(t.split("/")[0] for t in served).items()}
    assert page.count('_echarts_instance_="') == len(served)
    assert str(finished_run / "vdl") in page


def _one_line_error(args, *words):
    result = run(["tools/visualdl_shot.py"] + args, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_screenshot_tool_refuses_bad_input_with_one_line(finished_run, tmp_path):
    _one_line_error([str(tmp_path), str(tmp_path / "x.png")], "no VisualDL logs", str(tmp_path))
    _one_line_error([str(finished_run), str(tmp_path / "x.png"), "--chromium", str(tmp_path / "nope")],
                    "not found", "apt-get install chromium")
    _one_line_error([str(finished_run), str(tmp_path / "x.png"), "--width", "0"], "--width")
    assert not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------ PNG, with zlib alone
def _png_pixels(data: bytes):
    """(width, height, every pixel as bytes) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
    bpp = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    prev, pixels = bytearray(stride), []
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(raw[start], line, prev, bpp)
        pixels.extend(bytes(line[x:x + bpp]) for x in range(0, stride, bpp))
        prev = line
    return width, height, pixels


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo PNG filter `kind` on `line` in place (`prev`: the previous line, unfiltered)."""
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((x + b) & 255 for x, b in zip(line, prev))
        return
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            predicted = a
        elif kind == 3:
            predicted = (a + b) >> 1
        else:                                       # 4, Paeth
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            predicted = a if pa <= pb and pa <= pc else b if pb <= pc else c
        line[i] = (line[i] + predicted) & 255
