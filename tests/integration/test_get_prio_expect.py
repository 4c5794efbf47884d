"""A ``get_prio``'s expects (priorities/wire.py, README "Priorities"): the record each level read last, checked by
the broker before it reads, as a get's ``expect`` is (tests/integration/test_get_expect.py).

The failover side (a priority consumer reading a level a failover rewrote) is tests/failover/test_prio_divergence.py;
here one broker: matching expects read as a plain ``get_prio``, a differing one is a 412 naming its level that
changes nothing, an offset the broker does not hold is not checked, a long poll checks again when data comes, and
a bad token is a 400 line.
"""

import threading
import time

from metaq.client.local import small_config
from metaq.priorities.wire import PriorityGet, PriorityPut, decode_get_prio_body
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload, iter_records
from metaq.protocol.text import serialize
from tests.client.test_priorities import create
from tests.harness.broker import wait_for

TOPIC = "t-pexp"


def three_levels(c):
    """Three messages at each of 3 levels; ``[[ids of level k]]``."""
    create(c, TOPIC, partitions=1, priorities=3)
    ids = [[], [], []]
    for i in range(3):
        for k in range(3):
            r = c.put_prio(TOPIC, b"m%d-p%d" % (i, k), k, partition=0)
            assert r.code == 200, r
            ids[k].append(int(r.body.split()[0]))
    return ids


def test_matching_expects_read_as_a_plain_get_prio(broker):
    with broker.client() as c:
        ids = three_levels(c)
        level, records = c.get_prio(TOPIC, 0, [1, 1, 1], expects=[(0, ids[0][0]), (0, ids[1][0]), None])
        assert level == 2 and [r.data for r in records] == [b"m1-p2", b"m2-p2"]
        r = c.get_prio(TOPIC, 0, [3, 3, 3], expects=[(2, ids[0][2]), (2, ids[1][2]), (2, ids[2][2])])
        assert isinstance(r, ev.Result) and r.code == 404, r  # at every end: the usual 404


def test_a_differing_expect_is_a_412_naming_its_level_and_nothing_changes(broker):
    with broker.client() as c:
        ids = three_levels(c)
        r = c.get_prio(TOPIC, 0, [0, 2, 1], expects=[None, (1, ids[1][1] + 1), (0, ids[2][0])])
        assert isinstance(r, ev.Result) and r.code == 412, r
        text = r.body.decode()
        assert text.startswith("1 diverged: %s%%P1-0 offset 1 holds message %d here, not %d"
                               % (TOPIC, ids[1][1], ids[1][1] + 1)), text
        # nothing was read or moved: every level still holds its records, in order
        for k, name in enumerate((TOPIC, TOPIC + "%P1", TOPIC + "%P2")):
            assert [rec.data for rec in c.get_records(name, 0, 0)] == [b"m%d-p%d" % (i, k) for i in range(3)]
        assert c.stats_dict()["total_messages"] == "9"


def test_an_offset_the_broker_does_not_hold_is_not_checked(broker):
    with broker.client() as c:
        three_levels(c)
        level, records = c.get_prio(TOPIC, 0, [0, 0, 2], expects=[(40, 1), None, (99, 12345)])
        assert level == 2 and [r.data for r in records] == [b"m2-p2"]  # past the end (a slave behind): not compared


def test_a_long_poll_checks_again_when_data_comes(broker):
    with broker.client() as c, broker.client() as p:
        ids = three_levels(c)
        replies = []
        # parked at every end, level 1 expecting a record at 3 this broker has not got yet: not checked then
        expects = [(2, ids[0][2]), (3, ids[1][2] + 7), (2, ids[2][2])]
        t = threading.Thread(target=lambda: replies.append(c.get_prio(TOPIC, 0, [3, 3, 3], max_wait_ms=30_000,
                                                                      expects=expects)))
        t.start()
        wait_for(lambda: p.stats_dict()["parked_gets"] == "1", 30, "the get_prio parked")
        assert p.put_prio(TOPIC, b"late", 1, partition=0).code == 200  # level 1's offset 3, another id: 412
        assert p.put_prio(TOPIC, b"later", 1, partition=0).code == 200
        t.join(60)
        assert replies and isinstance(replies[0], ev.Result) and replies[0].code == 412, replies
        assert replies[0].body.startswith(b"1 diverged: ")


def test_a_bad_expects_token_is_a_clear_400_and_the_connection_goes_on(broker):
    with broker.client() as c:
        three_levels(c)
        for token, why in ((b"1:5,-", b"give one expect per offset (3), got 2"),
                           (b"1-5,-,-", b"invalid expect '1-5'"),
                           (b"x:5,-,-", b"invalid expect offset 'x': not an integer")):
            c.send(b"get_prio " + TOPIC.encode() + b" g 0 0,0,0 1000 0 " + token + b" 9\r\n")
            r = c.read_event()
            assert isinstance(r, ev.Result) and r.code == 400 and why in r.body, (token, r)
        level, records = c.get_prio(TOPIC, 0, [0, 0, 0])
        assert level == 2 and len(records) == 3


def test_a_parked_get_prio_sees_a_put_prio_of_the_same_burst(broker_factory, tmp_path):
    """A level's put made visible after the ``get_prio`` missed but before its wait began (the next frame of the
    same burst, ``flush: async``) is answered at once, not at the end of the wait: the wait is skipped when any
    level's end moved since the read, not only the topic's own."""
    b = broker_factory(small_config(tmp_path / "b", store={"flush": "async"}))
    with b.client() as c:
        create(c, TOPIC, partitions=1, priorities=2)
        flag, data = encode_payload(b"urgent", None)
        started = time.monotonic()
        c.send(serialize(PriorityGet(TOPIC, "g", 0, (0, 0), 65536, 7, 30000, None))
               + serialize(PriorityPut(TOPIC, 0, flag, data, 8, metaq_checksum(data), 1)))
        replies = {r.opaque: r for r in (c.read_event(), c.read_event())}
        assert time.monotonic() - started < 15  # not the 30 s wait
        assert replies[8].code == 200
        assert isinstance(replies[7], ev.Value), replies[7]
        level, records = decode_get_prio_body(replies[7].body)
        assert level == 1 and [rec.data for rec, _end in iter_records(records)] == [b"urgent"]
