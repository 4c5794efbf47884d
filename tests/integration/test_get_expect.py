"""A get's ``expect`` (events.Get, README "Replication"): the record read last, checked by the broker before it reads.

The failover side (a consumer reading a log a failover rewrote) is tests/failover/test_divergence.py; here one
broker: a matching expect reads as a plain get, a differing one is a clear 412 that changes nothing, an offset the
broker does not hold is not checked, a long poll checks again when data comes, and a bad token is a 400 line.
"""

import threading

from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from metaq.protocol.message import iter_records


def put_five(c, topic="t-exp"):
    return [c.put_ok(topic, b"m-%d" % k, 0)[0] for k in range(5)]


def test_a_matching_expect_reads_as_a_plain_get(broker):
    with broker.client() as c:
        ids = put_five(c)
        r = c.get("t-exp", 0, 3, expect=(2, ids[2]))
        assert isinstance(r, ev.Value)
        assert [rec.payload for rec, _ in iter_records(r.body)] == [b"m-3", b"m-4"]
        r = c.get("t-exp", 0, 5, expect=(4, ids[4]))  # at the end: the usual 404, nothing to say
        assert isinstance(r, ev.Result) and r.code == 404


def test_a_differing_expect_is_a_412_naming_both_ids_and_nothing_changes(broker):
    with broker.client() as c:
        ids = put_five(c)
        r = c.get("t-exp", 0, 3, expect=(2, ids[2] + 1))
        assert isinstance(r, ev.Result) and r.code == 412
        text = r.body.decode()
        assert "t-exp-0 offset 2 holds message %d here, not %d" % (ids[2], ids[2] + 1) in text, text
        # nothing was read or moved: every record is still there, in order
        assert [rec.payload for rec in c.get_records("t-exp", 0, 0)] == [b"m-%d" % k for k in range(5)]
        assert c.stats_dict()["total_messages"] == "5"


def test_an_offset_the_broker_does_not_hold_is_not_checked(broker):
    with broker.client() as c:
        put_five(c)
        r = c.get("t-exp", 0, 3, expect=(40, 12345))  # past the end (a slave still behind): not compared
        assert isinstance(r, ev.Value)


def test_a_long_poll_checks_again_when_data_comes(broker):
    with broker.client() as c, broker.client() as p:
        ids = put_five(c)
        replies = []
        # parked at the end (offset 5), expecting a record at 5 this broker has not got yet: not checked then
        t = threading.Thread(target=lambda: replies.append(c.get("t-exp", 0, 5, max_wait_ms=30_000,
                                                                  expect=(5, ids[4] + 7))))
        t.start()
        wait_for(lambda: p.stats_dict()["parked_gets"] == "1", 30, "the get parked")
        p.put_ok("t-exp", b"m-5", 0)  # offset 5 arrives, with another id: the parked get answers 412
        p.put_ok("t-exp", b"m-6", 0)
        t.join(60)
        assert replies and isinstance(replies[0], ev.Result) and replies[0].code == 412, replies


def test_a_bad_expect_token_is_a_clear_400_and_the_connection_goes_on(broker):
    with broker.client() as c:
        put_five(c)
        for token, why in ((b"2-5", b"invalid expect '2-5': <offset>:<msgId> of the record last read"),
                           (b"x:5", b"invalid expect offset 'x': not an integer"),
                           (b"-1:5", b"invalid expect offset '-1': must be 0.."),
                           (b"2:", b"invalid expect msgId")):
            c.send(b"get t-exp g 0 3 1000 0 " + token + b" 9\r\n")
            r = c.read_event()
            assert isinstance(r, ev.Result) and r.code == 400 and why in r.body, (token, r)
        assert [rec.payload for rec in c.get_records("t-exp", 0, 0)] == [b"m-%d" % k for k in range(5)]


def test_get_tags_passed_names_the_record_before_the_next_offset_and_a_plain_one_is_unchanged(broker):
    from metaq.filters.wire import decode_tagged_body, decode_tagged_reply, parse_tag_expression

    want = parse_tag_expression("a")
    with broker.client() as c:
        ids = [c.put_ok("t-pass", b"m-%d" % k, 0, attribute=tag)[0] for k, tag in enumerate("abbab")]

        def get_tags(offset, expect, passed):
            return c.call(ev.GetTags("t-pass", "g", 0, offset, 1 << 20, "a", c.opaque(), 0, want, expect, passed))

        r = get_tags(0, None, True)  # ":passed" alone: nothing read yet
        nxt, passed_id, records = decode_tagged_reply(r.body, True)
        assert nxt == 5 and passed_id == ids[4] and [o for o, _rec in records] == [0, 3]  # m-4 passed over
        plain = get_tags(0, (0, ids[0]), False)  # the form older clients read: no id after the next offset
        assert decode_tagged_body(plain.body) == (nxt, records)
        for k in range(3):
            c.put_ok("t-pass", b"n-%d" % k, 0, attribute="b")
        r = get_tags(5, (4, ids[4]), True)  # nothing wanted: the next offset alone, and the id before it
        assert isinstance(r, ev.Value) and len(r.body) == 16
        nxt, passed_id, records = decode_tagged_reply(r.body, True)
        assert nxt == 8 and records == [] and passed_id == c.get_records("t-pass", 0, 7)[0].msg_id
        r = get_tags(8, (4, ids[4] + 1), True)  # the expect is still checked: another id there is a 412
        assert isinstance(r, ev.Result) and r.code == 412
