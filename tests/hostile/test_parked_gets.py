"""Issue 15 point 2: long polls parked on the broker are capped per connection and per broker.

``limits.max_parked_gets_per_connection`` (text port) and ``limits.max_parked_gets`` (text gets and
remoting pulls together); past either the poll is answered at once with a clear error.
"""

import time

from metaq import limits
from metaq.client.local import rmq_config, small_config
from metaq.client.raw import PULL_FLAGS, RemotingClient, TextClient, pull_fields
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode
from metaq.protocol.text import serialize
from tests.harness.broker import wait_for
from tests.hostile.common import LoopProbe

SUSPEND = 1 << 1  # PULL_SUSPEND in the pull's sysFlag


def park(client, n, first_opaque, topic="lp", partition=0, wait_ms=20000, offset=0):
    """Send ``n`` long-polling gets at the end of a partition (their replies come later)."""
    client.send(b"".join(serialize(ev.Get(topic, "g", partition, offset, 4096, first_opaque + i, wait_ms))
                         for i in range(n)))


def settled(broker):
    """True when the broker answers ``version`` at once again (after a burst of work)."""
    with broker.client() as c:
        t0 = time.perf_counter()
        c.call(ev.Version(1))
        return time.perf_counter() - t0 < 0.010


def parked(broker):
    with broker.client() as c:
        return int(c.stats_dict()["parked_gets"])


def test_parked_gets_at_each_cap_and_one_past(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", limits={"max_parked_gets_per_connection": 50,
                                                                      "max_parked_gets": 80}))
    a = TextClient("127.0.0.1", broker.port)
    b = TextClient("127.0.0.1", broker.port)
    try:
        park(a, 50, 1)  # the connection's limit
        wait_for(lambda: parked(broker) == 50, what="50 parked gets")
        r = a.call(ev.Get("lp", "g", 0, 0, 4096, 999, 20000))  # one past: answered at once
        assert (r.code, r.opaque) == (503, 999)
        assert r.body == b"too many parked gets on this connection: the limit is 50"
        park(b, 30, 101)  # the broker's limit: 80 in all
        wait_for(lambda: parked(broker) == 80, what="80 parked gets")
        r = b.call(ev.Get("lp", "g", 1, 0, 4096, 998, 20000))  # one past, on a connection below its own cap
        assert (r.code, r.body) == (503, b"too many parked gets on the broker: the limit is 80")
        with broker.client() as c:
            c.put_ok("lp", b"wake up", partition=0)  # every parked get answers with it
        for client, opaques in ((a, range(1, 51)), (b, range(101, 131))):
            got = [client.read_event() for _ in opaques]
            assert sorted(v.opaque for v in got) == list(opaques)
            assert all(type(v) is ev.Value and v.body.endswith(b"wake up") for v in got)
        assert parked(broker) == 0
        park(a, 50, 201, offset=1)  # the places are free again
        wait_for(lambda: parked(broker) == 50, what="places freed")
    finally:
        a.close()
        b.close()
    wait_for(lambda: parked(broker) == 0, what="a closed connection's parked gets to leave")


def test_closing_a_connection_with_the_most_parked_gets_does_not_stall_the_broker(broker_factory, tmp_path):
    """One connection parks the most it may (1,024), 19 others nearly as many: 19,986 on one partition."""
    most, others, each = limits.MAX_PARKED_GETS_PER_CONNECTION, 19, 998
    total = most + others * each
    assert total <= limits.MAX_PARKED_GETS
    broker = broker_factory(small_config(tmp_path / "data"))
    clients = [TextClient("127.0.0.1", broker.port) for _ in range(others + 1)]
    try:
        for i, c in enumerate(clients[:others]):
            park(c, each, i * each)
        park(clients[-1], most, others * each)
        wait_for(lambda: parked(broker) == total, timeout=60, what="%d parked gets" % total)
        wait_for(lambda: settled(broker), timeout=30, what="the parked greenlets to start waiting")
        with LoopProbe(broker.port) as probe:
            time.sleep(0.3)
            clients.pop().close()
            wait_for(lambda: parked(broker) == total - most, what="one connection's gets to leave")
            time.sleep(0.3)
        assert not probe.failures
        assert probe.worst() < 0.100, "the broker stalled %.0f ms closing one connection" % (probe.worst() * 1000)
    finally:
        for c in clients:
            c.close()


def test_suspended_pulls_count_against_the_broker_cap(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_parked_gets": 5}))
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        fields = pull_fields("lpr", 0, 0, sys_flag=PULL_FLAGS | SUSPEND, suspend_ms=20000)
        opaques = [rc.request(RequestCode.PULL_MESSAGE, fields) for _ in range(5)]  # at the cap
        wait_for(lambda: parked(broker) == 5, what="5 parked pulls")
        r = rc.call(RequestCode.PULL_MESSAGE, fields)  # one past: answered at once
        assert r.code == ResponseCode.SYSTEM_BUSY
        assert r.remark == "too many parked pulls on the broker: the limit is 5"
        with broker.client() as c:
            c.put_ok("lpr", b"for the pulls", partition=0)
        for o in opaques:
            resp = rc.response(o)
            assert resp.code == ResponseCode.SUCCESS and b"for the pulls" in resp.body
    wait_for(lambda: parked(broker) == 0, what="the pulls to leave")
