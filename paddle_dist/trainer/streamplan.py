"""A stream under the run's data plan, as this rank's trainer reads it (streams.py has the
rule): its batches (`StreamBatches`, through the user's DataLoader workers), and what the
trainers ask of a sampler (`StreamSampler`: start, len, a step's digest), with every
lane's position for a checkpoint (Meta.stream).

A stream has no epochs: its run is `train.max_steps` steps, one epoch long. Each batch
comes with its record (streams.RankStream); the rank checks it is the micro-batch the plan
wants next (a worker out of turn is a bug, never a silent reorder) and keeps the lane's
position after it. At a checkpoint the ranks gather their lanes' positions (one gather);
with `train.log_samples` each step's sample identities too.

Example:
    loader, sampler = train_loader(parts, cfg, env, plan, resumed.meta, gather)
    sampler.start(0, steps_done=120)         # the next batch is step 121's
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import paddle
from paddle.io.dataloader.collate import default_collate_fn

from ..checkpoint import Meta
from ..runtime.env import DistEnv
from ..schema import Config
from .loading import NotedWorker, SplitLoader, to_tensors
from .sampling import DataPlan
from .streams import LanePosition, Layout, RankStream, check_shards, lane_count


class StreamSampler:
    """This rank's share of a stream's micro-batches, steps `start` .. `limit` - 1.
    `gather(obj)`: every rank's obj in rank order (a collective, called on every rank);
    `positions`: every lane's where this attempt starts; `log`: keep each step's sample
    identities for its digest (train.log_samples)."""

    gathers = True     # the step digest is a collective: every rank asks for it (Session)

    def __init__(self, layout: Layout, limit: int, positions: List[LanePosition],
                 gather: Callable[[Any], List[Any]], log: bool = False):
        self.layout, self.limit, self.positions = layout, limit, list(positions)
        self.gather, self.log = gather, log
        self.first = 0
        self.reached: Dict[int, LanePosition] = {}          # lane -> after its last batch given here
        self.ids: Dict[int, List[str]] = {}                 # step -> its sample identities here

    def start(self, epoch: int, steps_done: int = 0) -> None:
        """Begin at step `steps_done` (a stream's run is one epoch: `epoch` is 0)."""
        self.first = steps_done

    def __len__(self) -> int:
        """Micro-batches this rank takes from its start to the run's last step."""
        return max(self.limit - self.first, 0) * self.layout.share

    def expected(self):
        """(lane, micro-batch) of this rank's batches from its start, in order."""
        return self.layout.sequence(self.first, self.limit)

    def note(self, record: str, wanted: Tuple[int, int]) -> None:
        """A batch's record (streams.RankStream) as it is given to training."""
        found = json.loads(record)
        lane, micro = found["lane"], found["micro"]
        if (lane, micro) != tuple(wanted):
            raise RuntimeError(f"the stream's batch is micro-batch {micro} of lane {lane}, but the plan wants "
                               f"{wanted[1]} of lane {wanted[0]}: the DataLoader's workers gave their batches "
                               "out of turn; this is a bug in paddle_dist, please report it")
        self.reached[lane] = LanePosition.of(found["after"])
        if self.log:
            step = self.layout.step_of(lane, micro)
            self.ids.setdefault(step, []).extend(":".join(map(str, i)) for i in found["ids"])

    def step_digest(self, step: int) -> str:
        """A digest of the identities of step `step`'s samples over all ranks (sorted: the
        same at any world size). Every rank calls it (`gathers`).

        Example:
            sampler.step_digest(3)      # '5be0c2d1'
        """
        mine = self.ids.pop(step, [])
        every = sorted(i for ids in self.gather(mine) for i in ids)
        return hashlib.sha256(",".join(every).encode()).hexdigest()[:8]

    def position(self, steps: int) -> Dict[str, Any]:
        """Every lane's position after `steps` steps, for the checkpoint (Meta.stream): each
        rank's lanes gathered (every rank calls it)."""
        mine = {lane: at.to_dict() for lane, at in self.reached.items()}
        lanes = list(self.positions)
        for found in self.gather(mine):
            for lane, raw in found.items():
                at = LanePosition.of(raw)
                if at.micro > lanes[int(lane)].micro:
                    lanes[int(lane)] = at
        late = [lane for lane, at in enumerate(lanes) if at.micro != self.layout.given(lane, steps)]
        if late:
            raise RuntimeError(f"the stream's lanes {late} do not stand at step {steps}: this is a bug in "
                               "paddle_dist, please report it")
        return {"lanes": self.layout.lanes, "positions": [at.to_dict() for at in lanes]}


class StreamBatches:
    """This rank's batches of the stream from its sampler's start: a DataLoader of the
    user's workers over streams.RankStream (read in this process without workers)."""

    def __init__(self, source, sampler: StreamSampler, batch_size: int, workers: int, job_dir: str = "",
                 notes: str = ""):
        self.source, self.sampler, self.batch_size = source, sampler, batch_size
        self.workers, self.job_dir, self.notes = workers, job_dir, notes

    def __iter__(self):
        sampler = self.sampler
        stream = RankStream(self.source.dataset, sampler.layout, sampler.first, sampler.limit,
                            sampler.positions, self.batch_size, self.source.collate_fn or default_collate_fn,
                            self.notes)
        if not self.workers:
            return _Noted(((to_tensors(batch), record) for batch, record in stream), sampler)
        options = dict(self.source.options,
                       worker_init_fn=NotedWorker(self.job_dir, self.source.options.get("worker_init_fn")))
        loader = paddle.io.DataLoader(stream, batch_size=None, collate_fn=as_is, num_workers=self.workers,
                                      **options)
        return _Noted(iter(loader), sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def as_is(batch):
    """A DataLoader's collate for batches collated already (in RankStream)."""
    return batch


class _Noted:
    """Batches with their records noted in the sampler, up to this rank's last."""

    def __init__(self, batches, sampler: StreamSampler):
        self.batches, self.sampler, self.wanted = batches, sampler, sampler.expected()

    def __iter__(self):
        return self

    def __next__(self):
        wanted = next(self.wanted)          # the rank's last batch given: no more read
        batch, record = next(self.batches)
        self.sampler.note(record, wanted)
        return batch

    def _try_shutdown_all(self) -> None:
        """SplitLoader ends a DataLoader's workers through this."""
        shutdown = getattr(self.batches, "_try_shutdown_all", None)
        if shutdown is not None:
            shutdown()


def positions_of(meta: Optional[Meta], lanes: int) -> List[LanePosition]:
    """Every lane's position in the checkpoint `meta`; from the start without one (a lane
    continued from there reads up to the step: exact, only slower)."""
    saved = (meta.stream or {}) if meta is not None else {}
    if saved.get("lanes") != lanes:
        return [LanePosition()] * lanes
    return [LanePosition.of(raw) for raw in saved["positions"]]


def train_loader(parts, cfg: Config, env: DistEnv, plan: DataPlan, meta: Optional[Meta],
                 gather: Callable[[Any], List[Any]]):
    """This rank's batches of a stream as (inputs, labels), and their sampler."""
    source = parts.train_data
    lanes = lane_count(source.dataset, plan.world, plan.accumulate)
    check_shards(source.dataset, lanes)
    layout = Layout(plan.world, plan.accumulate, env.global_rank, env.world_size, lanes)
    sampler = StreamSampler(layout, cfg.train.max_steps, positions_of(meta, lanes), gather,
                            cfg.train.log_samples)
    workers = cfg.data.num_workers if source.num_workers is None else source.num_workers
    # A failing sample's description comes back from its worker through a file (badsample.py).
    notes = env.job_dir or (tempfile.mkdtemp(prefix="paddle_dist-samples-") if workers else "")
    batches = StreamBatches(source, sampler, cfg.train.batch_size, workers, env.job_dir, notes)
    return SplitLoader(batches, parts.feed, notes, own_folder=bool(notes) and not env.job_dir), sampler
