"""The put-burst scanner: the C helper equals the Python reference, and both agree with TextParser."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.protocol import events as ev
from metaq.protocol.burst import scan_puts_py
from metaq.protocol.checksum import metaq_checksum
from metaq.idempotence.records import has_identity
from metaq.protocol.message import decode_payload, encode_payload
from metaq.store.record import tag_hash
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.native import both

try:
    from metaq.native._bytes import scan_puts as scan_puts_c
except ImportError:  # not built: the Python reference is what runs
    scan_puts_c = None

needs_c = pytest.mark.skipif(scan_puts_c is None, reason="metaq.native._bytes was not built")
#: Both definitions of the scan: each case below runs against both.
SCANS = both(scan_puts_py, "scan_puts")

MAX_BODY, MAX_LINE = 300, 120

topics = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)
int32 = st.integers(-2**31, 2**31 - 1)


@st.composite
def put_frames(draw):
    """One put frame: mostly plain ones, some with a wrong checksum, flag bit 0, -1 partition or big numbers."""
    body = draw(st.binary(max_size=40))
    flag = draw(st.one_of(st.just(0), st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):  # a well-formed attribute block (now and then with put_idem's reserved property)
        attr_flag, body = encode_payload(body, draw(st.one_of(st.text(max_size=12), st.just("t\x02METAQ_SEQ\x011"),
                                                              st.just("t\x02@SYSFLAG\x01769\x02"))))
        flag = (flag & ~1) | attr_flag
    good = metaq_checksum(body)
    checksum = draw(st.sampled_from([good, good, good, -1, (good + 1) % 2**31]))
    partition = draw(st.one_of(st.integers(0, 7), st.just(-1), st.just(2**31 - 1)))
    opaque = draw(st.one_of(st.integers(-5, 5), int32))
    frame = serialize(ev.Put(draw(topics), partition, flag, body, opaque, checksum))
    if draw(st.integers(0, 3)) == 0:  # MetaQ's 6-token form: no checksum token
        head, _sep, rest = frame.partition(b"\r\n")
        tokens = head.split(b" ")
        frame = b" ".join(tokens[:5] + tokens[6:]) + b"\r\n" + rest
    return frame


@st.composite
def bursts(draw):
    """Frames, sometimes with noise (other commands, garbage, a bare \\n line end) and cut at any point."""
    parts = draw(st.lists(st.one_of(put_frames(), put_frames(), put_frames(),
                                    st.sampled_from([b"version 3\r\n", b"\r\n", b"put a 0 1 0 -1 1\nX",
                                                     b"put a 0 99999999999 0 -1 1\r\n", b"put a 00 2 0 -1 -0\r\nab",
                                                     b"put \xc3\xa9 0 1 0 -1 5\r\nz", b"put a 0 3 0 TX:1 5\r\nabc"]),
                                    st.binary(max_size=20)), max_size=12))
    data = b"".join(parts)
    end = draw(st.integers(0, len(data)))
    return bytearray(data), end


@needs_c
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(bursts(), st.integers(0, 6), st.sampled_from([MAX_BODY, 10, 0]), st.sampled_from([MAX_LINE, 20]),
       st.sampled_from([None, None, 0, 1, 2]))
def test_c_scanner_equals_the_python_reference(burst, start, max_body, max_line, cap):
    buf, end = burst
    pos = min(start, end)
    if cap is None:
        assert scan_puts_c(buf, pos, end, max_body, max_line) == scan_puts_py(buf, pos, end, max_body, max_line)
    else:
        got = scan_puts_c(buf, pos, end, max_body, max_line, cap)
        assert got == scan_puts_py(buf, pos, end, max_body, max_line, cap) and len(got[0]) <= cap


@needs_c
def test_c_scanner_refuses_positions_outside_the_buffer():
    with pytest.raises(ValueError):
        scan_puts_c(b"put", 0, 10, 1, 1)
    with pytest.raises(ValueError):
        scan_puts_c(b"put", 2, 1, 1, 1)


@pytest.mark.parametrize("scan", SCANS)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(burst=bursts())
def test_taken_frames_are_what_the_parser_reads(scan, burst):
    """Every frame the scanner takes is a Put the general parser reads identically (the same bytes consumed)."""
    buf, end = burst
    frames, stop = scan(buf, 0, end, MAX_BODY, MAX_LINE)
    parser = TextParser(max_line=MAX_LINE, max_body=MAX_BODY)
    if stop:
        parser.receive_data(bytes(buf[:stop]))  # (b"" would mean end of stream)
    for frame in frames:
        topic, partition, flag, opaque, start, length, crc = frame[:7]
        e = parser.next_event()
        assert type(e) is ev.Put and e.tx_key is None
        assert (e.topic, e.partition, e.flag, e.opaque, e.body) == (
            topic.decode(), partition, flag, opaque, bytes(buf[start:start + length]))
        assert e.checksum in (-1, crc & 0x7FFFFFFF) and crc & 0x7FFFFFFF == metaq_checksum(e.body)
        assert e.partition >= 0
        if flag & 1:  # an attribute the general path takes too, and its index unit's tag hash
            attribute, _payload = decode_payload(flag, e.body)
            assert len(frame) == 8 and frame[7] == tag_hash(flag, e.body) and not has_identity(attribute)
        else:
            assert len(frame) == 7
    assert parser.next_event() is NEED_DATA and not parser.in_frame


@pytest.mark.parametrize("scan", SCANS)
def test_attribute_puts_the_general_path_refuses_or_decompresses_are_left_to_it(scan):
    good = serialize(ev.Put("t", 1, 0, b"abc", 1, metaq_checksum(b"abc")))
    for data in (b"\x00\x00\x00\x09ab", b"\x00\x00", encode_payload(b"x", "a\x02METAQ_PID\x019\x02")[1],
                 encode_payload(b"x", "a\x02@SYSFLAG\x01769\x02")[1],  # a compressed body (zlib)
                 encode_payload(b"x", "\x02K\x01v\x02@SYSFLAG\x012\x02")[1]):  # any @SYSFLAG
        buf = bytearray(good + serialize(ev.Put("t", 1, 1, data, 2, metaq_checksum(data))) + good)
        frames, stop = scan(buf, 0, len(buf), MAX_BODY, MAX_LINE)
        assert len(frames) == 1 and stop == len(good)


@pytest.mark.parametrize("scan", SCANS)
def test_six_token_puts_are_taken_unchecked_and_a_seven_token_line_is_never_read_as_six(scan):
    buf = bytearray(b"put t 1 3 0 7\r\nabcput t 1 3 0 -1\r\nabcput t 1 3 0 -1 -8\r\nabcput t 1 3 0 5 -8\r\nabc")
    frames, stop = scan(buf, 0, len(buf), MAX_BODY, MAX_LINE)
    # opaques 7 and -1 (6 tokens), -8 (checksum -1); the last has a wrong checksum (5): not taken
    assert [(f[3], f[5]) for f in frames] == [(7, 3), (-1, 3), (-8, 3)]
    assert stop == buf.index(b"put t 1 3 0 5 -8")


@pytest.mark.parametrize("scan", SCANS)
def test_scan_stops_at_the_first_frame_it_does_not_take(scan):
    good = [serialize(ev.Put("t", 1, 0, b"abc", i, metaq_checksum(b"abc"))) for i in range(3)]
    bad_crc = serialize(ev.Put("t", 1, 0, b"abc", 9, 12345))
    buf = bytearray(good[0] + good[1] + bad_crc + good[2])
    frames, stop = scan(buf, 0, len(buf), MAX_BODY, MAX_LINE)
    assert [f[3] for f in frames] == [0, 1] and stop == len(good[0] + good[1])
    assert frames[0][0] is frames[1][0]  # one topic object per run of the same topic
    # a body not yet whole: the frame is left for later
    frames, stop = scan(buf, 0, len(good[0]) - 1, MAX_BODY, MAX_LINE)
    assert frames == [] and stop == 0
