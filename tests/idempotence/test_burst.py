"""The put_idem burst scanner: the C helper equals the Python reference; what it takes is what the general path
would store (``with_identity``), and it leaves every frame the general path must answer."""

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.idempotence.burst import scan_idem_burst_py
from metaq.idempotence.records import MAX_PID, with_identity
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from metaq.store.record import tag_hash

try:
    from metaq.native._bytes import scan_idem_burst as scan_idem_burst_c
except ImportError:  # not built: the Python reference is what runs
    scan_idem_burst_c = None

needs_c = pytest.mark.skipif(scan_idem_burst_c is None, reason="metaq.native._bytes was not built")

MAX_BODY, MAX_LINE = 300, 160

topics = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
int32 = st.integers(-2**31, 2**31 - 1)
attributes = st.one_of(st.none(), st.just(""), st.text(max_size=20), st.sampled_from(
    ["color=red", "tags\x02k\x01v\x02", "tags\x02k\x01v", "\x02", "x\x02METAQ_PID\x011\x02", "\x02METAQ_SEQ\x010\x02",
     "x\x02@SYSFLAG\x01769\x02"]))


@st.composite
def idem_frames(draw):
    """One put_idem frame: mostly good ones, some with a wrong checksum, a malformed attribute block, numbers out
    of range, a reserved property in the attribute."""
    body = draw(st.binary(max_size=40))
    flag, data = encode_payload(body, draw(attributes))
    flag |= draw(st.sampled_from([0, 0, 4, 2**30]))
    if draw(st.integers(0, 19)) == 0:
        flag = draw(int32)
    if draw(st.integers(0, 19)) == 0:
        data = draw(st.sampled_from([b"\x00\x00\x00\x09ab", b"\xff\xff\xff\xffab", b"\x00\x00", b""]))
        flag |= 1
    good = metaq_checksum(data)
    checksum = draw(st.sampled_from([good] * 6 + [-1, (good + 1) % 2**31]))
    rare = draw(st.integers(0, 5)) == 0  # now and then a number at or past the edge of its range
    partition = draw(st.sampled_from([2**31 - 1, 2**31]) if rare else st.integers(0, 7))
    pid = draw(st.sampled_from([MAX_PID, 0, MAX_PID + 1, 10**19 - 1]) if rare else st.integers(1, 5))
    seq = draw(st.sampled_from([MAX_PID, MAX_PID + 1]) if rare else st.integers(0, 3))
    opaque = draw(st.one_of(st.integers(-5, 5), int32))
    return serialize(IdempotentPut(draw(topics), partition, flag, data, opaque, checksum, pid, seq))


@st.composite
def bursts(draw):
    """Frames, sometimes with noise (other commands, garbage, a bare \\n line end) and cut at any point."""
    parts = draw(st.lists(st.one_of(idem_frames(), idem_frames(), idem_frames(), idem_frames(), idem_frames(),
                                    st.sampled_from([b"version 3\r\n", b"\r\n", b"put_idem a 0 1 0 -1 1 0 1\nX",
                                                     b"put_idem a 0 1 -0 -1 01 00 -0\r\nX",
                                                     b"put_idem a 0 1 0 -10 1 0 1\r\nX",
                                                     b"put_idem a 0 1 0 -1 1 0 123456789012\r\nX",
                                                     b"put a 0 1 0 -1 1\r\nX",
                                                     b"put_idem \xc3\xa9 0 1 0 -1 1 1 5\r\nz"]),
                                    st.binary(max_size=20)), max_size=10))
    data = b"".join(parts)
    end = len(data) if draw(st.booleans()) else draw(st.integers(0, len(data)))
    return bytearray(data), end


@needs_c
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(bursts(), st.sampled_from([0, 0, 0, 1, 6]), st.sampled_from([MAX_BODY, MAX_BODY, 10, 0]),
       st.sampled_from([MAX_LINE, MAX_LINE, 40]), st.sampled_from([None, None, 0, 1, 2]))
