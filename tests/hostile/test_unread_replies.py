"""Issue 15 point 1: a client that asks for much and never reads its replies does not grow the broker.

The broker holds at most ``limits.max_reply_bytes`` of replies per connection read from the store and
not yet taken by the socket; past that it stops reading the connection's requests until they drain.
"""

import time

import pytest

from metaq.server.remoting import limits as remoting_limits

from metaq.client.local import rmq_config, small_config
from metaq.client.raw import RemotingClient, pull_fields
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode, encode_command, make_request
from metaq.protocol import events as ev
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.broker import consume_all, wait_for
from tests.hostile.common import quiet_socket, unread_flood

MiB = 1 << 20
RECORD = 200 * 1024


def fill(client, topic, nbytes):
    """Put ``nbytes`` (at least) of 200 KB messages to partition 0 of ``topic``; returns the payloads."""
    payloads = [bytes([i % 251]) * RECORD for i in range(nbytes // RECORD + 1)]
    for p in payloads:
        client.put_ok(topic, p, partition=0)
    return payloads


def test_ten_thousand_unread_1mib_gets_do_not_grow_the_broker(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data"))
    with broker.client(timeout=30) as c:
        payloads = fill(c, "big", 2 * MiB)
        gets_before = int(c.stats_dict()["cmd_get"])
    lines = b"".join(serialize(ev.Get("big", "g", 0, 0, MiB, i)) for i in range(10_000))
    with unread_flood(broker, broker.port, lines) as (grown, probe):
        assert grown < 100 * MiB, "the broker grew %.0f MB for one client's unread gets" % (grown / MiB)
        assert not probe.failures
        assert probe.p99() < 0.050, "version p99 %.1f ms while the gets were pending" % (probe.p99() * 1000)
        with broker.client(timeout=30) as c:
            served = int(c.stats_dict()["cmd_get"]) - gets_before
        assert served < 1000, "the broker answered %d gets nobody read" % served
    with broker.client(timeout=30) as c:  # the broker is normal once the client goes, and the data is intact
        assert [r.data for r in consume_all(c, "big", 0)] == payloads
        wait_for(lambda: int(c.stats_dict()["curr_connections"]) == 1, what="the attacker's connection to close")


def test_gets_wait_for_their_replies_to_drain_then_all_answer_in_order(broker_factory, tmp_path):
    """Past the budget (and the kernel's buffers) the broker stops answering; reading lets every get through."""
    broker = broker_factory(small_config(tmp_path / "data", limits={"max_reply_bytes": 256 * 1024}))
    with broker.client(timeout=30) as c:
        for i in range(8):
            c.put_ok("small", b"%06d" % i + b"x" * (32 * 1024 - 6), partition=0)
        gets_before = int(c.stats_dict()["cmd_get"])
    s = quiet_socket(broker.port, rcvbuf=4096)
    n = 400  # each reply is one 32 KB record: 12.8 MB in all, far past the socket buffers
    try:
        s.sendall(b"".join(serialize(ev.Get("small", "g", 0, 0, 40000, i)) for i in range(n)))
        with broker.client(timeout=30) as c:
            answered = lambda: int(c.stats_dict()["cmd_get"]) - gets_before  # noqa: E731
            wait_for(lambda: answered() >= 4, what="the first gets to be answered")
            time.sleep(0.5)
            assert answered() < n, "every get was read from the store with no one reading the replies"
            # Reading the replies lets every get through, in order, each whole.
            s.settimeout(10)
            parser = TextParser(max_body=1 << 20)
            values = []
            while len(values) < n:
                data = s.recv(1 << 20)
                assert data, "the broker closed the connection"
                parser.receive_data(data)
                while True:
                    event = parser.next_event()
                    if event is NEED_DATA:
                        break
                    values.append(event)
            assert [v.opaque for v in values] == list(range(n))
            assert all(type(v) is ev.Value and len(v.body) == 32 * 1024 + 20 for v in values)
            assert answered() == n
    finally:
        s.close()


def pull_frame(topic, opaque):
    return encode_command(make_request(RequestCode.PULL_MESSAGE, pull_fields(topic, 0, 0, sys_flag=0), b"", opaque,
                                       False, "CPP", 63))


def test_unread_remoting_pulls_do_not_grow_the_broker(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data"))
    port = broker.config["remoting"]["port"]
    with broker.client(timeout=30) as c:
        payloads = fill(c, "bigr", 2 * MiB)
    with unread_flood(broker, port, b"".join(pull_frame("bigr", i) for i in range(1, 5001))) as (grown, probe):
        assert grown < 100 * MiB, "the broker grew %.0f MB for one client's unread pulls" % (grown / MiB)
        assert not probe.failures
        assert probe.p99() < 0.050
    with RemotingClient(port) as rc:  # an honest client still pulls everything, intact
        r = rc.call(RequestCode.PULL_MESSAGE, pull_fields("bigr", 0, 0, sys_flag=0, max_nums=4))
        assert r.code == ResponseCode.SUCCESS
        assert payloads[0] in r.body


def send_frame(topic, body, opaque):
    return encode_command(make_request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4", "queueId": "0",
        "sysFlag": "0", "bornTimestamp": "1", "flag": "0", "properties": "", "reconsumeTimes": "0"}, body, opaque,
        False, "CPP", 63))


def test_unread_remoting_sends_hold_at_most_the_request_budget(broker_factory, tmp_path):
    # an attack review: sends whose answers are never read each held their 4 MiB body, 1.2 GB for one connection
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_body_bytes": 4 * MiB},
                                       store={"flush": "sync", "segment_size": 256 * MiB}))
    port = broker.config["remoting"]["port"]
    with broker.client(timeout=30) as c:
        fill(c, "bigs", 12 * MiB)  # pulls of it fill the attacker's socket: the sends' answers cannot go
    body = b"s" * (4 * MiB - 4096)
    flood = b"".join(pull_frame("bigs", i) for i in range(1, 13)) + b"".join(
        send_frame("sendflood", body, 1000 + i) for i in range(100))
    with unread_flood(broker, port, flood, seconds=8) as (grown, probe):
        assert grown < 2 * remoting_limits.MAX_REMOTING_INFLIGHT_BYTES + 64 * MiB, \
            "the broker grew %.0f MB for one client's unread sends" % (grown / MiB)
        assert not probe.failures and probe.p99() < 0.050
    with RemotingClient(port) as rc:  # what was stored is whole, and the broker takes sends as before
        r = rc.call(RequestCode.SEND_MESSAGE, {"producerGroup": "PG", "topic": "sendflood", "defaultTopic": "TBW102",
                                               "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                                               "bornTimestamp": "1", "flag": "0", "properties": "",
                                               "reconsumeTimes": "0"}, b"after")
        assert r.code == ResponseCode.SUCCESS, r


@pytest.mark.parametrize("port_name", ["text", "remoting"])
def test_a_reader_that_reads_gets_everything_with_a_small_budget(broker_factory, tmp_path, port_name):
    """The budget never loses or reorders a reply: a pipelining consumer that reads gets every record."""
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_reply_bytes": 64 * 1024}))
    with broker.client(timeout=30) as c:
        payloads = [b"%05d" % i * 2000 for i in range(200)]  # 10 KB each
        for p in payloads:
            c.put_ok("flow", p, partition=1)
        if port_name == "text":
            got = [r.data for r in consume_all(c, "flow", 1, max_size=64 * 1024)]
            assert got == payloads
            return
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        opaques = [rc.request(RequestCode.PULL_MESSAGE, pull_fields("flow", 1, off, sys_flag=0, max_nums=16))
                   for off in range(0, 200, 16)]
        bodies = [rc.response(o) for o in opaques]
        assert all(b.code == ResponseCode.SUCCESS for b in bodies)
        joined = b"".join(b.body for b in bodies)
        assert all(p in joined for p in payloads)
