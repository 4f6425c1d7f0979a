"""The pieces of paddle_dist that touch a model's state, on an O2 model (tests/gpu_standin.py:
on a CPU, the state paddle.amp.decorate leaves on a GPU): bfloat16 weights but
BatchNorm's, float32 master weights, and a state-dict hook on every sublayer whose
state_dict() hands out float32 copies, never the model's own tensors."""

import zlib
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddle_dist.trainer import amp
from tests import gpu_standin

PLAN = SimpleNamespace(amp="O2", amp_dtype="bfloat16", loss_scale=0.0)
SIXTEEN_BIT = ["conv.weight", "conv.bias", "head.weight", "head.bias"]


@pytest.fixture
def standin():
    gpu_standin.install()
    yield amp.plan(PLAN, "cpu")
    gpu_standin.uninstall()


def o2_model(plan, seed=3):
    """SmallBN and its SGD, decorated as paddle_dist's trainer decorates them (amp.decorate)."""
    paddle.seed(seed)
    net = gpu_standin.SmallBN()
    return amp.decorate(net, paddle.optimizer.SGD(0.1, parameters=net.parameters()), plan)


def batch(seed=0, n=8):
    rng = np.random.RandomState(seed)
    return (paddle.to_tensor(rng.randn(n, 1, 8, 8).astype("float32")),
            paddle.to_tensor(rng.randint(0, 4, (n, 1)).astype("int64")))


def train_step(net, opt, plan, seed=0):
    """One step as the loop trainer takes it (its forward, loss and step)."""
    from paddle_dist.trainer.engine import step

    x, y = batch(seed)
    return step(net, paddle.nn.CrossEntropyLoss(), [([x], [y])], opt, plan)


def wide(tensors) -> dict:
    return {k: v.astype("float32").numpy() for k, v in tensors.items()}


def test_the_standin_leaves_the_state_decorate_leaves_on_a_gpu(standin):
    assert standin == amp.AmpPlan("O2", "bfloat16", 0.0)
    net, opt = o2_model(standin)
    own = net.state_dict(use_hook=False)
    assert [k for k, v in own.items() if v.dtype == paddle.bfloat16] == SIXTEEN_BIT
    assert {v.dtype for v in net.state_dict().values()} == {paddle.float32}
    assert all(layer._state_dict_hooks for layer in net.sublayers(include_self=True))
    assert opt._multi_precision and not opt._master_weights
    train_step(net, opt, standin)
    assert sorted(opt._master_weights) == sorted(p.name for p in net.parameters() if p.dtype == paddle.bfloat16)
    assert {v.dtype for v in opt._master_weights.values()} == {paddle.float32}
    assert "master_weights" in opt.state_dict()
    with pytest.raises(RuntimeError, match="outside auto_cast"):      # as conv2d on a GPU
        net(batch()[0])
    with amp.autocast(standin):
        logits = net(batch()[0])
    assert logits.dtype == paddle.bfloat16 and logits.numpy().dtype == np.uint16     # raw bits, as on a GPU
    with pytest.raises(RuntimeError, match="bfloat16"):     # no bf16 cross-entropy (2.6's GPUs: none either)
        paddle.nn.functional.cross_entropy(logits, batch()[1])
    assert net.state_dict(use_hook=False)["conv.weight"] is net.conv.weight       # put back


def test_state_tensors_are_the_models_own_tensors_and_state_dict_hands_out_copies(standin):
    from paddle_dist.compat import state_tensors

    net, _ = o2_model(standin)
    own, copies = state_tensors(net), net.state_dict()
    assert list(own) == list(copies)
    assert own["conv.weight"] is net.conv.weight and own["bn._mean"] is net.bn._mean
    assert own["conv.weight"].dtype == paddle.bfloat16 and copies["conv.weight"].dtype == paddle.float32
    assert copies["bn._mean"] is not net.bn._mean        # even float32 entries are copies
    with paddle.no_grad():
        copies["bn._mean"].set_value(paddle.full([4], 5.0))
        own["bn._variance"].set_value(paddle.full([4], 7.0))
    assert float(net.bn._mean.numpy().max()) == 0.0      # a write into the copy changes nothing
    assert float(net.bn._variance.numpy().min()) == 7.0


def test_put_weights_of_a_float32_checkpoint_into_an_o2_model(standin):
    from paddle_dist.checkpoint.weights import put_weights

    paddle.seed(11)
    plain = gpu_standin.SmallBN()            # float32: the weights of a float32 run, or of an O2 checkpoint
    with paddle.no_grad():
        plain.bn._mean.set_value(paddle.to_tensor([0.5, -1.0, 2.0, 0.25]))
    saved = {k: v.numpy() for k, v in plain.state_dict().items()}
    net, _ = o2_model(standin)
    put_weights(saved, net, "checkpoint x", "checkpoint")
    own = net.state_dict(use_hook=False)
    assert [k for k, v in own.items() if v.dtype == paddle.bfloat16] == SIXTEEN_BIT    # still O2
    for key, value in own.items():
        expected = paddle.to_tensor(saved[key]).astype(value.dtype)
        assert np.array_equal(value.astype("float32").numpy(), expected.astype("float32").numpy()), key
    # What an O2 run saves (state_dict(): float32) goes back into an O2 model exactly.
    again, _ = o2_model(standin, seed=99)
    put_weights({k: v.numpy() for k, v in net.state_dict().items()}, again, "checkpoint y", "checkpoint")
    mine, theirs = wide(own), wide(again.state_dict(use_hook=False))
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)


