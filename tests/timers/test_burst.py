"""The put_at burst scanner: the C helper equals the Python reference, frame for frame and byte for byte; what it
takes is what the general path stores (``encode_entry`` of ``parse_when``'s due time), and it stops at every frame
the general path must answer."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.limits import MAX_NAME_BYTES
from metaq.timers.limits import MAX_DELIVER_AHEAD_MS
from metaq.protocol.checksum import crc32, metaq_checksum
from metaq.timers.records import TIMER_TOPIC, TimerEntry, decode, encode_entry, owner_field, parse_when
from metaq.protocol.text import encode_result
from metaq.timers.burst import encode_timer_acks_py, scan_put_ats_py

try:
    from metaq.native._bytes import scan_put_ats as _c
except ImportError:  # not built: the Python reference is what runs
    _c = None
try:  # apart: a helper built before it existed must not skip the scan's tests too
    from metaq.native._bytes import encode_timer_acks as _acks_c
except ImportError:
    _acks_c = None

needs_c = pytest.mark.skipif(_c is None, reason="metaq.native._bytes was not built")

NOW = 1_790_000_000_000
MAX_BODY = 300
TIMER = TIMER_TOPIC.encode()


def scan_c(buf, pos, end, max_body, max_frames, now_ms, timer_topic=TIMER, entry_type=TimerEntry, owner=None):
    return _c(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, MAX_NAME_BYTES,
              MAX_DELIVER_AHEAD_MS, b"" if owner is None else owner_field(owner), owner)


#: Both definitions of the scan, called alike (the C one where it was built), as each case runs against both.
SCANS = [scan_put_ats_py] + ([pytest.param(scan_c, id="c")] if _c is not None else [])


def frame(topic=b"t", partition=0, body=b"hello", flag=b"0", checksum=None, when=b"+1000", opaque=7):
    checksum = metaq_checksum(body) if checksum is None else checksum
    return b"put_at %s %d %d %s %d %s %d\r\n%s" % (topic, partition, len(body), flag, checksum, when, opaque, body)


topics = st.one_of(st.binary(min_size=1, max_size=12).map(lambda b: bytes(0x21 + x % 94 for x in b)),
                   st.sampled_from([b"x" * MAX_NAME_BYTES, b"x" * (MAX_NAME_BYTES + 1), b"x" * 255, b"x" * 256]))
whens = st.one_of(
    st.integers(0, 10**6).map(lambda v: b"+%d" % v),
    st.integers(0, NOW * 2).map(lambda v: b"@%d" % v),
    st.sampled_from([b"+%d" % MAX_DELIVER_AHEAD_MS, b"+%d" % (MAX_DELIVER_AHEAD_MS + 1),
                     b"@%d" % (NOW + MAX_DELIVER_AHEAD_MS), b"@%d" % (NOW + MAX_DELIVER_AHEAD_MS + 1),
                     b"@" + b"9" * 19, b"+" + b"9" * 19, b"@" + b"1" * 20, b"@-5", b"+", b"5", b"@0"]))


@st.composite
def put_at_frames(draw):
    body = draw(st.binary(max_size=40))
    good = metaq_checksum(body)
    checksum = draw(st.sampled_from([good] * 6 + [-1, (good + 1) % 2**31, 2**31, -2]))
    rare = draw(st.integers(0, 5)) == 0
    partition = draw(st.sampled_from([2**31 - 1, 2**31, 10**10 - 1]) if rare else st.integers(0, 7))
    opaque = draw(st.one_of(st.integers(-5, 5), st.integers(-2**31 - 1, 2**31)))
    flag = draw(st.sampled_from([b"0"] * 8 + [b"1", b"00", b"-0"]))
    return frame(draw(topics), partition, body, flag, checksum, draw(whens), opaque)


@st.composite
def bursts(draw):
    parts = draw(st.lists(st.one_of(put_at_frames(), put_at_frames(), put_at_frames(), put_at_frames(),
                                    st.sampled_from([b"version 3\r\n", b"put t 0 1 0 -1 1\r\nX", b"\r\n",
                                                     b"put_at t 0 1 0 -1 +1 1\nX", b"put_at t 0 99 0 -1 +1 1\r\nX"])),
                          max_size=8))
    buf = b"".join(parts)
    end = draw(st.integers(0, len(buf)))
    pos = draw(st.integers(0, end)) if draw(st.booleans()) else 0
    return buf, pos, end


@pytest.mark.parametrize("scan", SCANS)
def test_a_plain_frame_is_taken_as_the_general_path_stores_it(scan):
    buf = frame(b"orders", 3, b"body!", when=b"+2500", opaque=-9) + b"version\r\n"
    items, src, nxt = scan(buf, 0, len(buf), MAX_BODY, 10, NOW, TIMER, TimerEntry)
    assert nxt == buf.index(b"version")
    ((topic, partition, opaque, end, length, burst, entry),) = items
    assert (topic, partition, opaque, end, length) == ("orders", 3, -9, nxt, 5)
    expected = encode_entry("orders", 3, 0, metaq_checksum(b"body!"), parse_when(b"+2500", NOW), NOW, b"body!")
    assert src == expected
    assert burst == (TIMER, 0, 0, -9, 0, len(expected), crc32(expected))
    assert entry == decode(expected) == TimerEntry("orders", 3, 0, metaq_checksum(b"body!"), NOW + 2500, NOW, b"body!")


@pytest.mark.parametrize("bad", [
    frame(flag=b"1"),  # an attribute: the general path's
    frame(checksum=metaq_checksum(b"hello") + 1),  # a wrong checksum: answered 4xx there
    frame(when=b"+%d" % (MAX_DELIVER_AHEAD_MS + 1)),  # too far ahead: 400 there
    frame(when=b"@%d" % (NOW + MAX_DELIVER_AHEAD_MS + 1)),
    frame(when=b"@-1"), frame(when=b"soon"),
    frame(topic=b"x" * (MAX_NAME_BYTES + 1)),
    frame(partition=2**31), frame(opaque=2**31),
    frame(body=b"x" * (MAX_BODY + 1)),
    frame()[:-1],  # the body not whole yet
])
@pytest.mark.parametrize("scan", SCANS)
def test_the_scan_stops_at_a_frame_the_general_path_answers(bad, scan):
    buf = frame(opaque=1) + bad + frame(opaque=2)
    items, _src, nxt = scan(buf, 0, len(buf), MAX_BODY, 10, NOW, TIMER, TimerEntry)
    assert [i[2] for i in items] == [1] and nxt == len(frame(opaque=1))


@pytest.mark.parametrize("scan", SCANS)
def test_at_the_limits_and_one_past(scan):
    at = frame(when=b"+%d" % MAX_DELIVER_AHEAD_MS) + frame(topic=b"x" * MAX_NAME_BYTES) + frame(body=b"x" * MAX_BODY)
    assert len(scan(at, 0, len(at), MAX_BODY, 10, NOW, TIMER, TimerEntry)[0]) == 3
    assert len(scan(at, 0, len(at), MAX_BODY, 2, NOW, TIMER, TimerEntry)[0]) == 2  # max_frames
    past = frame(when=b"@1") + frame(when=b"+0")  # a past time is now
    items = scan(past, 0, len(past), MAX_BODY, 10, NOW, TIMER, TimerEntry)[0]
    assert [i[6].due_ms for i in items] == [NOW, NOW]


@pytest.mark.parametrize("scan", SCANS)
def test_a_users_frames_are_owned_entries_as_the_general_path_stores_them(scan):
    buf = frame(b"orders", 3, b"body!", when=b"+2500") + frame(b"orders", 1, b"", when=b"+1")
    items, src, _nxt = scan(buf, 0, len(buf), MAX_BODY, 10, NOW, TIMER, TimerEntry, "alice")
    first = encode_entry("orders", 3, 0, metaq_checksum(b"body!"), NOW + 2500, NOW, b"body!", owner="alice")
    assert src.startswith(first) and items[0][5][5] == len(first) and items[0][5][6] == crc32(first)
    assert [i[6] for i in items] == [decode(first), decode(src[len(first):])]
    assert items[0][6].owner == items[1][6].owner == "alice" and items[1][6].data == b""


@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bursts(), st.integers(1, 9), st.sampled_from([None, "alice", "x" * 128, "\u00e9t\u00e9"]))
def test_the_c_twin_equals_the_reference(burst, max_frames, owner):
    buf, pos, end = burst
    items_c = scan_c(buf, pos, end, MAX_BODY, max_frames, NOW, owner=owner)
    assert items_c == scan_put_ats_py(buf, pos, end, MAX_BODY, max_frames, NOW, TIMER, TimerEntry, owner)
    for item in items_c[0]:  # built by the C without calling the class: still the class, fields and all
        assert type(item[6]) is TimerEntry and item[6].data == item[6][6] and item[6]._replace(flag=1).flag == 1
        assert hash(item[6]) == hash(TimerEntry(*item[6]))  # built as tuple.__new__ builds it (3.14's hash cache)
    mv = memoryview(bytearray(buf))  # the connection's receive buffer is a bytearray
    assert scan_c(mv, pos, end, MAX_BODY, max_frames, NOW) == \
        scan_put_ats_py(mv, pos, end, MAX_BODY, max_frames, NOW, TIMER, TimerEntry)


@needs_c
def test_the_c_twin_refuses_positions_outside_the_buffer():
    with pytest.raises(ValueError):
        scan_c(b"abc", 0, 4, MAX_BODY, 1, NOW)
    with pytest.raises(ValueError):
        scan_c(b"abc", 2, 1, MAX_BODY, 1, NOW)


class _NotATuple:
    def __init__(self, *fields):
        self.fields = fields


@pytest.mark.parametrize("scan", SCANS)
def test_an_entry_type_that_is_not_a_tuple_is_refused(scan):
    buf = frame(body=b"abc")
    with pytest.raises(TypeError):
        scan(buf, 0, len(buf), MAX_BODY, 5, NOW, TIMER, _NotATuple)


@pytest.mark.parametrize("scan", SCANS)
def test_any_tuple_type_is_made_of_the_eight_fields_as_tuple_new_makes_it(scan):
    from typing import NamedTuple

    class Three(NamedTuple):
        a: str
        b: int
        c: int

    buf = frame(body=b"abc")
    for entry_type in (Three, tuple):
        entry = scan(buf, 0, len(buf), MAX_BODY, 5, NOW, TIMER, entry_type)[0][0][6]
        assert type(entry) is entry_type
        assert tuple(entry) == ("t", 0, 0, metaq_checksum(b"abc"), NOW + 1000, NOW, b"abc", None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-2**31, 2**31 - 1)), max_size=20),
       st.integers(0, 2**62), st.data())
def test_timer_acks_are_the_general_path_replies_and_the_c_twin_equals_them(parts, first_id, data):
    items = [("t", p, o, 0, 0, None, None) for p, o in parts]
    start = data.draw(st.integers(0, len(items)))
    count = data.draw(st.integers(0, len(items) - start))
    want = b"".join(encode_result(200, b"%d %d -1" % (first_id + k, items[start + k][1]), items[start + k][2])
                    for k in range(count))
    assert encode_timer_acks_py(items, start, count, first_id) == want
    if _acks_c is not None:
        assert _acks_c(items, start, count, first_id) == want


@pytest.mark.skipif(_acks_c is None, reason="metaq.native._bytes was not built")
def test_the_acks_c_twin_refuses_a_run_outside_the_items_and_ids_past_int64():
    one = [("t", 0, 1)]
    assert _acks_c(one, 0, 1, 2**63 - 1) == encode_timer_acks_py(one, 0, 1, 2**63 - 1)  # the last int64 id
    for start, count in ((0, 2), (2, 0), (-1, 1), (2**62, 2**62), (2**63 - 2**59, 2**59 + 1), (1, 2**63 - 1)):
        with pytest.raises(IndexError):
            _acks_c(one, start, count, 5)
    with pytest.raises(OverflowError):
        _acks_c(one * 2, 0, 2, 2**63 - 1)  # the second id would be past int64
    with pytest.raises(TypeError):
        _acks_c([("t", 0)], 0, 1, 5)
    with pytest.raises(TypeError):
        _acks_c([("t", 0.5, 1)], 0, 1, 5)


class _Clears:
    """A partition whose __index__ empties the list being encoded."""

    def __init__(self, items):
        self.items = items

    def __index__(self):
        self.items.clear()
        return 0


@pytest.mark.skipif(_acks_c is None, reason="metaq.native._bytes was not built")
def test_the_acks_c_twin_takes_only_ints_so_no_python_runs_while_it_reads_the_list():
    items = [("t", 0, 1)] * 3
    items[0] = ("t", _Clears(items), 1)
    with pytest.raises(TypeError):
        _acks_c(items, 0, 3, 5)
