"""A pipeline of requests that each cost milliseconds no longer holds the event loop for a whole receive buffer
(``limits.MAX_TURN_MS``, ``connections.share_loop``), and a pipeline of ``get_prio``s waits for the reply budget
as gets do instead of wedging its connection (found by an attack review: 8-25 s stalls of every other client;
connections, their memory and their slots held for good)."""

import time

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from tests.client.test_priorities import create
from tests.harness.broker import wait_for
from tests.hostile.common import LoopProbe, hang_up, quiet_socket


def tagged_puts(c, topic, count, tag):
    """``count`` tiny puts to partition 0 tagged ``tag``, pipelined, every one acknowledged."""
    flag, data = encode_payload(b"x", tag)
    frame = serialize(ev.Put(topic, 0, flag, data, 1, metaq_checksum(data)))
    for start in range(0, count, 5000):
        n = min(5000, count - start)
        c.send(frame * n)
        assert all(c.read_event().code == 200 for _ in range(n))


def test_a_pipeline_of_costly_scans_lets_other_clients_in(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data"))
    with b.client(timeout=120) as c:
        tagged_puts(c, "tg", 40_000, "A")
        # each asks for tag B: MAX_FILTER_SCAN_UNITS (16,384) units scanned and nothing found, ~3 ms of the loop;
        # 3,000 of them in one pipeline were 8 s during which no other client was answered
        n = 3000
        started = time.perf_counter()
        with LoopProbe(b.port) as probe:
            c.send(b"get_tags tg g 0 0 1024 B 7\r\n" * n)
            replies = [c.read_event() for _ in range(n)]
        took = time.perf_counter() - started
    assert all(isinstance(r, ev.Value) for r in replies), replies[:3]  # every one answered (skipped units: a value)
    assert probe.latencies and not probe.failures
    # the others wait for one turn at most, not for the pipeline (which still takes what it takes)
    assert probe.worst() < min(0.5, took / 4), (probe.worst(), took, len(probe.latencies))  # 7.7 s before
    assert len(probe.latencies) >= 10, (took, len(probe.latencies))


def test_a_pipeline_of_get_prios_waits_for_the_reply_budget_and_a_closed_one_goes(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", limits={"idle_timeout_s": 30}))
    body = b"p" * 200_000
    with b.client(timeout=60) as c:
        create(c, "tp", partitions=1, priorities=2)
        for _ in range(8):  # 1.6 MB at level 1: more than the reply budget (4 MiB) holds in two replies
            assert c.put_prio("tp", body, 1, partition=0).code == 200
        # six 1 MiB get_prios pipelined: each waits until the replies before it are taken, as gets do
        c.send(b"get_prio tp g 0 0,0 1048576 1\r\n" * 6)
        replies = [c.read_event() for _ in range(6)]
        assert all(isinstance(r, ev.Value) for r in replies), [type(r).__name__ for r in replies]
        before = int(c.stats_dict()["curr_connections"])
    for _ in range(30):  # send them and go: nothing stays behind
        s = quiet_socket(b.port)
        s.sendall(b"get_prio tp g 0 0,0 1048576 1\r\n" * 6)
        hang_up(s)
    with b.client(timeout=60) as c:
        wait_for(lambda: int(c.stats_dict()["curr_connections"]) <= before, 20,
                 lambda: "the closed connections released: %s open" % c.stats_dict()["curr_connections"])
