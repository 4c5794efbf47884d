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
    f = PartitionFetcher(Consumer(conn, slave), SimpleNamespace(topic="t", tags=None), Partition(7, 0))
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
    from metaq.client.priofetch import PriorityFetcher

    conn = Conn("meta://slave", ev.Result(301, b"2 10", 0))
    f = PriorityFetcher(Consumer(conn, True), SimpleNamespace(topic="t", tags=None, priorities=3), Partition(7, 0))
    f.offsets = [5, 6, 40]
    assert f._fetch() == (0, [])
    assert f.offsets == [5, 6, 40]  # level 2 stays at 40, not back to the slave's 10
    conn.reply = ev.Result(301, b"2 10", 0)
    f2 = PriorityFetcher(Consumer(conn, False), SimpleNamespace(topic="t", tags=None, priorities=3),
                         Partition(7, 0))
    f2.offsets = [5, 6, 40]
    f2._fetch()
    assert f2.offsets == [5, 6, 10]  # a master's answer moves it