def test_c_scanner_equals_the_python_reference(burst, start, max_body, max_line, cap):
    buf, end = burst
    pos = min(start, end)
    if cap is None:
        assert (scan_idem_burst_c(buf, pos, end, max_body, max_line)
                == scan_idem_burst_py(buf, pos, end, max_body, max_line))
    else:
        got = scan_idem_burst_c(buf, pos, end, max_body, max_line, cap)
        assert got == scan_idem_burst_py(buf, pos, end, max_body, max_line, cap) and len(got[0]) <= cap


@needs_c
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(bursts(), st.sampled_from([b"alice", b"a" * 128, b"x.y@z-1"]), st.sampled_from([1, 2, 1000]))
def test_c_scanner_writes_the_owner_as_the_python_reference(burst, owner, cap):
    """With an owner (the connection's user) both write it after the identity (records.with_identity)."""
    buf, end = burst
    got = scan_idem_burst_c(buf, 0, end, MAX_BODY, MAX_LINE, cap, owner)
    assert got == scan_idem_burst_py(buf, 0, end, MAX_BODY, MAX_LINE, cap, owner)
    for f in got[0]:
        assert b"\x02METAQ_OWNER\x01" + owner + b"\x02" in got[1][f[4]:f[4] + f[5]]


@needs_c
def test_c_scanner_refuses_an_owner_past_its_bound():
    with pytest.raises(ValueError):
        scan_idem_burst_c(b"", 0, 0, 1, 1, 1, b"a" * 257)


@needs_c
def test_c_scanner_refuses_positions_outside_the_buffer():
    with pytest.raises(ValueError):
        scan_idem_burst_c(b"put_idem", 0, 10, 1, 1)
    with pytest.raises(ValueError):
        scan_idem_burst_c(b"put_idem", 2, 1, 1, 1)


def _scanners():
    return [scan_idem_burst_py] + ([scan_idem_burst_c] if scan_idem_burst_c else [])


@pytest.mark.parametrize("scan", _scanners())
def test_each_frame_taken_holds_what_the_general_path_would_store(scan):
    puts = [("t", 0, b"plain", None, 1, 0), ("t", 0, b"tagged", "color=red", 1, 1),
            ("t", 1, b"props", "tags\x02k\x01v\x02", 2, 0), ("u", 3, b"", "", MAX_PID, MAX_PID)]
    frames_in = []
    for i, (topic, partition, body, attribute, pid, seq) in enumerate(puts):
        flag, data = encode_payload(body, attribute)
        flag |= 4 * (i % 2)
        frames_in.append((topic, partition, flag, data, pid, seq))
    buf = b"".join(serialize(IdempotentPut(t, p, f, d, 100 + i, metaq_checksum(d), pid, seq))
                   for i, (t, p, f, d, pid, seq) in enumerate(frames_in))
    frames, data, stop = scan(buf, 0, len(buf), MAX_BODY, MAX_LINE)
    assert stop == len(buf) and len(frames) == len(puts)
    end = 0
    for (topic, partition, flag, put_data, pid, seq), f in zip(frames_in, frames, strict=True):
        stored_flag, stored = with_identity(flag, put_data, pid, seq)
        t, p, fl, opaque, start, n, crc, tag, fpid, fseq, put_len, frame_end = f
        assert (t, p, fl, fpid, fseq, put_len) == (topic.encode(), partition, stored_flag, pid, seq, len(put_data))
        assert data[start:start + n] == stored and crc & 0x7FFFFFFF == metaq_checksum(stored)
        assert tag == tag_hash(stored_flag, stored)
        assert frame_end > end and buf[frame_end - len(put_data):frame_end] == put_data
        end = frame_end
    assert [f[3] for f in frames] == [100, 101, 102, 103]


