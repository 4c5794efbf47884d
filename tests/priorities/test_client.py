"""A priority fetcher's divergence check without a broker (client/priorities.py): each level's records read are
named in the next ``get_prio`` (its expects); a 412 or a 301 below what a level read takes that level alone back to
the last record both logs hold; a broker older than the expects is asked without them; a reply naming no level is
refused. The failover end to end is tests/failover/test_prio_divergence.py."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.client.message import Partition
from metaq.client.priorities import PriorityFetcher
from metaq.protocol import events as ev
from metaq.protocol.message import encode_record
from metaq.priorities.wire import encode_get_prio_prefix
from tests.client.test_fetcher_slave import Log

LEVELS = 3


class Conn(Log):
    """Answers ``get_prio`` with the replies queued (the last one again when they run out) and divergence probes
    (plain gets) as ``Log`` does: the new master's level-1 ids ``ids``."""

    def __init__(self, replies, ids=None):
        super().__init__(ids or {})
        self.replies, self.sent = list(replies), []

    def request(self, request, timeout=None):
        self.sent.append(request)
        f = Future()
        f.set_result(self.replies.pop(0) if len(self.replies) > 1 else self.replies[0])
        return f


class Consumer:
    long_poll_ms, max_size, group = 0, 1 << 20, "g"

    def __init__(self, conn):
        self.conn, self.delivered, self.asked_at = conn, [], []

    def connection(self, broker_id, read=False):
        return self.conn

    def is_slave_read(self, broker_id, url):
        return False

    def process(self, sub, message, interrupt):
        self.delivered.append((message.priority, message.offset, message.body))
        return True

    def offset_at(self, topic, partition, since_ms):
        self.asked_at.append(topic)
        return 0


def value(level, records):
    """A get_prio reply of ``level`` holding ``records`` [(msg_id, body)]."""
    body = encode_get_prio_prefix(level) + b"".join(encode_record(msg_id, 0, data) for msg_id, data in records)
    return ev.Value(body, 0)


def fetcher(replies, ids=None, offsets=(0, 0, 0)):
    conn = Conn(replies, ids)
    f = PriorityFetcher(Consumer(conn), SimpleNamespace(topic="t", tags=None, sql=None, priorities=LEVELS),
                        Partition(7, 0))
    f.offsets = list(offsets)
    return f, conn


def test_the_records_each_level_read_are_the_next_get_prios_expects():
    f, conn = fetcher([value(1, [(501, b"a"), (502, b"b")]), value(2, [(900, b"c")]), ev.Result(404, b"", 0)])
    f._deliver(*f._fetch())
    assert conn.sent[0].expects is None  # nothing read yet: the line an older broker knows
    f._deliver(*f._fetch())
    assert conn.sent[1].expects == (None, (1, 502), None)
    f._fetch()
    assert conn.sent[2].expects == (None, (1, 502), (0, 900)) and f.offsets == [0, 2, 1]
    assert f.consumer.delivered == [(1, 0, b"a"), (1, 1, b"b"), (2, 0, b"c")]


def test_a_412_takes_its_level_alone_back_to_the_last_record_both_logs_hold():
    # level 1 read 0..199 on the old master; the new one holds 0..191 as read, 192.. rewritten
    ids = {o: 1000 + o for o in range(192)}
    ids.update({o: 7000 + o for o in range(192, 205)})
    f, conn = fetcher([ev.Result(412, b"1 diverged: t%P1-0 offset 199 holds message 7199 here, not 1199", 0)], ids,
                      offsets=(5, 200, 3))
    for o in range(200):
        f.reads[1].add(o, 1000 + o)
    with pytest.raises(errors.Diverged) as info:
        f._fetch()
    assert info.value.level == 1 and "level 1 diverged" in str(info.value)
    f._differs = (info.value, None)  # as _run does
    f._settle()
    assert f._differs is None and f.offsets[0] == 5 and f.offsets[2] == 3  # the other levels stay
    depth = 200 - 192
    assert 200 - 3 * depth <= f.offsets[1] <= 192  # nothing new skipped; at most 3x the depth read again
    assert f.reads[1].last() == (f.offsets[1] - 1, 1000 + f.offsets[1] - 1)
    assert {r.topic for r in conn.asked} == {"t%P1"}  # probed on the level's own name


def test_a_301_below_what_a_level_read_is_probed_not_followed():
    ids = {o: 1000 + o for o in range(10)}
    ids[10] = 7010  # the new master wrote one message where the old one's tail was: its end is 11
    f, conn = fetcher([ev.Result(301, b"1 11", 0)], ids, offsets=(0, 15, 0))
    for o in range(15):
        f.reads[1].add(o, 1000 + o)
    assert f._fetch() == (0, []) and f.offsets == [0, 15, 0]  # nothing moves before the probes decide
    f._settle()
    assert f.offsets[1] <= 10  # 10 (the new message) is read, not skipped by reading on from 11
    assert f.msg_ids[1] == 1000 + f.offsets[1] - 1 and f._differs is None and f.offsets[0] == f.offsets[2] == 0


def test_a_301_on_level_0_moves_the_topics_own_position_too():
    f, _conn = fetcher([ev.Result(301, b"0 40", 0)], offsets=(7, 0, 0))  # past a retention cut: forward
    f._fetch()
    assert f.offsets[0] == 40 and f.position == (40, -1)


