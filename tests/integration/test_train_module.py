"""`python -m paddle_dist.train` across machines: node 0 tells the other machines to run the
module, and Paddle's multi-node launcher (which takes a script file or a program) runs each
rank as `python -u -m paddle_dist.train ...`. Two "machines" on this host's loopback, one
rank each; tests/integration/test_install.py runs the module from an installed wheel.
"""

import json
from concurrent.futures import ThreadPoolExecutor

from paddle_dist.runs.layout import Run

from ..oracles import free_port, rank_statuses, read_metrics
from .procs import check, run

JOB = ["-m", "paddle_dist.train", "-c", "mnist_mlp", "-o", "train.max_steps=10",
       "-o", "checkpoint.every_epochs=0", "-o", "dist.rendezvous_timeout=60",
       "-o", "dist.nnodes=2", "-o", "dist.nprocs=1", "-o", "dist.host=127.0.0.1"]



def test_two_nodes_started_as_the_module(tmp_path):
    run_dir = tmp_path / "run"
    nodes = JOB + ["-o", f"dist.master=127.0.0.1:{free_port()}", "-o", f"output.run_dir={run_dir}"]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(run, nodes + ["-o", f"dist.node_rank={n}"], 240, None, tmp_path)
                   for n in (0, 1)]
        first, second = [check(f.result()) for f in futures]
    told = [line.strip() for line in first.stdout.splitlines() if line.startswith("  python ")]
    assert len(told) == 1 and told[0].startswith("python -m paddle_dist.train -c mnist_mlp ")
    assert told[0].endswith("-o dist.node_rank=1") and "dist.node_rank=0" not in told[0]
    # Both ranks ran to the end (paddle_dist/train.py run as a script would have failed at
    # once, on its relative import), in sync.
    records = rank_statuses(run_dir)
    assert [r["state"] for r in records] == ["done", "done"], records
    assert len({r["weights_sha256"] for r in records}) == 1
    assert read_metrics(run_dir)["world_size"] == 2
    assert json.loads(Run(run_dir).run_file.read_text())["command"][1:3] == ["-m", "paddle_dist.train"]
