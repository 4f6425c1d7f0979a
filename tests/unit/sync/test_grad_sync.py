"""GradSync on one process (collectives stood in for): the stop-flag schedule of
sync.mode=dataparallel (about once a second, at steps rank 0 picks), how it attaches to an
optimizer, and what it refuses once training runs (the checks before it starts:
test_checks.py). Its exactness across real ranks: tests/integration/test_replay_matrix.py
and test_sync_options.py."""

from types import SimpleNamespace

import pytest

from paddle_dist.sync import checks, grad_sync as grad_sync_module


class Clock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(grad_sync_module, "time", fake)
    return fake


def _train(grad_sync, clock, steps, seconds_per_step, stop_at=None):
    """Run `steps` optimizer steps; return the steps at which the flag was exchanged and
    the first step that saw the stop."""
    exchanged, stopped = [], None
    for step in range(1, steps + 1):
        clock.now += seconds_per_step
        grad_sync.want_stop = lambda s=step: stop_at is not None and s >= stop_at
        before = grad_sync.calls
        grad_sync.average()
        if grad_sync.calls > before:
            exchanged.append(step)
        if grad_sync.stop_requested and stopped is None:
            stopped = step
    return exchanged, stopped


def _dataparallel(rank, proposal=None):
    """A GradSync of `rank` whose all-reduce adds the other rank's contribution: rank 0's
    proposal for the next interval when this is rank 1."""
    env = SimpleNamespace(is_distributed=True, global_rank=rank, backend="gloo", device="cpu")
    grad_sync = grad_sync_module.GradSync(env, mode="dataparallel")

    def all_reduce(tensor, what, read=None):
        grad_sync.calls += 1
        if proposal is not None:
            tensor[1] = tensor[1] + proposal(grad_sync.steps)
        return read() if read is not None else None
    grad_sync._all_reduce = all_reduce
    return grad_sync


def test_rank_0_spaces_the_exchanges_about_a_second_apart(clock):
    exchanged, stopped = _train(_dataparallel(0), clock, 450, 0.01, stop_at=150)
    assert exchanged == [1, 101, 201, 301, 401]        # 10 ms steps: every 100
    assert stopped == 201                              # the next exchange after the request


def test_slow_steps_exchange_at_every_step_and_fast_ones_at_most_max_apart(clock):
    exchanged, stopped = _train(_dataparallel(0), clock, 5, 2.0, stop_at=3)
    assert exchanged == [1, 2, 3, 4, 5] and stopped == 3
    exchanged, _ = _train(_dataparallel(0), clock, 2500, 1e-6)
    assert exchanged == [1, 1001, 2001]


def test_the_other_ranks_follow_rank_0s_schedule(clock):
    # Rank 1 proposes nothing: it adopts what the all-reduce brings (rank 0's interval).
    exchanged, stopped = _train(_dataparallel(1, proposal=lambda step: 40.0), clock, 100, 0.5,
                                stop_at=50)
    assert exchanged == [1, 41, 81] and stopped == 81


def test_gpus_read_the_fused_stop_flag_one_step_late_and_cpus_at_once(monkeypatch):
    import paddle

    from paddle_dist.sync.overlap import LateFlag

    monkeypatch.setattr(LateFlag, "EVERY", 1)
    for device, expected in (("gpu:0", [0.0, 2.0, 0.0]), ("cpu", [2.0, 0.0, 1.0])):
        env = SimpleNamespace(is_distributed=True, global_rank=0, backend="nccl", device=device)
        grad_sync = grad_sync_module.GradSync(env, mode="fused")
        seen = [grad_sync._read_flag(paddle.to_tensor([v], dtype="float32")) for v in (2.0, 0.0, 1.0)]
        assert seen == expected, device


