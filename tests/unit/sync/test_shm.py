"""paddle_dist.sync.shm: the shared-memory all-reduce, between real processes (no paddle).

Every rank runs in a child process, so a protocol that hangs fails the test at a join's
timeout instead of hanging it. The parent makes the segment, waits until every rank has
mapped it and unlinks it before the first round, as `reducers.open_shm` does.
"""

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from paddle_dist.sync import shm

pytestmark = pytest.mark.skipif(not shm.supported(), reason="needs x86-64 and /dev/shm")
CTX = mp.get_context("spawn")     # fresh interpreters: nothing inherited but the arguments
TIMEOUT = 60
SCALE = 0.5


def _inputs(rank, sizes, step):
    rng = np.random.RandomState(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in sizes]


def _expected(world, sizes, step):
    """The reference: ((a0*s) + (a1*s)) + (a2*s) ... in rank order, in float32."""
    parts = [np.concatenate(_inputs(r, sizes, step) + [np.zeros(0, np.float32)])
             * np.float32(SCALE) for r in range(world)]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _rounds(chunk, plan):
    return sum(max(1, -(-sum(sizes) // chunk)) for sizes in plan)


# small_round for ShmReducer: rounds of world x length up to it sum every slot on every
# rank; above it they reduce-scatter and all-gather. The tests run every mix of the two.
GATHER, MIXED, SUM_ALL = 0, 100, 1 << 30


def _rank_main(path, rank, world, chunk, plan, small, out, attached):
    reducer = shm.ShmReducer.attach(path, rank, world, chunk, small_round=small)
    attached.send(rank)
    results, rounds = [], 0
    for step, sizes in enumerate(plan):
        arrays = _inputs(rank, sizes, step)
        rounds += reducer.all_reduce(arrays, scale=SCALE)
        results.append(np.concatenate(arrays + [np.zeros(0, np.float32)]))
    np.savez(out, *results)
    os._exit(0 if rounds == _rounds(chunk, plan) else 3)


def _start(path, targets):
    """Start one process per (target, args) and unlink the segment once all have mapped it
    (each says so through its own pipe: a send is written at once, even if it dies next)."""
    pipes = [CTX.Pipe(duplex=False) for _ in targets]
    procs = [CTX.Process(target=target, args=args + (send,))
             for (target, args), (_, send) in zip(targets, pipes)]
    for p in procs:
        p.start()
    try:
        for receive, _ in pipes:
            assert receive.poll(TIMEOUT), "a rank did not attach"
            receive.recv()
    finally:
        os.unlink(path)
    return procs


def _join(procs):
    try:
        for p in procs:
            p.join(timeout=TIMEOUT)
        return [p.exitcode for p in procs]
    finally:
        for p in procs:
            p.kill()


def _run(tmp_path, world, chunk, plan, small=GATHER):
    path = shm.new_path("test")
    shm.ShmReducer.create(path, world, chunk).close()
    outs = [str(tmp_path / f"r{r}.npz") for r in range(world)]
    procs = _start(path, [(_rank_main, (path, r, world, chunk, plan, small, outs[r]))
                                 for r in range(world)])
    assert _join(procs) == [0] * world
    return [np.load(out) for out in outs]


def _no_segment_left():
    return not list(shm.SHM_DIR.glob(f"paddle_dist-test-{os.getpid()}-*"))


def _check(results, world, plan):
    for step, sizes in enumerate(plan):
        expected = _expected(world, sizes, step)
        for rank in range(world):
            found = results[rank][f"arr_{step}"]
            assert found.dtype == np.float32 and np.array_equal(found, expected), (rank, step)


@pytest.mark.parametrize("world,small", [(1, GATHER), (2, GATHER), (3, GATHER), (4, GATHER),
                                         (8, GATHER), (2, MIXED), (3, MIXED), (2, SUM_ALL),
                                         (8, SUM_ALL)])
def test_every_rank_gets_the_rank_order_sums_over_many_rounds(tmp_path, world, small):
    # 2008 elements in rounds of 250 (not a multiple of 16, nor of any world): 9 rounds a
    # step, the last one 8 elements long; zero-length and tiny arrays among the others.
    # MIXED: the 8-element rounds sum every slot, the others reduce-scatter.
    plan = [[700, 5, 0, 1300, 3]] * 3
    _check(_run(tmp_path, world, chunk=250, plan=plan, small=small), world, plan)
    assert _no_segment_left()


@pytest.mark.parametrize("world,small", [(3, GATHER), (8, GATHER), (8, MIXED)])
def test_pieces_shorter_than_the_world_and_empty_calls(tmp_path, world, small):
    plan = [[3], [0], [], [1, 0, 2], [40, 9], [7] * 5]
    _check(_run(tmp_path, world, chunk=16, plan=plan, small=small), world, plan)
    assert _no_segment_left()


def test_slices_cover_the_round_in_whole_lines():
    assert shm.slice_bounds(100, 3) == [0, 48, 96, 100]
    assert shm.slice_bounds(5, 3) == [0, 5, 5, 5]
    assert shm.slice_bounds(0, 4) == [0] * 5
    for length in range(0, 300, 7):
        bounds = shm.slice_bounds(length, 8)
        assert bounds[0] == 0 and bounds[-1] == length and bounds == sorted(bounds)
        assert all(b % 16 == 0 for b in bounds[:-1] if b < length)


def _survivor(path, rank, world, out, attached):
    reducer = shm.ShmReducer.attach(path, rank, world, 16, small_round=GATHER)
    attached.send(rank)
    try:
        for _ in range(4):
            reducer.all_reduce([np.ones(16, np.float32)])
    except shm.PeerGone as exc:
        with open(out, "w") as f:
            f.write(str(exc))
        os._exit(7)
    os._exit(0)


def _die(path, rank, world, announced, attached):
    """Take part in round 1, then announce `announced` steps of round 2 and die."""
    reducer = shm.ShmReducer.attach(path, rank, world, 16, small_round=GATHER)
    attached.send(rank)
    reducer.all_reduce([np.ones(16, np.float32)])
    for counter in [reducer.written, reducer.reduced][:announced]:
        counter[rank] = 2
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("announced", [0, 1, 2])   # dies before writing, after, after summing
def test_a_peer_that_dies_is_reported_by_every_survivor(tmp_path, announced):
    path = shm.new_path("test")
    shm.ShmReducer.create(path, 3, 16).close()
    outs = [str(tmp_path / f"r{r}.txt") for r in range(2)]
    procs = _start(path, [(_survivor, (path, 0, 3, outs[0])), (_survivor, (path, 1, 3, outs[1])),
                             (_die, (path, 2, 3, announced))])
    assert _join(procs) == [7, 7, -signal.SIGKILL]
    for out in outs:
        assert open(out).read().startswith(f"rank 2 (pid {procs[2].pid}) died")
    assert _no_segment_left()


def _die_after_writing(path):
    reducer = shm.ShmReducer.attach(path, 1, 2, 16)
    reducer.all_reduce([np.ones(16, np.float32)])
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_peer_that_dies_is_reported_not_waited_for():
    path = shm.new_path("test")
    reducer = shm.ShmReducer.create(path, 2, 16)
    peer = CTX.Process(target=_die_after_writing, args=(path,))
    try:
        peer.start()
        reducer.all_reduce([np.ones(16, np.float32)])    # round 1: both take part
        with pytest.raises(shm.PeerGone, match="rank 1"):
            reducer.all_reduce([np.ones(16, np.float32)])
    finally:
        peer.join(timeout=TIMEOUT)
        os.unlink(path)
        reducer.close()
    assert peer.exitcode == -signal.SIGKILL


def test_the_host_key_is_stable_and_different_namespaces_differ():
    assert shm.host_key() == shm.host_key()
    assert shm.host_key().count("|") == 3 and "unknown" not in shm.host_key()


def test_a_segment_that_does_not_fit_is_refused_cleanly(tmp_path):
    path = shm.new_path("test")
    with pytest.raises(OSError):
        shm.ShmReducer.create(path, world=2, chunk=1 << 40)       # 16 TiB
    assert not path.exists()
