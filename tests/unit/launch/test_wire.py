"""Unit tests for paddle_dist.launch.wire: the machines' meeting's frames, cut from a stream in any
pieces, and what is refused."""

import struct

import pytest

from paddle_dist.launch import rendezvous


# ---------------------------------------------------------------- frames
def test_frames_are_cut_from_a_stream_in_any_pieces():
    data = rendezvous.encode({"a": 1}) + rendezvous.encode({"b": [2]})
    frames = rendezvous.Frames()
    got = [m for byte in data for m in frames.feed(bytes([byte]))]
    assert got == [{"a": 1}, {"b": [2]}]


@pytest.mark.parametrize("data", [struct.pack(">I", rendezvous.MAX_FRAME + 1),
                                  b"GET / HTTP/1.1\r\n",
                                  struct.pack(">I", 3) + b"\xff\xfe[",
                                  struct.pack(">I", 2) + b"[]"])
def test_anything_but_a_small_json_object_is_refused(data):
    with pytest.raises(rendezvous.ProtocolError):
        rendezvous.Frames().feed(data)
