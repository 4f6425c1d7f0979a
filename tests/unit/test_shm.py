"""paddle_dist.shm: the shared-memory all-reduce, between real processes (no paddle)."""

import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from paddle_dist import shm

pytestmark = pytest.mark.skipif(not shm.supported(), reason="needs x86-64 and /dev/shm")
CTX = mp.get_context("spawn")     # fresh interpreters: nothing inherited but the arguments


def _inputs(rank, sizes, step):
    rng = np.random.RandomState(1000 * step + rank)
    return [rng.standard_normal(n).astype(np.float32) for n in sizes]


def _rank_main(path, rank, world, chunk, sizes, steps, out):
    reducer = shm.ShmReducer.attach(path, rank, world, chunk)
    results, rounds = [], 0
    for step in range(steps):
        arrays = _inputs(rank, sizes, step)
        rounds += reducer.all_reduce(arrays, scale=0.5)
        results.append(np.concatenate(arrays))
    np.save(out, np.stack(results))
    os._exit(0 if rounds == steps * -(-sum(sizes) // chunk) else 3)


def _run(tmp_path, world, chunk, sizes, steps):
    path = shm.new_path("test")
    reducer = shm.ShmReducer.create(path, world, chunk)
    procs = [CTX.Process(target=_rank_main, args=(path, r, world, chunk, sizes, steps,
                                                  str(tmp_path / f"r{r}.npy")))
             for r in range(1, world)]
    try:
        for p in procs:
            p.start()
        mine = []
        for step in range(steps):
            arrays = _inputs(0, sizes, step)
            reducer.all_reduce(arrays, scale=0.5)
            mine.append(np.concatenate(arrays))
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill()
        os.unlink(path)
        reducer.close()
    return [np.stack(mine)] + [np.load(tmp_path / f"r{r}.npy") for r in range(1, world)]


def test_three_ranks_get_the_same_sums_over_many_rounds(tmp_path):
    sizes, steps = [700, 5, 1300], 4           # 2005 elements in rounds of 256: 8 rounds a step
    results = _run(tmp_path, world=3, chunk=256, sizes=sizes, steps=steps)
    for other in results[1:]:
        assert np.array_equal(results[0], other)          # bit for bit on every rank
    for step in range(steps):
        parts = [np.concatenate(_inputs(r, sizes, step)) * np.float32(0.5) for r in range(3)]
        expected = (parts[0] + parts[1]) + parts[2]       # rank order
        assert np.array_equal(results[0][step], expected)


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
        peer.join(timeout=60)
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
