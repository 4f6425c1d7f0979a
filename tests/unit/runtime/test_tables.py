"""runtime/scripthooks/tables.py: a plain script's DataParallel whose model looks a table of
its own up with F.embedding(sparse=True) ends with one line at its backward, before Paddle's
reducer (SIGSEGV) sees the rows; other gradients are left as they are. In this process, with
the world size patched; the launcher's ranks: tests/integration/test_ctr_example.py."""

import types

import numpy as np
import paddle
import pytest

from paddle_dist.runtime.scripthooks import tables


class Own(paddle.nn.Layer):
    """A table of the user's own, an nn.Embedding(sparse=True) and a dense layer."""

    def __init__(self):
        super().__init__()
        self.table = self.create_parameter([10, 2])
        self.known = paddle.nn.Embedding(10, 2, sparse=True)
        self.head = paddle.nn.Linear(2, 1)

    def forward(self, ids, own=True):
        rows = paddle.nn.functional.embedding(ids, self.table, sparse=own)
        return self.head(rows + self.known(ids)).sum()


@pytest.fixture
def world(monkeypatch):
    def set_world(size):
        monkeypatch.setattr(tables, "dist", types.SimpleNamespace(get_world_size=lambda: size))
    return set_world


def test_a_table_of_ones_own_looked_up_as_rows_is_refused_naming_it(world):
    world(2)
    net = Own()
    handles = tables.guard(types.SimpleNamespace(), net)
    assert len(handles) == 3            # table, head.weight, head.bias: not the known table
    with pytest.raises(Exception, match=r"parameter 'table' got its gradient as rows .*nn.Embedding\(v, d, "
                                        r"sparse=True\).*paddle_dist.fit\(\)"):
        net(paddle.to_tensor(np.array([1, 3, 1]))).backward()


def test_dense_gradients_and_known_tables_pass_unchanged(world):
    world(2)
    paddle.seed(0)
    net = Own()
    ids = paddle.to_tensor(np.array([1, 3, 1]))
    net(ids, own=False).backward()
    plain = {n: np.array(p.grad.numpy()) for n, p in net.named_parameters()}
    net.clear_gradients()
    tables.guard(types.SimpleNamespace(), net)
    net(ids, own=False).backward()
    assert all(np.array_equal(plain[n], p.grad.numpy()) for n, p in net.named_parameters())


def test_one_rank_is_left_alone(world):
    world(1)
    assert tables.guard(types.SimpleNamespace(), Own()) == []
