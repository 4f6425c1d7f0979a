"""VisualDL scalars: a resumed run keeps one log file (VisualDL shows only the newest)."""

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
