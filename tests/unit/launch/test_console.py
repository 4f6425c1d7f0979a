"""Unit tests for paddle_dist.launch.console: what of the ranks' output reaches the terminal."""

from paddle_dist.launch.console import Console


def test_the_console_drops_paddles_banner_and_info_lines(capfd):
    console = Console(filtered=True)
    for chunk in [b"step 1\n=========== Modified FLAGS detected ====\nFLAGS(name='FLAGS_x', ",
                  b"current_value=True, default_value=False)\n=====\nI1125 05:44:38.1 tcp_store.cc] x\n",
                  b"W1125 05:44:41.4 backward.cc:697] While running Node raises gloo::IoException\n",
                  b"last"]:
        console.write(chunk)
    console.close()
    assert capfd.readouterr().out == ("step 1\nW1125 05:44:41.4 backward.cc:697] While running Node "
                                      "raises gloo::IoException\nlast")
    console.mute()                        # after Ctrl+C: nothing
    console.write(b"Traceback (most recent call last):\n")
    assert capfd.readouterr().out == ""
