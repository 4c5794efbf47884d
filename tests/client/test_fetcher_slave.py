"""A fetcher whose reads failed over to a slave that ends before what it already read from the master waits there
(the slave catches up, the master returns or the slave is promoted); from a master the same answer moves it."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.client import fetcher as fetcher_module
from metaq.client.fetcher import PartitionFetcher
from metaq.client.message import Partition
from metaq.protocol import events as ev


class Conn:
    def __init__(self, url, reply):
        self.url, self.reply, self.asked = url, reply, []

    def request(self, request, timeout=None):
        self.asked.append(request)
        f = Future()
        f.set_result(self.reply)
        return f


class Consumer:
    long_poll_ms, max_size, group = 0, 1 << 20, "g"

    def __init__(self, conn, slave):
        self.conn, self.slave = conn, slave

    def connection(self, broker_id, read=False):
        return self.conn

    def is_slave_read(self, broker_id, url):
        return self.slave


def fetcher(conn, slave):
    f = PartitionFetcher(Consumer(conn, slave), SimpleNamespace(topic="t", tags=None, sql=None), Partition(7, 0))
    f.offset = 807
    return f


@pytest.fixture(autouse=True)
def no_wait(monkeypatch):
    monkeypatch.setattr(fetcher_module, "SLAVE_BEHIND_WAIT_S", 0)


def test_a_slave_ending_before_the_offset_read_is_waited_for_not_followed_back():
    conn = Conn("meta://slave", ev.Result(301, b"255", 0))
    f = fetcher(conn, slave=True)
    assert f._fetch() == ([], 807)
    assert f._fetch() == ([], 807)
    assert f.offset == 807 and [r.offset for r in conn.asked] == [807, 807]  # asked again at the same offset


def test_a_master_ending_before_the_offset_moves_it_back():
    f = fetcher(Conn("meta://master", ev.Result(301, b"255", 0)), slave=False)
    with pytest.raises(errors.Moved) as moved:
        f._fetch()
    assert moved.value.offset == 255  # _run continues there (an async failover's lost tail: new messages)


def test_a_slave_past_a_retention_cut_moves_the_offset_forward():
    f = fetcher(Conn("meta://slave", ev.Result(301, b"900", 0)), slave=True)
    with pytest.raises(errors.Moved) as moved:
        f._fetch()
    assert moved.value.offset == 900


def test_a_priority_fetcher_waits_for_a_slave_behind_one_of_its_levels_too():
    from metaq.client.priorities import PriorityFetcher

    conn = Conn("meta://slave", ev.Result(301, b"2 10", 0))
    f = PriorityFetcher(Consumer(conn, True), SimpleNamespace(topic="t", tags=None, sql=None, priorities=3),
                        Partition(7, 0))
    f.offsets = [5, 6, 40]
    assert f._fetch() == (0, [])
    assert f.offsets == [5, 6, 40]  # level 2 stays at 40, not back to the slave's 10
    conn.reply = ev.Result(301, b"2 10", 0)
    f2 = PriorityFetcher(Consumer(conn, False), SimpleNamespace(topic="t", tags=None, sql=None, priorities=3),
                         Partition(7, 0))
    f2.offsets = [5, 6, 40]
    f2._fetch()
    assert f2.offsets == [5, 6, 10]  # a master's answer moves it


class Log:
    """A broker's partition for a divergence probe: ``ids`` ``{offset: msg_id}`` below ``end``; a get's expect
    is checked as the broker does (loop/expect.py), then 301 past the end, else 404 (both logs hold it)."""

    url = "meta://new-master"

    def __init__(self, ids):
        self.ids, self.end, self.asked = ids, len(ids), []

    def call(self, request, timeout=None):
        self.asked.append(request)
        if request.expect is not None:
            held = self.ids.get(request.expect[0])
            if held is not None and held != request.expect[1]:
                return ev.Result(412, b"diverged", 0)
        if request.offset > self.end:
            return ev.Result(301, b"%d" % self.end, 0)
        return ev.Result(404, b"", 0)


class Rewinding(Consumer):
    def __init__(self, conn):
        super().__init__(conn, slave=False)
        self.asked_at = []

    def offset_at(self, topic, partition, since_ms):
        self.asked_at.append(since_ms)
        return 150


def read_up_to(conn, last, first=0):
    f = PartitionFetcher(Rewinding(conn), SimpleNamespace(topic="t", tags=None, sql=None), Partition(7, 0))
    for offset in range(first, last + 1):
        f._read.add(offset, 1000 + offset)
    f.offset = last + 1
    return f


def test_a_master_ending_before_what_was_read_is_probed_below_its_end_not_followed_to_it():
    # read 0..403 from the old master; the new one holds 0..196 as read and wrote 197..201 anew: its end is 202.
    # The newest record remembered below 202 is far back (older ones are sparse): reading on at 202 with that
    # as the expect would skip 197..201 (the random-fault run's 12 undelivered messages)
    ids = {o: 1000 + o for o in range(197)}
    ids.update({o: 5000 + o for o in range(197, 202)})
    conn = Log(ids)
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(202))
    assert f.position == (404, -1) and conn.asked == []  # nothing moves before the probes decide
    f._settle()
    depth = 404 - 197
    assert 404 - 3 * depth <= f.offset <= 197  # nothing new skipped; at most 3x the depth read again
    assert all(r.offset <= 202 for r in conn.asked)  # probes only
    assert f._read.last()[0] == f.offset - 1 and ids[f.offset - 1] == f._read.last()[1]  # the record before: held


def test_a_master_holding_the_records_below_its_end_as_read_continues_at_its_end():
    conn = Log({o: 1000 + o for o in range(202)})  # only the tail lost, nothing new written (yet)
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(202))
    f._settle()
    assert f.offset >= 202 - 3 * (404 - 202) and f.offset <= 202
    assert f._read.last() == (f.offset - 1, 1000 + f.offset - 1)


def test_with_nothing_remembered_below_the_end_the_fetcher_goes_back_by_time():
    conn = Log({o: 5000 + o for o in range(202)})
    f = read_up_to(conn, 403, first=403)  # a new fetcher knows only the committed record (no rebalance kept it)
    f._moved(errors.Moved(202))
    f._settle()
    assert f.offset == 150 and len(f.consumer.asked_at) == 1  # the first message stored before the lost record


def test_a_move_forward_past_a_retention_cut_is_not_probed():
    conn = Log({o: 1000 + o for o in range(1000)})
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(900))
    assert f.offset == 900 and conn.asked == []


def test_a_probe_that_fails_leaves_the_position_and_is_tried_again():
    # the new master's connection drops during the probes (a failover is when that happens): the error backs off
    # in _run and the probes run again; meanwhile a commit or a stop sees the old position, never the end
    ids = {o: 1000 + o for o in range(197)}
    ids.update({o: 5000 + o for o in range(197, 202)})
    conn = Log(ids)
    real_call, calls = conn.call, []

    def flaky(request, timeout=None):
        calls.append(request)
        if len(calls) == 1:
            raise errors.ConnectionLost("lost during the probe")
        return real_call(request, timeout)

    conn.call = flaky
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(202))
    with pytest.raises(errors.ConnectionLost):
        f._settle()
    assert f.position == (404, -1) and f._differs is not None and f._read.last() == (403, 1403)
    f._settle()
    assert f.offset <= 197 and f._differs is None


def test_a_stop_during_the_probes_keeps_the_position():
    conn = Log({o: 5000 + o for o in range(202)})
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(202))
    f.request_stop()
    f._settle()
    assert f.position == (404, -1) and f._read.last() == (403, 1403)  # the next fetcher meets the 301 again


def test_a_tag_filtered_fetcher_that_delivered_nothing_past_the_end_probes_too():
    # it delivered up to 100, then the broker passed over 101..403 (no wanted tags): nothing remembered at or
    # past the end, but reading on from the end would skip new wanted messages at 197..201
    ids = {o: 1000 + o for o in range(197)}
    ids.update({o: 5000 + o for o in range(197, 202)})
    conn = Log(ids)
    f = read_up_to(conn, 100)
    f.offset = 404
    f._moved(errors.Moved(202))
    assert f._differs is not None
    f._settle()
    assert f.offset <= 101


def test_a_probe_meeting_a_corrupt_record_after_the_checkpoint_holds_it_as_read():
    class Corrupt(Log):
        def call(self, request, timeout=None):
            reply = super().call(request, timeout)
            return ev.Result(512, b"corrupt", 0) if reply.code == 404 else reply  # the record after it is bad

    conn = Corrupt({o: 1000 + o for o in range(202)})
    f = read_up_to(conn, 403)
    f._moved(errors.Moved(202))
    f._settle()
    assert f._differs is None and f.offset <= 202 and f._read.last()[0] == f.offset - 1


def tag_fetcher():
    f = PartitionFetcher(Rewinding(Log({})), SimpleNamespace(topic="t", tags="a", sql=None), Partition(7, 0))
    f.offset = 10
    return f


def test_a_get_tags_reply_that_passed_records_over_remembers_and_commits_the_last_of_them():
    f = tag_fetcher()
    f._passed_over = (14, 7014)  # the reply: records up to 12 given, 13..14 passed over, next offset 15
    f._deliver([], 15)
    assert f.position == (15, 7014) and f._read.last() == (14, 7014)  # what a restart checks (resolve)
    f._passed_over = None  # a broker before ":passed": the offset moves, no id is claimed for it
    f._deliver([], 20)
    assert f.position == (20, -1) and f._read.last() == (14, 7014)


def test_an_interrupted_delivery_moves_neither_the_offset_nor_the_passed_record():
    f = tag_fetcher()
    f._passed_over = (14, 7014)
    f._interrupt.set()  # a stop or a seek
    f._deliver([], 15)
    assert f.position == (10, -1) and f._read.last() is None
