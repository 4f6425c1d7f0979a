"""The benchmark tools run end to end and report what they claim (tiny sizes: correctness,
not speed)."""

import json

import pytest

from tools import netns

from .procs import check, run

TINY = ["--steps", "4", "--warmup", "2", "--reps", "1", "--batch", "16"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One bench_train run of every kind of variant: ours, the reference, a custom one and
    no_sync (the bound), at 1 and 2 ranks: (its JSON, its table's lines). The charts'
    test plots it too."""
    out = tmp_path_factory.mktemp("bench") / "train.json"
    result = check(run(["tools/bench_train.py", "--model", "lenet", "--nprocs", "2", *TINY,
                        "--variants", "paddle_dist,paddle_dataparallel,no_sync",
                        "--variant", "gloo=sync.transport=backend", "--json", str(out)], timeout=300))
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    return json.loads(out.read_text()), table


def test_bench_train_compares_variants_and_writes_json(compared):
    found, table = compared
    assert (found["model"], found["nprocs"], found["steps"]) == ("lenet", 2, 4)
    assert set(found["variants"]) == {"paddle_dist", "paddle_dataparallel", "gloo", "no_sync"}
    for name, v in found["variants"].items():
        assert v["samples_per_s"] > 0 and v["samples_per_s_1rank"] > 0, name
        one, two = v["runs"]["1"][0], v["runs"]["2"][0]        # one rep: its own ratio
        assert abs(v["efficiency"] - two / (2 * one)) < 1e-9
        assert len(v["runs"]["1"]) == len(v["runs"]["2"]) == 1
    assert found["variants"]["paddle_dataparallel"]["vs_reference"] == 1.0
    assert table[0].startswith("| variant |") and "vs paddle_dist" in table[0] and len(table) == 1 + 4


def test_bench_train_parallel_only_skips_the_single_rank_runs(tmp_path):
    out = tmp_path / "overhead.json"
    result = check(run(["tools/bench_train.py", "--model", "lenet", "--nprocs", "2", *TINY,
                        "--reps", "2", "--parallel-only", "--variants",
                        "paddle_dist_dpsync,paddle_dataparallel", "--json", str(out)], timeout=300))
    found = json.loads(out.read_text())["variants"]
    for v in found.values():
        assert v["runs"]["1"] == [] and len(v["runs"]["2"]) == 2 and v["efficiency"] is None
    mine, ref = found["paddle_dist_dpsync"]["runs"]["2"], found["paddle_dataparallel"]["runs"]["2"]
    ratios = [a / b for a, b in zip(mine, ref)]                 # per rep; median of two = mean
    assert abs(found["paddle_dist_dpsync"]["vs_reference"] - sum(ratios) / 2) < 1e-9
    assert "| paddle_dist_dpsync | - |" in result.stdout


def _refuses(tool, args):
    """A tool's bad input as a real process: one line, exit 2. The other bad inputs run in one
    process: tests/unit/test_bench_tools.py."""
    result = run([f"tools/{tool}.py", *args], timeout=60)
    assert result.returncode == 2, (args, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and f"{tool}: error" in result.stderr


def test_bench_train_refuses_bad_input_with_one_line():
    _refuses("bench_train", ["--model", "resnet"])


def test_bench_startup_and_the_charts(compared, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    check(run(["tools/bench_startup.py", "--runs", "1", "--ways", "paddle_dist",
               "--json", str(results / "startup.json")], timeout=300))
    startup = json.loads((results / "startup.json").read_text())
    assert 0 < startup["median_s"]["paddle_dist"] < 120
    (results / "train_lenet.json").write_text(json.dumps(compared[0]))     # bench_train's output
    check(run(["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"),
               "tools/allreduce_perf.py", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1",
               "--json", str(results / "allreduce_backend.json")], timeout=120))
    # The ranks chart reads bench_train's output at each N (here N = 2 only).
    (results / "scale_lenet_2.json").write_text((results / "train_lenet.json").read_text())
    check(run(["tools/plot_bench.py", str(results), str(tmp_path / "img")], timeout=120))
    for name in ("throughput_vs_ranks.png", "busbw_vs_size.png", "scaling_vs_ranks.png"):
        png = (tmp_path / "img" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name


def _bench_overhead():
    import sys

    from .procs import ROOT

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bench_overhead
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return bench_overhead


def test_bench_overhead_times_paddle_dist_and_the_raw_recipe_step_by_step(tmp_path):
    out = tmp_path / "overhead.json"
    result = check(run(["tools/bench_overhead.py", "--model", "mlp", "--steps", "60", "--warmup", "2",
                        "--chunk", "10", "--batch", "16", "--launches", "1", "--variants",
                        "paddle_dist_dpsync,paddle_dist_hapi", "--json", str(out)], timeout=300))
    found = json.loads(out.read_text())["variants"]
    assert set(found) == {"paddle_dist_dpsync", "paddle_dist_hapi"}
    for name, v in found.items():
        assert v["chunks"] == 6, name                   # 60 timed step pairs in chunks of 10
        low, high = v["ratio_interval_95"]              # 6 chunks: the interval is min..max
        assert 0 < low <= v["ratio_median"] <= high, name
        assert v["step_ms"] > 0 and v["raw_step_ms"] > 0
        assert len(v["per_job"]) == 1 and len(v["per_job_other_ranks"][0]) == 1   # rank 1's view
    assert "paddle_dist_hapi against paddle_dist_dpsync:" in result.stdout
    assert "| paddle_dist_dpsync |" in result.stdout


def test_bench_overhead_gate_fails_below_min_ratio_and_refuses_bad_input():
    result = run(["tools/bench_overhead.py", "--model", "mlp", "--steps", "12", "--warmup", "2",
                  "--chunk", "2", "--batch", "16", "--launches", "1", "--nprocs", "1",
                  "--min-ratio", "50"], timeout=300)
    assert result.returncode == 1 and "FAILED" in result.stderr and "above 50" in result.stderr
    _refuses("bench_overhead", ["--variants", "nope"])


def test_the_median_interval_is_the_binomial_one_and_covers_the_median():
    import random

    tool = _bench_overhead()
    values = list(range(20))
    random.Random(1).shuffle(values)
    assert tool.median_interval(values) == (5, 14)           # ranks 6 and 15 of 20 (tables)
    assert tool.median_interval([3, 1, 2, 6, 5, 4]) == (1, 6)
    assert tool.median_interval([1, 2, 3, 4, 5]) is None      # too few for 95 %
    rng = random.Random(7)
    true_median = 1.0                                          # of the lognormal below
    hits = 0
    for _ in range(2000):
        low, high = tool.median_interval([rng.lognormvariate(0, 1) for _ in range(30)])
        hits += low <= true_median <= high
    assert 0.95 <= hits / 2000 <= 0.99
    assert tool.chunk_ratios([1, 1, 2, 2, 9], [1, 2, 1, 1, 9], 2) == [2 / 3, 2.0]


def test_bench_train_no_sync_runs_separate_processes_as_the_bound(compared):
    found, table = compared
    found = found["variants"]
    # Two processes, neither in a process group: each saw a world of one.
    assert found["no_sync"]["process_worlds"] == [1, 1]
    assert found["paddle_dist"]["process_worlds"] == [2]
    for name, v in found.items():
        assert abs(v["vs_no_sync"] - v["runs"]["2"][0] / found["no_sync"]["runs"]["2"][0]) < 1e-9
        assert v["efficiency"] > 0, name
    assert found["no_sync"]["vs_no_sync"] == 1.0
    assert table[0].endswith("| vs no_sync |")
    assert all(row.count("|") == table[0].count("|") for row in table)


def test_bench_link_trains_across_two_shaped_hosts_and_cleans_up(tmp_path):
    reason = netns.unavailable_reason(shaping=True)
    if reason:
        pytest.skip(reason)
    out = tmp_path / "link.json"
    result = check(run(["tools/bench_link.py", "--model", "lenet", "--link", "100mbit", "--steps", "5",
                        "--batch", "16", "--reps", "1", "--variants", "dataparallel,fused",
                        "--json", str(out)], timeout=400))
    found = json.loads(out.read_text())
    if found["status"] == "skipped":            # the kernel refused namespaces to root
        pytest.skip(found["reason"])
    assert found["status"] == "ok" and found["link"] == "100mbit"
    assert set(found["variants"]) == {"dataparallel", "fused"}
    # Two hosts: two namespaces with their own addresses, and every job's ranks talked
    # over the veth pair between them.
    names = [host["namespace"] for host in found["hosts"]]
    assert len(set(names)) == 2 and {h["ip"] for h in found["hosts"]} == {netns.IP_A, netns.IP_B}
    for name, v in found["variants"].items():
        assert v["samples_per_s"] > 0 and v["world_size"] == 2 and v["steps"] == 5, name
        assert v["link_bytes"][0] > 0, name
    assert found["variants"]["dataparallel"]["vs_reference"] == 1.0
    assert "| fused | sync.mode=fused |" in result.stdout
    assert not set(names) & set(netns.netns_names())


def test_bench_link_refuses_bad_input_and_skips_where_it_cannot_run(tmp_path):
    _refuses("bench_link", ["--link", "fast"])
    # Without iproute2 on the PATH: one line saying why, exit 0, "skipped" in the JSON.
    out = tmp_path / "skipped.json"
    result = check(run(["tools/bench_link.py", "--json", str(out)], env={"PATH": str(tmp_path)},
                       timeout=60))
    assert "skipped" in result.stdout and "iproute2" in result.stdout
    assert json.loads(out.read_text())["status"] == "skipped"


def test_bench_loader_trains_on_jpegs_with_and_without_workers(tmp_path):
    out = tmp_path / "loader.json"
    # 5 steps of 2 per epoch: training ends inside an epoch, with DataLoader workers still
    # running (once a hang until dist.hang_timeout, shortened here to fail fast).
    result = check(run(["tools/bench_loader.py", "--runs", "1", "--classes", "2", "--images", "16",
                        "--batch", "8", "--steps", "4", "--warmup", "1", "--frameworks",
                        "paddle,paddle_dist", "-o", "dist.hang_timeout=60", "--json", str(out)], timeout=400))
    found = json.loads(out.read_text())
    assert (found["workers"], found["steps"], found["overrides"]) == ([0, 2], 4, ["dist.hang_timeout=60"])
    v = found["variants"]
    assert set(v) == {"paddle_w0", "paddle_w2", "paddle_dist_w0", "paddle_dist_w2"}
    for name, entry in v.items():
        assert entry["samples_per_s"] > 0 and len(entry["runs"]) == 1, name
    assert v["paddle_w2"]["vs_paddle"] == 1.0 and v["paddle_dist_w0"]["vs_w0"] == 1.0
    ours, plain = v["paddle_dist_w2"], v["paddle_w2"]
    assert abs(ours["vs_paddle"] - ours["runs"][0] / plain["runs"][0]) < 1e-9
    assert abs(ours["vs_w0"] - ours["runs"][0] / v["paddle_dist_w0"]["runs"][0]) < 1e-9
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| variant |") and "vs 0 workers" in table[0] and len(table) == 1 + 4


def test_bench_loader_refuses_bad_input_with_one_line():
    _refuses("bench_loader", ["--frameworks", "nope"])


def test_bench_batchstats_times_a_job_with_and_one_without_batchnorms_sync(tmp_path):
    """Each job of the pair runs; the one without BatchNorm's sync exits non-zero unless its
    patch reached the BatchStats fit() builds (tools/bench_batchstats.py: without_batchstats)."""
    out = tmp_path / "batchstats.json"
    result = check(run(["tools/bench_batchstats.py", "--pairs", "1", "--samples", "128", "--json", str(out)],
                       timeout=300))
    found = json.loads(out.read_text())
    assert (found["nprocs"], len(found["pairs"])) == (2, 1) and found["median_ratio"] > 0
    assert "2 ranks: median ratio" in result.stdout


def test_bench_tokens_pairs_fit_with_a_plain_loop_on_the_same_stream_and_times_both_evaluations(tmp_path):
    out = tmp_path / "tokens.json"
    result = check(run(["tools/bench_tokens.py", "--steps", "4", "--warmup", "2", "--chunk", "2",
                        "--launches", "1", "--eval-every", "2", "--variants", "fit,fit_mean",
                        "--json", str(out)], timeout=300))
    found = json.loads(out.read_text())["variants"]
    assert set(found) == {"fit", "fit_mean"}
    for name, v in found.items():
        assert v["chunks"] == 2, name                   # 4 timed step pairs in chunks of 2
        assert v["tokens_per_s"] > 0 and v["plain_tokens_per_s"] > 0, name
        assert abs(v["tokens_per_s"] / v["plain_tokens_per_s"] - v["ratio_overall"]) < 1e-9, name
        # Evaluations after steps 4, 6 and the last (7) are timed; after 2, a warm-up step, not.
        assert v["eval_pairs"] == 3 and v["eval_ms"] > 0 and v["plain_eval_ms"] > 0, name
        assert len(v["per_job_other_ranks"][0]) == 1, name          # rank 1's view
    # The plain evaluation ran fit()'s batches: the same token-mean loss.
    assert found["fit"]["eval_loss_rel_diff"] < 1e-9
    assert "the token count's exchange: fit against fit_mean" in result.stdout
    assert "| fit |" in result.stdout and "| fit_mean |" in result.stdout


def test_bench_tokens_refuses_bad_input_with_one_line():
    _refuses("bench_tokens", ["--variants", "nope"])


def test_compare_paddleformers_needs_paddleformers_and_says_so_in_one_line():
    import importlib.util

    if importlib.util.find_spec("paddleformers") is not None:
        pytest.skip("paddleformers is installed here: the comparison itself runs below")
    result = run(["tools/compare_paddleformers.py"], timeout=60)
    assert result.returncode == 2 and "paddleformers is not installed" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_paddleformers_trains_the_same_micro_batches_on_both_sides(tmp_path):
    """Each side's final weights are its rule's one-process replay: fit()'s the token mean's,
    PaddleFormers' Trainer's the mean of the micro-batches' means (so both saw the same data)."""
    pytest.importorskip("paddleformers")
    out = tmp_path / "pf.json"
    check(run(["tools/compare_paddleformers.py", "--pairs", "1", "--json", str(out)], timeout=600))
    found = json.loads(out.read_text())
    assert found["paddle_dist"]["to_token_mean_replay"] < 1e-6
    assert found["paddleformers"]["to_mean_of_means_replay"] < 1e-6
    for side in ("paddle_dist", "paddleformers"):
        assert len(found[side]["losses"]) == found["steps"] and found[side]["tokens_per_s"][0] > 0, side
