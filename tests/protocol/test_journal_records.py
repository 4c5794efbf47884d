"""A journal record's JSON (``metaq.protocol.journalrecord.encode_record`` / ``decode_record``): compact UTF-8 as orjson
writes it, what orjson will not write (a lone surrogate, an int past 64 bits) as the json module does, and both read
back. Pure, no broker."""

import json

import pytest

from metaq.protocol.journalrecord import decode_record, encode_record


def test_a_record_is_compact_utf8_and_reads_back():
    value = {"k": "s", "c": "capteur-é", "n": [1, -2, 2 ** 63 - 1], "on": True, "u": None}
    data = encode_record(value)
    assert data == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert decode_record(data) == value
    assert decode_record(memoryview(b"xx" + data)[2:]) == value  # a view of a segment's map


def test_what_orjson_will_not_write_is_written_by_the_json_module_and_reads_back():
    surrogate = {"k": "r", "g": "group-\ud800"}
    assert encode_record(surrogate) == b'{"k":"r","g":"group-\\ud800"}'
    assert decode_record(encode_record(surrogate)) == surrogate
    big = {"k": "x", "n": 2 ** 70}
    assert encode_record(big) == b'{"k":"x","n":1180591620717411303424}'


@pytest.mark.parametrize("data", [b"", b"{", b'{"k":"s"', b"\xff\xfe", b"not json"])
def test_what_is_not_json_raises_value_error(data):
    with pytest.raises(ValueError):
        decode_record(data)