@pytest.mark.parametrize("scan", _scanners())
@pytest.mark.parametrize("bad", [
    (1, b"\x00\x00\x00\x09ab"),  # the attribute block runs past the data
    (1, b"\x00\x00"),  # shorter than the block's length field
    (1, encode_payload(b"x", "a\x02METAQ_PID\x019\x02")[1]),  # the broker's own property
    (1, encode_payload(b"x", "a\x02METAQ_SEQ\x019\x02")[1]),
    (1, encode_payload(b"x", "a\x02@SYSFLAG\x01769\x02")[1]),  # a compressed body: the general path inflates it
])
def test_a_frame_the_general_path_refuses_stops_the_scan_there(scan, bad):
    flag, data = bad
    good = serialize(IdempotentPut("t", 0, 0, b"ok", 1, metaq_checksum(b"ok"), 5, 0))
    buf = good + serialize(IdempotentPut("t", 0, flag, data, 2, metaq_checksum(data), 5, 1)) + good
    frames, _data, stop = scan(buf, 0, len(buf), MAX_BODY, MAX_LINE)
    assert len(frames) == 1 and stop == len(good)  # the parser answers the bad one, with its reason


_ATOMS = st.sampled_from([b"\x02", b"\x01", b"METAQ_PID", b"METAQ_SEQ", b"@FLAG", b"@SYSFLAG", b"\x00", b"\xff",
                          b"\xc3", b"a",
                          b"\x02METAQ_PI", b"D\x01"])


@st.composite
def raw_idem_frames(draw):
    """A put_idem frame built from bytes: attribute blocks of separators, reserved names cut anywhere and
    non-UTF-8 bytes; block lengths at the int32 edges; numbers with leading zeros, at and past 2^63 and 2^64."""
    attr, payload = b"".join(draw(st.lists(_ATOMS, max_size=6))), draw(st.binary(max_size=30))
    alen = len(attr)
    if draw(st.integers(0, 5)) == 0:
        alen = draw(st.sampled_from([-1, -2**31, 2**31 - 1, alen + 1, alen + len(payload) + 1]))
    body = struct.pack(">i", alen) + attr + payload if draw(st.integers(0, 6)) else draw(st.binary(max_size=3))
    flag = draw(st.sampled_from([0, 1, 3, 5, -1, -2, -2**31, 2**31 - 1, 2**31 - 2, 1 << 30 | 1]))
    good = metaq_checksum(body)
    checksum = draw(st.sampled_from([b"%d" % good, b"%d" % good, b"-1", b"%d" % (good ^ 1)]))
    pid = draw(st.sampled_from([b"1", b"0", b"9223372036854775807", b"9223372036854775808", b"0000000000000000007",
                                b"18446744073709551615", b"99999999999999999999"]))
    seq = draw(st.sampled_from([b"0", b"9223372036854775807", b"9223372036854775808", b"00", b"5"]))
    opaque = draw(st.sampled_from([b"0", b"-2147483648", b"2147483647", b"2147483648", b"-0", b"12345678901"]))
    length = max(0, len(body) + draw(st.sampled_from([0, 0, 0, 0, 1, -1])))
    topic = draw(st.sampled_from([b"t", b"u", b"t", b"x" * 40]))
    return b"put_idem %s %d %d %d %s %s %s %s\r\n" % (topic, draw(st.integers(0, 3)), length, flag, checksum, pid,
                                                      seq, opaque) + body


@needs_c
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(raw_idem_frames(), max_size=8), st.integers(0, 400), st.sampled_from([10**6, 40, 4, 0]),
       st.sampled_from([1024, 60]), st.sampled_from([1, 1, 40]))
def test_c_scanner_equals_the_python_reference_on_raw_bytes(frames, cut, max_body, max_line, repeat):
    """``repeat``: the frames 40 times over, past the C helper's first output buffer (4 KiB)."""
    buf = b"".join(frames) * repeat
    end = len(buf) if cut > 300 else min(cut * repeat, len(buf))
    assert scan_idem_burst_c(buf, 0, end, max_body, max_line) == scan_idem_burst_py(buf, 0, end, max_body, max_line)
