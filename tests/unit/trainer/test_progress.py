"""VisualDL scalars: a resumed run keeps one log file (VisualDL shows only the newest)."""

import paddle
from visualdl import LogReader

from paddle_dist.trainer.progress import _visualdl_writer


def test_a_resumed_run_appends_to_its_visualdl_file(tmp_path, capsys):
    for step in (1, 2):                       # the first run, then its resume
        writer = _visualdl_writer(tmp_path)
        writer.add_scalar(tag="train/loss", value=float(step), step=step)
        writer.close()
    files = list((tmp_path / "vdl").glob("vdlrecords.*"))
    assert len(files) == 1
    points = LogReader(file_path=str(files[0])).get_data("scalar", "train/loss")
    assert [(p.id, p.value) for p in points] == [(1, 1.0), (2, 2.0)]
    assert "add logs to it" not in capsys.readouterr().out     # VisualDL's notice is kept quiet


def test_tokens_per_s_is_the_losss_count_over_all_ranks_per_second_beside_samples_per_s(tmp_path, caplog):
    import logging

    from paddle_dist.runtime.env import DistEnv
    from paddle_dist.trainer.ledger import LossLedger
    from paddle_dist.trainer.progress import Progress

    ledger = LossLedger()
    progress = Progress(DistEnv(), None, steps_per_epoch=4, epochs=1, batch_size=8, log_every=2, ledger=ledger)
    progress.epoch_begin(0)
    with caplog.at_level(logging.INFO, logger="paddle_dist"):
        for step in range(4):
            ledger.record(1.0, {}, paddle.to_tensor(100 + step))   # each step's count over all ranks
            progress.step(0.1)
    lines = [r.getMessage() for r in caplog.records if "samples/s" in r.getMessage()]
    assert len(lines) == 2 and all("tokens/s eta" in line for line in lines)
    assert progress.counted == 406 and progress.tokens_per_s == 406 / progress.train_time

    plain = Progress(DistEnv(), None, steps_per_epoch=2, epochs=1, batch_size=8, log_every=2, ledger=LossLedger())
    plain.epoch_begin(0)
    plain.ledger.record(1.0, {})
    plain.step(0.1)
    plain.ledger.record(1.0, {})
    plain.step(0.1)
    assert plain.tokens_per_s is None            # a loss without a count: no tokens/s



def test_tokens_per_s_counts_the_steps_after_the_last_line_when_max_steps_ends_the_run_mid_epoch():
    """train.max_steps=5 in an epoch of 10 steps, a line every 2: the last line covers 4
    steps, metrics.json's tokens/s (the run's Result) covers all 5, over the time of all 5."""
    from paddle_dist.runtime.env import DistEnv
    from paddle_dist.trainer.ledger import LossLedger
    from paddle_dist.trainer.progress import Progress

    ledger = LossLedger()
    progress = Progress(DistEnv(), None, steps_per_epoch=10, epochs=1, batch_size=8, log_every=2,
                        total_steps=5, by_steps=True, ledger=ledger)
    progress.epoch_begin(0)
    for step in range(5):
        ledger.record(1.0, {}, paddle.to_tensor(100 * (step + 1)))
        progress.step(0.1)
    assert progress._counted_steps == 4            # the last line, after step 4, counted 1,000
    assert progress.tokens_per_s == 1500 / progress.train_time
    assert progress.counted == 1500 and progress.samples_per_s == 5 * 8 / progress.train_time