def test_an_o2_checkpoint_restores_an_o2_model_and_optimizer_that_go_on_bitwise(standin, tmp_path):
    from paddle_dist import checkpoint

    net, opt = o2_model(standin)
    for step in range(3):
        train_step(net, opt, standin, seed=step)
    meta = {"global_step": 3, "epoch": 0, "step_in_epoch": 3, "world_size": 1, "model": "SmallBN"}
    path = checkpoint.save(tmp_path, net, opt, meta)
    other, other_opt = o2_model(standin, seed=5)
    checkpoint.restore(checkpoint.load(path), other, other_opt, rng=False)
    for a, b in ((net, opt), (other, other_opt)):
        train_step(a, b, standin, seed=7)
    mine, theirs = wide(net.state_dict(use_hook=False)), wide(other.state_dict(use_hook=False))
    assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    assert all(np.array_equal(v.numpy(), other_opt._master_weights[k].numpy()) for k, v in opt._master_weights.items())


def test_the_moving_averages_of_an_o2_model(standin):
    from paddle_dist.trainer.ema import Ema

    net, opt = o2_model(standin)
    ema = Ema(net, 0.9)
    assert list(ema.state()) == list(net.state_dict())          # every floating entry, by key
    train_step(net, opt, standin)
    ema.update()
    averages = ema.state()
    assert {v.dtype for v in averages.values()} == {np.dtype("float32")}
    assert not np.array_equal(averages["conv.weight"], ema.tensors["conv.weight"].astype("float32").numpy())
    before = wide(net.state_dict(use_hook=False))
    with ema.applied():          # the averages, in the model's own 16-bit tensors
        inside = net.state_dict(use_hook=False)
        assert inside["conv.weight"].dtype == paddle.bfloat16
        assert np.array_equal(inside["conv.weight"].astype("float32").numpy(),
                              paddle.to_tensor(averages["conv.weight"]).astype("bfloat16").astype("float32").numpy())
        assert np.array_equal(inside["bn._variance"].numpy(), averages["bn._variance"])
    after = wide(net.state_dict(use_hook=False))
    assert all(np.array_equal(before[k], after[k]) for k in before)
    weights = ema.weights()       # ema.npz: float32, keyed like state_dict
    assert list(weights) == list(net.state_dict()) and {v.dtype for v in weights.values()} == {np.dtype("float32")}
    again = Ema(o2_model(standin, seed=8)[0], 0.9)
    again.load(averages, ema.updates)
    assert all(np.array_equal(again.state()[k], averages[k]) for k in averages)


def test_batch_stats_write_the_models_own_buffers(standin):
    from paddle_dist.sync.batchstats import BatchStats

    net, opt = o2_model(standin)
    stats = BatchStats(net, SimpleNamespace(is_distributed=False))
    seen = []
    net.bn.register_forward_pre_hook(lambda layer, inputs: seen.append(inputs[0].numpy().astype("float64")))
    x1, y1 = batch(1)
    x2, y2 = batch(2)
    from paddle_dist.trainer.engine import step

    step(net, paddle.nn.CrossEntropyLoss(), [([x1], [y1]), ([x2], [y2])], opt, standin)   # one optimizer step
    stats.step()
    union = np.concatenate(seen)
    expected_mean = 0.1 * union.mean(axis=(0, 2, 3))
    expected_variance = 0.9 + 0.1 * union.var(axis=(0, 2, 3))
    np.testing.assert_allclose(net.bn._mean.numpy(), expected_mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(net.bn._variance.numpy(), expected_variance, rtol=1e-6)
    assert net.state_dict()["bn._mean"].numpy().tolist() == net.bn._mean.numpy().tolist()
    stats.close()


def test_the_weights_check_digests_the_models_own_tensors(standin):
    from paddle_dist.trainer.agreement import digests

    net, _ = o2_model(standin)
    names, found = digests(net)
    assert names == list(net.state_dict())
    own = net.state_dict(use_hook=False)
    assert found[names.index("conv.weight")] == zlib.crc32(own["conv.weight"].numpy().tobytes())   # bf16 bits
    same_names, same = digests(o2_model(standin)[0])
    assert same_names == names and np.array_equal(found, same)
    with paddle.no_grad():      # the real 16-bit weight changes: its digest does
        net.head.weight.set_value((net.head.weight.astype("float32") * 2.0).astype("bfloat16"))
    _, after = digests(net, {"average": paddle.zeros([2])})
    assert [names[i] for i in np.flatnonzero(after[:len(names)] != found)] == ["head.weight"]
    assert len(after) == len(names) + 1


def test_the_synced_scaler_skips_an_overflowing_step_and_halves_its_scale(standin, caplog):
    """The stand-in's GradScaler is enabled, as on a GPU; paddle_dist's SyncedScaler reads
    the overflow on every Paddle version (compat.scaler_found_inf) and updates the scale
    by Paddle's rule, with a line instead of Paddle's message (a TypeError on 3.x with
    numpy 2.4)."""
    from paddle_dist import compat

    plan = amp.AmpPlan("O1", "float16", 1024.0)
    scaler = amp.scaler(plan, SimpleNamespace(average_now=lambda optimizer: None))
    assert scaler.is_enable()
    paddle.seed(1)
    net = paddle.nn.Linear(4, 2)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    for factor, moved, scale in ((float("inf"), False, 512.0), (1.0, True, 512.0)):
        before = net.weight.numpy().copy()
        with amp.autocast(plan):
            loss = net(paddle.ones([3, 4])).sum() * factor
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        assert compat.scaler_found_inf(scaler) is not moved
        assert (not np.array_equal(before, net.weight.numpy())) is moved
        assert amp.scaler_state(scaler)["scale"] == scale
    assert scaler.skipped == 1
    assert caplog.text.count("the step is skipped on every rank (overflow 1); loss scale 1024 -> 512") == 1