def test_the_optimizer_averages_at_step_and_minimize_and_gets_its_class_back():
    """One process: every step() and minimize() averages once (also with parameter
    groups, where Paddle's own minimize() fails); close() restores the class."""
    import paddle

    net = paddle.nn.Linear(3, 2)
    groups = [{"params": [net.weight], "learning_rate": 2.0}, {"params": [net.bias]}]
    opt = paddle.optimizer.Momentum(0.1, parameters=groups, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    env = SimpleNamespace(is_distributed=False, global_rank=0, backend="gloo", device="cpu")
    grad_sync = grad_sync_module.GradSync(env, mode="fused")
    grad_sync.attach(opt, net)
    assert type(opt).__name__ == "Momentum" and isinstance(opt, paddle.optimizer.Momentum)
    for _ in range(2):
        loss = net(paddle.ones([4, 3])).sum()
        loss.backward()
        opt.step()
        opt.clear_grad()
    loss = net(paddle.ones([4, 3])).sum()
    loss.backward()
    opt.minimize(loss)
    assert grad_sync.steps == 3
    grad_sync.close()
    assert type(opt) is paddle.optimizer.Momentum


def test_a_parameter_unfrozen_after_the_start_is_refused_not_left_unaveraged():
    import paddle

    from paddle_dist.errors import ConfigError

    net = paddle.nn.Sequential(paddle.nn.Linear(3, 3), paddle.nn.Linear(3, 2))
    net[0].weight.stop_gradient = True
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    env = SimpleNamespace(is_distributed=True, global_rank=0, backend="gloo", device="cpu")
    grad_sync = grad_sync_module.GradSync(env, mode="fused")
    grad_sync.optimizer, grad_sync.params = opt, checks.trainable(opt)
    grad_sync.names = {id(p): n for n, p in net.named_parameters()}
    grad_sync._check_unchanged()
    net[0].weight.stop_gradient = False
    with pytest.raises(ConfigError, match="parameter '0.weight' became trainable after training started"):
        grad_sync._check_unchanged()


def _sync_for(device_info, environ, **options):
    from paddle_dist.runtime.env import detect
    from paddle_dist.schema import SyncConfig

    env = detect(gpu_info=device_info, environ=environ)
    return env, grad_sync_module.GradSync.from_config(env, SyncConfig(**options))


def _launched(rank, **extra):
    from tests.unit.runtime.test_env import launch_child

    return launch_child(rank, **extra)


def test_auto_on_gpus_is_paddles_reducer_and_the_start_line_says_so():
    from paddle_dist.runtime.devices import GpuInfo

    env, gpu = _sync_for(GpuInfo(True, 2), _launched(1, FLAGS_selected_gpus="1"))
    assert (env.device, env.backend, gpu.mode) == ("gpu:1", "nccl", "dataparallel")
    assert gpu.describe() == ("sync dataparallel (sync.mode=auto on GPUs): paddle.DataParallel's "
                              "reducer, find_unused_parameters")
    # CPUs keep paddle_dist's own exchange (fused or overlap, chosen at attach)
    env, cpu = _sync_for(GpuInfo(False, 0), _launched(1))
    assert (env.device, cpu.mode) == ("cpu", "auto")
    # an option only paddle_dist's exchange has keeps auto's own choice on GPUs too
    assert _sync_for(GpuInfo(True, 2), _launched(1, FLAGS_selected_gpus="1"), compress="bf16")[1].mode == "auto"
    # a mode named is the mode run
    env, named = _sync_for(GpuInfo(True, 2), _launched(1, FLAGS_selected_gpus="1"), mode="overlap")
    assert named.mode == "overlap"
    _, dp = _sync_for(GpuInfo(True, 2), _launched(1, FLAGS_selected_gpus="1"), mode="dataparallel",
                      find_unused_parameters=False)
    assert dp.describe() == "sync dataparallel: paddle.DataParallel's reducer"


def test_gpus_read_the_stop_flag_on_the_host_every_16_steps_and_every_rank_at_the_same_ones(monkeypatch):
    """Each read waits for the device's queued work: 32 steps read it twice (at 16 and 32),
    and a request made at step 3 and kept (a preemption's) is seen at step 16."""
    import paddle

    reads = []
    numpy = paddle.Tensor.numpy
    monkeypatch.setattr(paddle.Tensor, "numpy", lambda self: reads.append(1) or numpy(self))
    env = SimpleNamespace(is_distributed=True, global_rank=0, backend="nccl", device="gpu:0")
    grad_sync = grad_sync_module.GradSync(env, mode="fused")
    seen = [grad_sync._read_flag(paddle.to_tensor([2.0 if step >= 3 else 0.0])) for step in range(1, 33)]
    assert len(reads) == 2
    assert [step for step, value in enumerate(seen, 1) if value] == [16, 32] and seen[15] == 2.0


def _half_params(dtype, values):
    import paddle

    from paddle_dist.sync.overlap import set_grad

    zero = paddle.nn.initializer.Constant(0.0)
    params = [paddle.create_parameter([len(values)], dtype, default_initializer=zero) for _ in range(2)]
    for p in params:
        set_grad(p, paddle.to_tensor(values, dtype=dtype))
    return params


@pytest.mark.parametrize("dtype, compress", [("float16", "none"), ("bfloat16", "none"), ("float32", "fp16")])
def test_16_bit_gradients_are_divided_before_the_sum_as_paddles_reducer_does(dtype, compress):
    """Two ranks with loss-scaled gradients of 32768: their float16 sum (65536) is inf, their
    mean is not. Fused and overlap (NCCL's async path) both send the mean's parts."""
    import paddle

    from paddle_dist.sync.overlap import AsyncExchange

    def two_ranks(tensor, *args, **kwargs):
        tensor.set_value(tensor * 2)                 # a sum over 2 identical ranks

    env = SimpleNamespace(is_distributed=True, global_rank=0, world_size=2, backend="nccl", device="gpu:0")
    fused = grad_sync_module.GradSync(env, mode="fused", compress=compress)
    fused._all_reduce = lambda tensor, what, read=None: two_ranks(tensor)
    params = _half_params(dtype, [32768.0, 1.0])
    fused._reduce(params, paddle.to_tensor([1.0]))
    assert all(p.grad.astype("float32").numpy().tolist() == [32768.0, 1.0] for p in params)

    class Done:
        def wait(self):
            pass

    wire = grad_sync_module.HALF.get(compress)
    exchange = AsyncExchange(2, collective_fn=lambda t, sync_op: two_ranks(t) or Done(), wire=wire)
    params = _half_params(dtype, [32768.0, 1.0])
    exchange.submit(params, 1.0)
    exchange.wait()
    assert all(p.grad.astype("float32").numpy().tolist() == [32768.0, 1.0] for p in params)