def test_a_broker_older_than_the_expects_is_asked_without_them(caplog):
    f, conn = fetcher([ev.Result(400, b"get_prio needs 7 or 8 tokens (get_prio ...)", 0), ev.Result(404, b"", 0)])
    f.reads[2].add(4, 904)
    assert f._fetch() == (0, [])
    f._fetch()
    assert conn.sent[0].expects == (None, None, (4, 904)) and conn.sent[1].expects is None
    assert sum("does not check a get_prio's last records" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("code, body, why", [(412, b"3 diverged", "names no level of 3"),
                                             (412, b"x diverged", "names no level"), (412, b"", "names no level"),
                                             (301, b"-1 4", "names no level"), (301, b"1 x", "not <level> <offset>")])
def test_a_reply_naming_no_level_is_refused_and_nothing_moves(code, body, why):
    f, _conn = fetcher([ev.Result(code, body, 0)], offsets=(1, 2, 3))
    f.reads[1].add(1, 501)
    with pytest.raises(errors.RemoteProtocolError, match=why):
        f._fetch()
    assert f.offsets == [1, 2, 3] and f._differs is None


def test_another_400_does_not_turn_the_expects_off():
    f, conn = fetcher([ev.Result(400, b"get_prio t: give one offset per level, 3 of them (o_0,...,o_2); got 2 tokens",
                                 0)])
    f.reads[0].add(0, 100)
    with pytest.raises(errors.ClientError):
        f._fetch()
    assert not f._no_expect and f._fetch is not None
    with pytest.raises(errors.ClientError):
        f._fetch()
    assert conn.sent[1].expects == ((0, 100), None, None)  # still named


def test_a_probe_lost_mid_rewind_leaves_the_level_and_is_tried_again():
    ids = {o: 1000 + o for o in range(190)}
    ids.update({o: 7000 + o for o in range(190, 205)})
    f, conn = fetcher([ev.Result(412, b"1 diverged: x", 0)], ids, offsets=(5, 200, 3))
    for o in range(200):
        f.reads[1].add(o, 1000 + o)
    with pytest.raises(errors.Diverged) as info:
        f._fetch()
    f._differs = (info.value, None)
    real, calls = conn.call, []

    def flaky(request, timeout=None):
        calls.append(request)
        if len(calls) == 2:
            raise errors.ConnectionLost("lost during the probe")
        return real(request, timeout)

    conn.call = flaky
    before = f.reads[1].newest_first()
    with pytest.raises(errors.ConnectionLost):
        f._settle()
    assert f._differs is not None and f.offsets == [5, 200, 3] and f.reads[1].newest_first() == before
    f._settle()
    assert f._differs is None and 200 - 3 * 10 <= f.offsets[1] <= 190 and f.offsets[0] == 5 and f.offsets[2] == 3
    assert f.msg_ids[1] == 1000 + f.offsets[1] - 1


def test_a_412_on_level_0_moves_the_topics_own_position_with_it():
    ids = {o: 1000 + o for o in range(3)}
    ids.update({o: 7000 + o for o in range(3, 9)})
    f, _conn = fetcher([ev.Result(412, b"0 diverged: x", 0)], ids, offsets=(8, 4, 0))
    f.offset, f.msg_id = 8, 1007
    for o in range(8):
        f.reads[0].add(o, 1000 + o)
    with pytest.raises(errors.Diverged) as info:
        f._fetch()
    f._differs = (info.value, None)
    f._settle()
    assert f.offsets[0] <= 3 and f.position == (f.offsets[0], 1000 + f.offsets[0] - 1) and f.offsets[1] == 4


class Committed:
    """A consumer's offset store and kept reads, for ``resolve``: ``stored`` {level topic: (offset, msg_id)}."""

    long_poll_ms, max_size, group = 0, 1 << 20, "g"

    def __init__(self, stored, kept):
        self.stored, self.reads_kept = stored, kept

    def initial_offset(self, topic, partition):
        entry = self.stored.get(topic)
        return (entry[0], entry[0]) if entry else (0, None)

    def stored_entry(self, topic, partition):
        return self.stored.get(topic)


def test_each_levels_reads_are_handed_to_the_next_fetcher_of_the_partition():
    from metaq.client.divergence import ReadsKept

    kept = ReadsKept()
    sub = SimpleNamespace(topic="t", tags=None, sql=None, priorities=LEVELS)
    f = PriorityFetcher(Committed({}, kept), sub, Partition(7, 0))
    f.resolve()
    for o in range(5):
        f._move(1, o + 1, 100 + o)
        f.reads[1].add(o, 100 + o)
    for o in range(3):
        f._move(0, o + 1, 200 + o)
        f.reads[0].add(o, 200 + o)
    f.request_stop()  # stopped, its thread never started: a clean stop
    for entry in f.handover():  # as the consumer's _revoke does
        kept.keep(*entry)
    g = PriorityFetcher(Committed({"t": (3, 202), "t%P1": (5, 104)}, kept), sub, Partition(7, 0))
    g.resolve()
    assert g.reads[1] is f.reads[1] and g.reads[1].last() == (4, 104)  # what it read, not the commit alone
    assert g.reads[0].newest_first() == f.reads[0].newest_first()
    assert g.offsets == [3, 5, 0] and g.msg_ids == [202, 104, -1] and g.position == (3, 202)
    h = PriorityFetcher(Committed({"t%P1": (5, 999)}, kept), sub, Partition(7, 0))  # another commit: not taken
    h.resolve()
    assert h.reads[1].newest_first() == [(4, 999)]  # the committed record alone
