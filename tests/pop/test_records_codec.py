"""The POP journal's records as bytes: written compact by orjson, read back by ``decode``; what orjson will not write
(a lone surrogate in a message group, an int past 64 bits) written by the json module, read back the same."""

import json

import pytest

from metaq.pop.records import MAX_RECORD_BYTES, RecordError, decode, encode


def _json(rec):
    return json.dumps(rec, separators=(",", ":")).encode()


def test_a_receive_record_is_the_compact_json_and_reads_back():
    rec = {"k": "d", "g": "pop", "t": "gq", "e": [[p, 100 + p, 1, 1764300000000, None] for p in range(4)]}
    assert encode(rec) == _json(rec)
    assert decode(encode(rec)) == rec


def test_non_ascii_is_written_as_utf8_never_longer():
    rec = {"k": "d", "g": "gr\u00fcppe", "t": "t", "e": [[0, 1, 1, 2, "\u6d88\u606f\U0001f600"]]}
    data = encode(rec)
    assert "\u6d88".encode() in data and len(data) < len(_json(rec))
    assert decode(data) == rec


@pytest.mark.parametrize("mgroup", ["a\ud800b", "\udfff"])
def test_a_lone_surrogate_is_written_by_the_json_module(mgroup):
    rec = {"k": "d", "g": "g", "t": "t", "e": [[0, 7, 1, 2, mgroup]]}
    data = encode(rec)
    assert data == _json(rec) and b"\\ud" in data
    assert decode(data) == rec


def test_an_int_past_64_bits_is_written_by_the_json_module():
    rec = {"k": "a", "g": "g", "t": "t", "e": [[0, 2 ** 64]]}
    assert encode(rec) == _json(rec)
    assert decode(encode(rec)) == rec


def test_what_is_not_a_record_is_refused_on_reading():
    with pytest.raises(RecordError, match="not a POP journal record"):
        decode(b'{"k":"z"}')
    with pytest.raises(RecordError, match="not a POP journal record"):
        decode(b"\xff{")
    assert MAX_RECORD_BYTES == 1 << 20
