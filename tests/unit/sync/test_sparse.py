"""paddle_dist.sync.sparse on one process: which parameters are tables, rows merged and packed,
gradients set as rows or dense, and the exchange with the ranks' collectives stood in for
(tests/integration/test_sparse_tables.py runs it on 2 real ranks against a replay)."""

from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddle_dist.errors import ConfigError
from paddle_dist.sync import sparse


class Table(paddle.nn.Layer):
    """A table of one's own: F.embedding(..., sparse=True)."""

    def __init__(self, rows=20, width=3):
        super().__init__()
        self.weight = self.create_parameter([rows, width])

    def forward(self, ids):
        return paddle.nn.functional.embedding(ids, self.weight, sparse=True)


class Model(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        paddle.seed(5)
        self.emb = paddle.nn.Embedding(20, 3, sparse=True)
        self.own = Table()
        self.dense = paddle.nn.Embedding(20, 3)
        self.out = paddle.nn.Linear(9, 1)

    def forward(self, ids):
        parts = [self.emb(ids).sum(1), self.own(ids).sum(1), self.dense(ids).sum(1)]
        return self.out(paddle.concat(parts, axis=1))


IDS = paddle.to_tensor([[1, 4, 4], [7, 1, 9]])


def _backward(net, ids=IDS):
    net(ids).sum().backward()


def test_merged_sums_repeated_rows_in_the_order_given():
    rows, values = sparse.merged(np.array([5, 1, 5, 2]), np.array([[1.0], [2.0], [3.0], [4.0]], "float32"))
    assert rows.tolist() == [1, 2, 5] and values.ravel().tolist() == [2.0, 4.0, 4.0]
    empty_rows, empty = sparse.merged(np.zeros(0, np.int64), np.zeros((0, 3), "float32"))
    assert empty_rows.size == 0 and empty.shape == (0, 3)


def test_packed_tables_come_back_as_they_went():
    tables = [(np.array([3, 9], np.int64), np.arange(2, dtype="float32").reshape(2, 1)),
              (np.array([0, 2**40], np.int64), np.arange(16, dtype="float64").reshape(2, 8))]
    buffer = sparse.pack(tables)
    assert buffer.dtype == np.int32 and buffer.size == 2 * (2 + 1) + 2 * (2 + 16)
    back = sparse.unpack(buffer, [2, 2], [(1, np.dtype("float32")), (8, np.dtype("float64"))])
    for (rows, values), (r, v) in zip(tables, back):
        assert np.array_equal(rows, r) and np.array_equal(values, v) and values.dtype == v.dtype


def test_float32_words_carry_ids_exactly_through_a_sum_with_zeros():
    tables = [(np.array([3, 2**40 + 5, 16_777_217], np.int64), np.arange(6, dtype="float32").reshape(3, 2))]
    buffer = sparse.pack(tables, np.float32)
    assert buffer.dtype == np.float32 and buffer.size == 3 * (2 + 2)
    summed = buffer + np.zeros_like(buffer)
    [(rows, values)] = sparse.unpack(summed, [3], [(2, np.dtype("float32"))])
    assert rows.tolist() == [3, 2**40 + 5, 16_777_217] and np.array_equal(values, tables[0][1])


class Slots:
    """A CPU reducer of 2 ranks whose other rank sends what this one sends."""

    def all_reduce(self, arrays, scale=1.0):
        both = arrays[0].reshape(2, -1)
        both[1] = both[0]
        return 1


def test_through_the_cpu_reducer_the_rows_are_those_of_the_all_gather(monkeypatch):
    results = []
    for reducer in (None, Slots()):
        net = Model()
        env = _two_ranks(monkeypatch, [])
        env.global_rank = 0
        params = list(net.parameters())
        tables = sparse.Tables(env, params, net)
        _backward(net)
        tables.exchange(paddle.optimizer.SGD(0.1, parameters=params), None, reducer)
        results.append([(p.grad.rows(), p.grad.numpy()) for p in tables.rows])
    for (rows, values), (rows2, values2) in zip(*results):
        assert rows == rows2 and np.array_equal(values, values2)


def test_tables_are_found_before_and_at_the_first_backward():
    net = Model()
    params = list(net.parameters())
    tables = sparse.Tables(SimpleNamespace(is_distributed=False), params, net)
    assert [p is net.emb.weight for p in sparse.declared(net)] == [True]
    owned = sparse.paddle_owned(net)
    assert id(net.own.weight) not in owned and id(net.emb.weight) not in owned
    assert id(net.dense.weight) in owned and id(net.out.weight) in owned
    assert [p is net.emb.weight for p in tables.rows] == [True]
    assert tables.uncertain == {id(net.own.weight)}
    assert {id(p) for p in tables.kept} == {id(net.emb.weight), id(net.own.weight)}
    _backward(net)
    assert sparse.is_rows(net.emb.weight.grad) and sparse.is_rows(net.own.weight.grad)
    assert not sparse.is_rows(net.dense.weight.grad) and not sparse.is_rows(None)


def test_rows_set_in_place_and_on_a_parameter_without_a_gradient():
    net = Model()
    _backward(net)
    sparse.set_rows(net.emb.weight, np.array([2, 6]), np.ones((2, 3), "float32"))
    assert net.emb.weight.grad.rows() == [2, 6]
    fresh = Model()              # this rank's batches never looked the table up
    assert fresh.emb.weight.grad is None
    sparse.set_rows(fresh.emb.weight, np.array([3]), np.full((1, 3), 2.0, "float32"))
    before = fresh.emb.weight.numpy().copy()
    paddle.optimizer.SGD(0.5, parameters=[fresh.emb.weight]).step()
    moved = np.flatnonzero(np.abs(fresh.emb.weight.numpy() - before).max(axis=1))
    assert moved.tolist() == [3] and np.allclose(before[3] - fresh.emb.weight.numpy()[3], 1.0)


def test_an_optimizer_that_updates_every_row_gets_them_dense_and_deterministic():
    assert sparse.keeps_rows(paddle.optimizer.SGD(0.1, parameters=Model().parameters()))
    assert sparse.keeps_rows(paddle.optimizer.Adam(0.1, parameters=Model().parameters(), lazy_mode=True))
    assert not sparse.keeps_rows(paddle.optimizer.Adam(0.1, parameters=Model().parameters()))
    assert not sparse.keeps_rows(paddle.optimizer.Momentum(0.1, parameters=Model().parameters()))
    assert sparse.optimizer_mode(paddle.optimizer.Adam(0.1, parameters=Model().parameters())) == \
        "Adam(lazy_mode=False)"
    finals = []
    for _ in range(3):
        net = Model()
        opt = paddle.optimizer.Adam(0.1, parameters=net.parameters())
        tables = sparse.Tables(SimpleNamespace(is_distributed=False), list(net.parameters()), net)
        for _ in range(3):
            _backward(net)
            rows = np.asarray(net.own.weight.grad.rows())
            values = net.own.weight.grad.numpy()
            tables.exchange(opt)
            grad = net.own.weight.grad
            assert not sparse.is_rows(grad) and grad.shape == [20, 3]
            expected = np.zeros((20, 3), "float32")
            np.add.at(expected, rows, values)
            assert np.array_equal(grad.numpy(), expected)
            opt.step()
            opt.clear_grad()
        finals.append(net.emb.weight.numpy())
    assert all(np.array_equal(finals[0], f) for f in finals[1:])
    _backward(net)
    assert sparse.is_rows(net.emb.weight.grad)        # the next backward gives rows again


def _two_ranks(monkeypatch, peer_lists):
    """Stand-ins for the collectives: rank 1 sends what rank 0 sends (peer_lists: the
    all_gather_object values of rank 1)."""
    monkeypatch.setattr(sparse.dist, "all_gather", lambda out, t: out.extend([t, t.clone()]))
    monkeypatch.setattr(sparse.dist, "all_gather_object",
                        lambda out, obj: out.extend([obj, peer_lists.pop(0) if peer_lists else obj]))
    return SimpleNamespace(is_distributed=True, world_size=2)


def test_the_exchange_settles_once_and_averages_the_rows(monkeypatch):
    net = Model()
    env = _two_ranks(monkeypatch, [])
    params = list(net.parameters())
    tables = sparse.Tables(env, params, net)
    dropped = []
    _backward(net)
    expected = sparse.merged(np.asarray(net.own.weight.grad.rows()), net.own.weight.grad.numpy())
    tables.exchange(paddle.optimizer.SGD(0.1, parameters=params),
                    SimpleNamespace(drop=dropped.extend, drain=lambda: None))
    assert [p is net.own.weight for p in dropped] == [True] and tables.settled
    assert all(p is not net.own.weight and p is not net.emb.weight for p in tables.dense_of(params))
    grad = net.own.weight.grad
    assert grad.rows() == expected[0].tolist() and np.array_equal(grad.numpy(), expected[1])
    assert tables.sent_bytes > 0


def test_a_table_another_rank_found_leaves_the_dense_exchange_here_too(monkeypatch):
    net = Model()
    params = list(net.parameters())
    own = next(i for i, p in enumerate(params) if p is net.own.weight)
    tables = sparse.Tables(_two_ranks(monkeypatch, [[own]]), params, net)
    net.out(paddle.ones([1, 9])).sum().backward()        # this rank did not look the tables up
    tables.exchange(paddle.optimizer.SGD(0.1, parameters=params))
    assert any(p is net.own.weight for p in tables.rows)


def test_a_table_first_reached_as_rows_later_is_one_line(monkeypatch):
    net = Model()
    params = list(net.parameters())
    tables = sparse.Tables(_two_ranks(monkeypatch, []), params, net, name_of=lambda p: "late")
    tables.uncertain.clear()
    tables.rows = []                   # as if the first step had reached no table
    net.out(paddle.ones([1, 9])).sum().backward()
    tables.exchange(paddle.optimizer.SGD(0.1, parameters=params))
    _backward(net)
    with pytest.raises(ConfigError, match="parameter 'late' first got a gradient as rows"):
        tables.exchange(paddle.optimizer.SGD(0.1, parameters=params))


def test_a_gradient_is_scaled_in_place_rows_too():
    net = Model()
    _backward(net)
    rows, values = net.emb.weight.grad.rows(), net.emb.weight.grad.numpy()
    dense = net.out.weight.grad.numpy()
    with paddle.no_grad():                         # as weighting.py scales them
        for p in (net.emb.weight, net.out.weight):
            sparse.scale(p.grad, paddle.to_tensor(0.25, dtype="float32"))
    assert net.emb.weight.grad.rows() == rows and np.array_equal(net.emb.weight.grad.numpy(), values * 0.25)
    assert np.array_equal(net.out.weight.grad.numpy(), dense * np.float32(0.25))


def test_the_weights_check_names_a_table_and_the_optimizers_mode(monkeypatch):
    net = Model()
    params = list(net.parameters())
    names = {id(p): n for n, p in net.named_parameters()}
    tables = sparse.Tables(_two_ranks(monkeypatch, []), params, net, name_of=lambda p: names[id(p)])
    _backward(net)
    tables.exchange(paddle.optimizer.Adam(0.1, parameters=params))
    line = tables.explain("'own.weight' has 2 different values: ...")
    assert line.startswith("'own.weight' is a sparse table") and "Adam(lazy_mode=False)" in line
    assert "lazy_mode=True" in line and tables.explain("'out.weight' has 2 different values") == ""
