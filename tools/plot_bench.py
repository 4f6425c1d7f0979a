"""Charts for docs/benchmarks.md from the JSON that `make bench` writes.

Usage:
    python tools/plot_bench.py bench-results docs/img

Reads train_<model>.json (tools/bench_train.py --json), allreduce_<transport>.json
(tools/allreduce_perf.py --json) and, when present, scale_<model>_<N>.json (bench_train
at N ranks with the no_sync variant); writes throughput_vs_ranks.png, busbw_vs_size.png
and scaling_vs_ranks.png. matplotlib comes with visualdl.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def throughput_chart(results: Path, out: Path) -> None:
    files = sorted(results.glob("train_*.json"))
    fig, axes = plt.subplots(1, len(files), figsize=(5.5 * len(files), 4.2), squeeze=False)
    for ax, path in zip(axes[0], files):
        data = json.loads(path.read_text())
        n = data["nprocs"]
        for name, v in data["variants"].items():
            ax.plot([1, n], [v["samples_per_s_1rank"], v["samples_per_s"]], marker="o",
                    label=f"{name} ({v['efficiency']:.2f})")
        base = data["variants"].get("paddle_dist", next(iter(data["variants"].values())))
        ax.plot([1, n], [base["samples_per_s_1rank"], n * base["samples_per_s_1rank"]], "k:",
                label="linear scaling")
        ax.set_title(f"{data['model']}: batch {data['batch_per_rank']}/rank, 1 thread/rank")
        ax.set_xlabel("ranks (processes)")
        ax.set_ylabel("samples/s (median)")
        ax.set_xticks([1, n])
        ax.legend(fontsize=8, title="variant (efficiency)", title_fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput_vs_ranks.png", dpi=110)


def scaling_chart(results: Path, out: Path) -> bool:
    """samples/s against ranks (1 and every N measured) for each variant, next to the
    no_sync bound: one panel per model. False when there is nothing to draw."""
    models: dict = {}
    for path in sorted(results.glob("scale_*_*.json")):
        data = json.loads(path.read_text())
        models.setdefault(data["model"], []).append(data)
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, (model, runs) in zip(axes[0], sorted(models.items())):
        runs.sort(key=lambda d: d["nprocs"])
        ranks = [1] + [d["nprocs"] for d in runs]
        for name in [n for n in runs[0]["variants"] if all(n in d["variants"] for d in runs)]:
            one = statistics.median(v["variants"][name]["samples_per_s_1rank"] for v in runs)
            ys = [one] + [d["variants"][name]["samples_per_s"] for d in runs]
            style = {"color": "k", "linestyle": ":"} if name == "no_sync" else {}
            ax.plot(ranks, ys, marker="o", label=name, **style)
        cpus = runs[0].get("machine", {}).get("cpus", "?")
        ax.set_title(f"{model} on {cpus} CPUs: batch {runs[0]['batch_per_rank']}/rank, 1 thread/rank")
        ax.set_xlabel("ranks (processes)")
        ax.set_ylabel("samples/s (median)")
        ax.set_xticks(ranks)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "scaling_vs_ranks.png", dpi=110)
    return True


def busbw_chart(results: Path, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for path in sorted(results.glob("allreduce_*.json")):
        data = json.loads(path.read_text())
        sizes = [r["size"] for r in data["rows"]]
        label = f"{data['transport']} ({data['backend']})" if data["transport"] == "backend" \
            else data["transport"]
        ax.plot(sizes, [r["in_place"]["busbw"] for r in data["rows"]], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s), in place")
    ax.set_title("all-reduce, 2 ranks on one machine (float32)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "busbw_vs_size.png", dpi=110)


def main(argv) -> int:
    if len(argv) != 2:
        print("usage: python tools/plot_bench.py RESULTS_DIR OUT_DIR", file=sys.stderr)
        return 2
    results, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    throughput_chart(results, out)
    busbw_chart(results, out)
    scaled = scaling_chart(results, out)
    print(f"wrote {out / 'throughput_vs_ranks.png'}, {out / 'busbw_vs_size.png'}"
          + (f" and {out / 'scaling_vs_ranks.png'}" if scaled else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
