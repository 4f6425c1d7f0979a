"""Run by tests/integration/test_stopped_run.py as a pytest run of its own (not collected
by the suite: no test_ prefix): it brings up a Slurm cluster, two network namespaces and
a long process inside one, writes what it holds to $STOPPED_RUN_READY, then waits for the
signal that stops the run."""

import json
import os
import select
from pathlib import Path

from tests import stopping
from tests.integration import procs
from tests.integration.netns import two_hosts  # noqa: F401  (fixture)
from tests.integration.slurm import slurm_cluster  # noqa: F401  (fixture)


def test_holds_everything_until_stopped(slurm_cluster, two_hosts):
    proc, _ = procs.start(two_hosts.cmd(two_hosts.a, ["sleep", "600"]), limit=600)
    held = {"slurm_root": str(slurm_cluster.root), "netns": [two_hosts.a, two_hosts.b],
            "session": proc.pid, "records": str(stopping._folder)}
    ready = Path(os.environ["STOPPED_RUN_READY"])
    ready.with_suffix(".tmp").write_text(json.dumps(held))
    ready.with_suffix(".tmp").rename(ready)      # whole, or not there
    select.select([], [], [])                    # until the signal
