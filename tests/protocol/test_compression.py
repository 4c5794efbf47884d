"""Compressed bodies (metaq.protocol.compression): RocketMQ's sysFlag codecs, bounded stepwise decompression, and
the attribute helpers that take a text put's compression mark out (metaq.protocol.rocketmq.mapping)."""

import os
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings, strategies as st

from metaq.errors import BadCompressedBody
from metaq.protocol.compression import (COMPRESSION_BITS, codec_of, compress, inflate, inflate_steps, sys_flag_of)
from metaq.protocol.properties import compression_bits, encode_attribute, without_compression

CODECS = ("zlib", "zstd", "lz4")


def test_sysflag_bits_name_rocketmqs_codecs():
    assert codec_of(0) is None and codec_of(2) is None  # multi-tags alone: not compressed
    assert codec_of(1) == "zlib"  # RocketMQ 4 (and the C++ client): the flag alone means zlib
    assert [codec_of(1 | t << 8) for t in (1, 2, 3)] == ["lz4", "zstd", "zlib"]
    assert codec_of(3 << 8) is None  # a type without the compressed flag: not compressed
    for t in (4, 5, 6, 7):
        with pytest.raises(BadCompressedBody, match="type %d, which does not exist" % t):
            codec_of(1 | t << 8)
    assert [sys_flag_of(c) for c in ("lz4", "zstd", "zlib")] == [0x101, 0x201, 0x301]
    with pytest.raises(ValueError, match="unknown compression 'snappy'"):
        sys_flag_of("snappy")


def test_what_a_java_producer_sends_decompresses():
    """The formats RocketMQ's producers write: zlib's stream (java.util.zip), a zstd frame without a content size
    (ZstdOutputStream writes none), an LZ4 frame (LZ4FrameOutputStream)."""
    raw = b"order 17 created; " * 700
    assert inflate(1, zlib.compress(raw, 5), 1 << 20) == raw
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert zstandard.frame_content_size(streamed) == -1
    assert inflate(0x201, streamed, 1 << 20) == raw
    assert inflate(0x101, lz4.frame.compress(raw), 1 << 20) == raw
    assert inflate(0, raw, 10) is raw  # not compressed: as is, whatever its size


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=20000) | st.builds(lambda n, b: b * n, st.integers(1, 3000), st.binary(min_size=1,
                                                                                                     max_size=9)),
       codec=st.sampled_from(CODECS), step=st.integers(1, 5000))
def test_round_trip_in_steps_of_at_most_step_bytes(data, codec, step):
    bits, packed = compress(data, codec)
    assert bits & COMPRESSION_BITS == bits and codec_of(bits) == codec
    pieces = list(inflate_steps(bits, packed, len(data), step))
    assert b"".join(pieces) == data
    if codec != "zstd":  # zstd decompresses a frame in one step
        assert all(len(p) <= step for p in pieces)


@pytest.mark.parametrize("codec", CODECS)
def test_the_body_limit_holds_exactly_and_one_byte_past_it_is_refused(codec):
    raw = os.urandom(1000) + b"\0" * 99_000  # 100,000 bytes
    bits, packed = compress(raw, codec)
    assert inflate(bits, packed, 100_000, step=4096) == raw
    with pytest.raises(BadCompressedBody, match="decompresses past 99999 bytes"):
        inflate(bits, packed, 99_999, step=4096)


@pytest.mark.parametrize("codec", CODECS)
def test_a_zip_bomb_stops_at_the_limit(codec):
    bits, packed = compress(b"\0" * (64 << 20), codec)  # 64 MiB of zeros in a few KiB
    assert len(packed) < 300_000
    steps = inflate_steps(bits, packed, 4 << 20, 256 << 10)
    with pytest.raises(BadCompressedBody, match="past 4194304 bytes"):
        for piece in steps:
            assert len(piece) <= (4 << 20) + (256 << 10)  # never more than the limit and a step in memory
    if codec == "zstd":  # a frame announcing its size is refused before any work
        with_size = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (64 << 20))
        with pytest.raises(BadCompressedBody, match="past"):
            inflate(bits, with_size, 4 << 20)


@pytest.mark.parametrize("codec", CODECS)
def test_damaged_bodies_are_a_clear_error(codec):
    bits, packed = compress(b"abcdefgh" * 5000 + os.urandom(2000), codec)
    damaged = {"truncated": packed[:-7], "half": packed[:len(packed) // 2], "garbage": b"not a compressed body",
               "empty": b"", "flipped": packed[:20] + bytes([packed[20] ^ 0xFF]) + packed[21:]}
    if codec != "zstd":  # zstd reads its one frame and leaves what follows, as a one-frame reader does
        damaged["trailing"] = packed + b"xx"
    for name, body in damaged.items():
        try:
            out = inflate(bits, body, 1 << 20)
        except BadCompressedBody as exc:
            assert "does not decompress" in str(exc) and codec in str(exc), (name, exc)
        else:  # a flipped byte inside a literal run can still decompress: then it is not the original
            assert name == "flipped" and out != b"abcdefgh" * 5000, name


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), kind=st.sampled_from([0, 1, 2, 3]))
def test_any_bytes_either_decompress_or_raise_the_clear_error(body, kind):
    try:
        out = inflate(1 | kind << 8, body, 1 << 16, step=512)
    except BadCompressedBody:
        return
    assert isinstance(out, bytes) and len(out) <= 1 << 16


def test_a_text_puts_compression_mark_comes_out_and_the_rest_stays():
    marked = encode_attribute("Tg", {"KEYS": "k", "@SYSFLAG": "771"})  # zlib | multi-tags
    assert compression_bits(marked) == 0x301
    assert without_compression(marked) == encode_attribute("Tg", {"KEYS": "k", "@SYSFLAG": "2"})
    assert without_compression(encode_attribute("Tg", {"@SYSFLAG": "769"})) == "Tg"
    assert without_compression(encode_attribute(None, {"@SYSFLAG": "769"})) is None  # an unattributed message
    assert compression_bits("plain attribute") == 0 and compression_bits(None) == 0
    assert compression_bits(encode_attribute("", {"@SYSFLAG": "x"})) == 0  # not a number: kept as it is
    assert compression_bits("no\x02@SYSFLAG\x012\x02") == 0
