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


# ---------------------------------------------------------------- another job's machine
def test_another_jobs_config_is_named_by_its_first_differing_key():
    from paddle_dist.config import config_hash, key_digests, load
    from paddle_dist.launch import wire

    def place(*overrides):
        cfg = load(None, list(overrides)).to_dict()
        return rendezvous.MeetingPlace("10.0.0.1:6170", 2, 1, 1, 1, config=config_hash(cfg),
                                       config_keys=key_digests(cfg))

    mine, theirs = place(), place("model.name=mlp")
    assert wire.other_job(mine, mine.config, wire.packed_keys(mine)) == ""
    assert wire.other_job(place("dist.nprocs=3", "train.epochs=9"), mine.config, "") == ""  # a resume may change these
    assert wire.other_job(rendezvous.MeetingPlace("10.0.0.1:6170", 2, 1, 1, 1), theirs.config, "") == ""
    assert wire.other_job(mine, theirs.config, wire.packed_keys(theirs)) == (
        "its config is not node 0's: model.name differs; give every machine the same -c and -o")
    assert "names other keys (another paddle_dist version?)" in wire.other_job(mine, theirs.config, "abc")
    assert "names other keys" in wire.other_job(mine, theirs.config, None)
