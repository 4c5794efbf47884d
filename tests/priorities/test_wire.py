"""Consumer priorities, sans-IO (priorities/wire.py): level names, put_prio/get_prio lines, the reply body and
the broker's choice of a level (times passed in)."""

import pytest

from metaq.priorities import limits as priorities_limits
from metaq.errors import RemoteProtocolError
from metaq.priorities.wire import (PriorityGet, PriorityPut, choose_level, decode_get_prio_body,
                                   encode_get_prio_prefix, is_level_topic, level_topic, split_level,
                                   with_owner_keys)
from metaq.protocol.text import TextParser, serialize


def parse(data):
    p = TextParser()
    p.receive_data(data)
    return p.next_event()


def test_level_names():
    assert level_topic("jobs", 0) == "jobs" and level_topic("jobs", 3) == "jobs%P3"
    assert split_level("jobs%P3") == ("jobs", 3) and split_level("a%P1%P2") == ("a%P1", 2)
    for name in ("jobs", "jobs%P0", "jobs%P", "%P1", "jobs%P100", "jobs%Px"):
        assert split_level(name) is None and not is_level_topic(name), name
    assert is_level_topic("jobs%P7") and is_level_topic(b"jobs%P7") and not is_level_topic(b"jobs")
    assert sorted(with_owner_keys([("jobs%P2", 1), ("other", 0)])) == [("jobs", 1), ("jobs%P2", 1), ("other", 0)]


def test_put_prio_and_get_prio_round_trip():
    put = PriorityPut("jobs", 2, 5, b"body", 9, 123, 2)
    assert serialize(put) == b"put_prio jobs 2 4 5 123 2 9\r\nbody"
    assert parse(serialize(put)) == put
    for wait in (None, 500):
        get = PriorityGet("jobs", "grp", 1, (0, 17, 3), 4096, 11, wait)
        assert parse(serialize(get)) == get
    assert serialize(PriorityGet("t", "g", 0, (1, 2), 10, 5, 7)) == b"get_prio t g 0 1,2 10 7 5\r\n"


def test_get_prio_expects_round_trip_one_per_level():
    get = PriorityGet("jobs", "grp", 1, (0, 17, 3), 4096, 11, 500, (None, (16, -5), (2, 1 << 62)))
    assert serialize(get) == b"get_prio jobs grp 1 0,17,3 4096 500 -,16:-5,2:4611686018427387904 11\r\n"
    assert parse(serialize(get)) == get
    # no long poll: the expects need the maxWaitMs token before them, written 0 (no wait, as a missing one)
    line = serialize(PriorityGet("t", "g", 0, (1, 2), 10, 5, None, ((0, 9), None)))
    assert line == b"get_prio t g 0 1,2 10 0 0:9,- 5\r\n" and parse(line).expects == ((0, 9), None)
    with pytest.raises(ValueError, match="one expect per offset"):
        serialize(PriorityGet("t", "g", 0, (1, 2), 10, 5, None, ((0, 9),)))


@pytest.mark.parametrize("line, why", [
    (b"get_prio t g 0 0,x 100 5\r\n", "not an integer"),
    (b"get_prio t g 0 0,,1 100 5\r\n", "not an integer"),
    (b"get_prio t g 0 0,-1 100 5\r\n", "must be 0.."),
    (b"get_prio t g -1 0,0 100 5\r\n", "partition"),
    (b"get_prio t g 0 0,0 5\r\n", "7 to 9 tokens"),
    (b"get_prio t g 0 0,0 100 0 3:4 5\r\n", "one expect per offset \\(2\\), got 1"),
    (b"get_prio t g 0 0,0 100 0 3:4,-,- 5\r\n", "one expect per offset \\(2\\), got 3"),
    (b"get_prio t g 0 0,0 100 0 3-4,- 5\r\n", "invalid expect '3-4'"),
    (b"get_prio t g 0 0,0 100 0 -1:4,- 5\r\n", "expect offset"),
    (b"get_prio t g 0 0,0 100 0 3:x,- 5\r\n", "expect msgId"),
    (b"get_prio t g 0 0,0 100 0 ,- 5\r\n", "invalid expect ''"),
    (b"get_prio t g 0 " + b",".join([b"0"] * (priorities_limits.MAX_PRIORITY_LEVELS + 1)) + b" 100 5\r\n", "at most 8"),
    (b"put_prio t 0 1 0 -1 x 5\r\nb", "priority"),
])
def test_bad_lines_are_refused_with_the_reason(line, why):
    with pytest.raises(RemoteProtocolError, match=why) as info:
        parse(line)
    assert info.value.opaque == 5


def test_the_offsets_limit_and_one_past():
    most = b",".join([b"0"] * priorities_limits.MAX_PRIORITY_LEVELS)
    assert len(parse(b"get_prio t g 0 " + most + b" 100 5\r\n").offsets) == priorities_limits.MAX_PRIORITY_LEVELS
    with pytest.raises(RemoteProtocolError):
        parse(b"get_prio t g 0 " + most + b",0 100 5\r\n")


def test_the_reply_body_names_its_level():
    assert decode_get_prio_body(encode_get_prio_prefix(3) + b"records") == (3, b"records")
    for bad in (b"records", b"x\nrecords", b""):
        with pytest.raises(ValueError):
            decode_get_prio_body(bad)


def test_the_highest_level_with_a_backlog_wins_while_nothing_starves():
    assert choose_level({}, 1000, 100) is None
    assert choose_level({0: 950, 2: 990, 1: 900}, 1000, 100) == 2  # every head younger than the bound
    assert choose_level({0: 900}, 1000, 100) == 0


def test_a_starved_level_competes_by_age():
    # level 0's head waited 150 ms > 100: it goes before level 2 (not starved)
    assert choose_level({0: 850, 2: 990}, 1000, 100) == 0
    # two starved levels: the oldest head first; the bound is strict (exactly 100 is not starved)
    assert choose_level({0: 850, 1: 800, 2: 990}, 1000, 100) == 1
    assert choose_level({0: 900, 2: 990}, 1000, 100) == 2
    # equal heads: the higher level
    assert choose_level({0: 800, 1: 800}, 1000, 100) == 1


def test_a_starved_message_goes_before_every_message_stored_after_it():
    """The README's bound, checked on random backlogs: a head that waited more than the bound is never passed by
    a level whose head was stored after it."""
    import random

    rnd = random.Random(3)
    for _ in range(2000):
        now, bound = 10_000, rnd.randrange(1, 500)
        heads = {k: now - rnd.randrange(0, 1000) for k in rnd.sample(range(8), rnd.randrange(1, 9))}
        chosen = choose_level(heads, now, bound)
        for head in heads.values():
            if now - head > bound:
                assert heads[chosen] <= head, (heads, bound, chosen)
