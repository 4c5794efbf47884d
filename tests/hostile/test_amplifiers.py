"""Requests whose cost is far larger than their size (found by an attack review of issue 15's work).

Big non-get replies asked for and never read (``stats groups``), one RocketMQ heartbeat naming
thousands of groups, notifications to a client that never reads, and counters keyed by names a
client invents: each is bounded.
"""

import json
import time

from metaq.server.remoting import limits as remoting_limits
from metaq.client.local import rmq_config, small_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode, encode_command, make_request
from metaq.protocol.text import serialize
from tests.hostile.common import LoopProbe, hang_up, quiet_socket, rss_bytes, unread_flood

MiB = 1 << 20


def test_unread_stats_replies_do_not_grow_the_broker(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data"))
    with broker.client(timeout=60) as c:
        c.put_ok("sg", b"x", partition=0)
        n = 20_000  # offsets make `stats groups` a reply of ~1 MB
        c.send(b"".join(serialize(ev.CommitOffset("group-with-a-long-name-%06d" % i, "sg", 0, 1, i))
                        for i in range(n)))
        assert all(c.read_event().code == 200 for _ in range(n))
        assert len(c.stats("groups")) > 500_000
    with unread_flood(broker, broker.port, b"stats groups 1\r\n" * 2000) as (grown, _probe):
        assert grown < 100 * MiB, "the broker grew %.0f MB for unread stats replies" % (grown / MiB)
        with broker.client(timeout=10) as c:
            assert c.call(ev.Version(1)).code == 200


def heartbeat(client, groups):
    return json.dumps({"clientID": client, "consumerDataSet": [{"groupName": g} for g in groups],
                       "producerDataSet": []}).encode()


def test_a_heartbeat_naming_too_many_groups_is_refused(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data"))
    most = remoting_limits.MAX_HEARTBEAT_GROUPS
    with RemotingClient(broker.config["remoting"]["port"], timeout=30) as rc:
        r = rc.call(RequestCode.HEART_BEAT, {}, heartbeat("c1", ["G%d" % i for i in range(most)]))  # the limit
        assert r.code == ResponseCode.SUCCESS
        r = rc.call(RequestCode.HEART_BEAT, {}, heartbeat("c2", ["G%d" % i for i in range(most + 1)]))  # past it
        assert r.code == ResponseCode.INVALID_PARAMETER
        assert r.remark == "a heartbeat may name at most %d consumer groups, this one names %d" % (most, most + 1)
    with LoopProbe(broker.port) as probe:
        time.sleep(1)  # the close of c1's connection leaves 1,024 groups
    assert not probe.failures and probe.worst() < 0.5


def test_a_client_that_never_reads_its_notifications_does_not_hold_up_others(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data"))
    port = broker.config["remoting"]["port"]
    group = "G" * 200  # each notification names it: ~400 bytes
    deaf = quiet_socket(port)  # joins the group, then never reads what the broker sends it
    deaf.sendall(encode_command(make_request(RequestCode.HEART_BEAT, {}, heartbeat("deaf", [group]), 1, False,
                                             "JAVA", 373)))
    time.sleep(0.3)
    n = 20_000  # each new member notifies every member: 8 MB for the deaf one, past any socket buffer
    with RemotingClient(port, timeout=30) as joiner:
        joiner.send_raw(b"".join(encode_command(make_request(RequestCode.HEART_BEAT, {}, heartbeat("c%d" % i, [group]),
                                                             i + 1, False, "JAVA", 373)) for i in range(n)))
        answered = []
        while len(answered) < n:
            frame = joiner.read(timeout=30)
            if frame.is_response:  # (the joiner is notified too: those are requests)
                answered.append(frame)
        assert all(r.code == ResponseCode.SUCCESS for r in answered)
    hang_up(deaf)


def test_counters_for_invented_topic_names_are_bounded(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data"))
    rss_before = rss_bytes(broker.proc.pid)
    with broker.client(timeout=60) as c:
        n = 200_000
        c.send(b"".join(serialize(ev.Get("nosuch%d" % i, "g", 0, 0, 100, i)) for i in range(n)))
        replies = [c.read_event() for _ in range(n)]
        assert {r.code for r in replies} == {404}
        assert c.call(ev.Version(1)).code == 200
    grown = rss_bytes(broker.proc.pid) - rss_before
    assert grown < 50 * MiB, "the broker grew %.0f MB counting gets of invented topics" % (grown / MiB)
