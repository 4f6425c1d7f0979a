"""The steps' losses (trainer/ledger.py): kept unread, read at once, by epoch."""

import paddle

from paddle_dist.trainer.ledger import LossLedger


def test_losses_are_read_together_and_split_by_epoch():
    ledger = LossLedger()
    ledger.begin_epoch()
    ledger.record(paddle.to_tensor(1.0), {"loss_a": paddle.to_tensor(0.25)})
    ledger.record(2.0, {"loss_a": 0.5})
    assert len(ledger) == 2 and ledger.epoch_losses() == [1.0, 2.0]
    ledger.begin_epoch()
    ledger.record(paddle.to_tensor(3.0), {})
    assert ledger.epoch_losses() == [3.0] and ledger.losses == [1.0, 2.0, 3.0]
    assert ledger.parts_from(0) == {"loss_a": [0.25, 0.5, 0.0]} and ledger.epoch_parts() == {}
