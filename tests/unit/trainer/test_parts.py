"""The records both trainers share (trainer/parts.py): what fit() returns."""

from paddle_dist.trainer.parts import Position, Result


def test_the_last_metrics_take_the_last_evaluation_when_the_epoch_had_none():
    result = Result(run_dir=None, history=[{"epoch": 1, "step": 15, "eval_loss": 0.5, "eval_count": 8},
                                           {"epoch": 1, "train_loss": 0.7},
                                           {"epoch": 2, "step": 30, "eval_loss": 0.4, "eval_count": 8},
                                           {"epoch": 2, "train_loss": 0.6}])
    assert result.metrics == {"epoch": 2, "train_loss": 0.6, "eval_loss": 0.4, "eval_count": 8}
    assert Result(run_dir=None).metrics == {} and Position().epoch_loss == (0.0, 0.0, {})
