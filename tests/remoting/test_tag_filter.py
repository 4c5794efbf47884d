"""Tag filtering in the broker (README "Tag filtering"), against real broker processes: a remoting pull with a
TAG subscription (our codec and the official client's push consumer), the text ``get_tags`` extension and the
metaq consumer with an attribute filter. The wanted records are found by their index units' tag hashes; the
others are never read from the log (``stats log_read_bytes``)."""

import socket
import threading

import pytest

from bench.rocketmq_peer import run_peer
from metaq.filters import limits as filters_limits
from metaq.client import Consumer
from metaq.client.local import ns_of
from metaq.client.raw import PULL_FLAGS, RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.headers import PULL_SUSPEND
from metaq.protocol.rocketmq.remoting import ResponseCode
from metaq.filters.wire import decode_tagged_body
from metaq.protocol.text import serialize
from tests.harness.broker import url_of
from tests.harness.rocketmq import pull, received, require_official_client, send_v1


def pipeline_puts(port, topic, partition, attributes, payload=b"x" * 200):
    """Put one message per attribute (RocketMQ-style: tags, \\x02, a property) in one pipelined burst."""
    frames = []
    for i, tag in enumerate(attributes):
        flag, data = encode_payload(payload, None if tag is None else "%s\x02KEYS\x01k%d" % (tag, i))
        frames.append(serialize(ev.Put(topic, partition, flag, data, i, metaq_checksum(data))))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"".join(frames))
        got, want = b"", len(frames)
        while got.count(b"result 200 ") < want:
            chunk = s.recv(1 << 20)
            assert chunk, "the broker closed the connection"
            got += chunk
            assert b"result 4" not in got and b"result 5" not in got, got[-300:]


def log_read_bytes(broker):
    with broker.client() as c:
        return int(c.stats_dict()["log_read_bytes"])


def tags_1_in_100(n):
    return ["T%d" % (i % 100) for i in range(n)]


def test_remoting_pull_reads_only_the_wanted_records(rmq_broker, rc):
    pipeline_puts(rmq_broker.port, "tf1", 0, tags_1_in_100(1000))
    before = log_read_bytes(rmq_broker)
    r = pull(rc, "tf1", 0, 0, max_nums=32, sub="T7 || T42")
    assert r.code == ResponseCode.SUCCESS
    msgs = decode_stored_messages(r.body)
    wanted = [i for i in range(1000) if i % 100 in (7, 42)]
    assert [m.queue_offset for m in msgs] == wanted
    assert all(m.properties["TAGS"] in ("T7", "T42") and m.properties["KEYS"] == "k%d" % m.queue_offset for m in msgs)
    assert int(r.ext_fields["nextBeginOffset"]) == 1000  # past the units after the last wanted one too
    read = log_read_bytes(rmq_broker) - before
    unfiltered_before = log_read_bytes(rmq_broker)
    assert pull(rc, "tf1", 0, 0, max_nums=1000, sub="*").code == ResponseCode.SUCCESS
    assert log_read_bytes(rmq_broker) - unfiltered_before >= 40 * read  # 20 of 1000 records read, not 1000
    # max_nums stops the read right after the last record taken: the next pull starts there, nothing skipped
    r = pull(rc, "tf1", 0, 0, max_nums=3, sub="T7 || T42")
    assert [m.queue_offset for m in decode_stored_messages(r.body)] == [7, 42, 107]
    assert int(r.ext_fields["nextBeginOffset"]) == 108


def test_a_pull_over_only_unwanted_records_moves_on_and_waits_for_a_wanted_one(rmq_broker, rc):
    pipeline_puts(rmq_broker.port, "tf2", 1, ["B"] * 50)
    r = pull(rc, "tf2", 1, 0, sub="A")  # no suspend: nothing wanted up to the end, the end is the next offset
    assert r.code == ResponseCode.PULL_NOT_FOUND and int(r.ext_fields["nextBeginOffset"]) == 50
    result = {}

    def parked():
        result["r"] = pull(rc, "tf2", 1, 0, sys_flag=PULL_FLAGS | PULL_SUSPEND, suspend_ms=20000, sub="A")

    t = threading.Thread(target=parked)
    t.start()
    pipeline_puts(rmq_broker.port, "tf2", 1, ["B"] * 5)  # wakes the parked pull: still nothing wanted
    with RemotingClient(rmq_broker.config["remoting"]["port"]) as other:  # rc is busy with the parked pull
        send_v1(other, "tf2", b"wanted", queue=1, props={"TAGS": "A"})
    t.join(30)
    r = result["r"]
    assert r.code == ResponseCode.SUCCESS
    [m] = decode_stored_messages(r.body)
    assert (m.queue_offset, m.body) == (55, b"wanted") and int(r.ext_fields["nextBeginOffset"]) == 56


@pytest.mark.slow
def test_a_pull_scans_at_most_the_unit_limit(rmq_broker, rc):
    limit = filters_limits.MAX_FILTER_SCAN_UNITS
    pipeline_puts(rmq_broker.port, "tf3", 0, ["B"] * limit + ["A"], payload=b"")
    # from offset 1 the wanted record is the limit-th unit scanned: found in one pull
    r = pull(rc, "tf3", 0, 1, sub="A", max_nums=1)
    assert [m.queue_offset for m in decode_stored_messages(r.body)] == [limit]
    # from offset 0 it is one past this pull's scan: RETRY_IMMEDIATELY past exactly `limit` units, then found
    r = pull(rc, "tf3", 0, 0, sub="A", max_nums=1)
    assert r.code == ResponseCode.PULL_RETRY_IMMEDIATELY and int(r.ext_fields["nextBeginOffset"]) == limit
    r = pull(rc, "tf3", 0, limit, sub="A", max_nums=5)
    assert [m.queue_offset for m in decode_stored_messages(r.body)] == [limit]


def test_a_bad_subscription_is_refused_and_the_connection_goes_on(rmq_broker, rc):
    pipeline_puts(rmq_broker.port, "tf4", 0, ["A"])
    r = pull(rc, "tf4", 0, 0, sub="x" * (filters_limits.MAX_TAG_EXPRESSION_BYTES + 1))
    assert r.code == ResponseCode.INVALID_PARAMETER and "too long" in r.remark
    r = pull(rc, "tf4", 0, 0, sub="x" * filters_limits.MAX_TAG_EXPRESSION_BYTES)  # at the limit: a valid, unmatched tag
    assert r.code == ResponseCode.PULL_NOT_FOUND and int(r.ext_fields["nextBeginOffset"]) == 1
    assert pull(rc, "tf4", 0, 0, sub="A").code == ResponseCode.SUCCESS


def test_text_get_tags(broker):
    pipeline_puts(broker.port, "tf5", 0, ["A", "B", "B", "A"] + ["B"] * 10)
    with broker.client() as c:
        r = c.get_tags("tf5", 0, 0, "A||C")
        assert isinstance(r, ev.Value)
        nxt, records = decode_tagged_body(r.body)
        assert nxt == 14 and [o for o, _rec in records] == [0, 3]
        assert all(rec.data.endswith(b"x" * 200) for _o, rec in records)
        r = c.get_tags("tf5", 0, 4, "A")  # only unwanted records up to the end: none, and where to go on
        assert isinstance(r, ev.Value) and decode_tagged_body(r.body) == (14, [])
        r = c.get_tags("tf5", 0, 14, "A")  # at the end
        assert isinstance(r, ev.Result) and r.code == 404
        r = c.get_tags("tf5", 0, 15, "A")  # past it: go to the end
        assert isinstance(r, ev.Result) and r.code == 301 and r.body == b"14"
        # malformed or oversize tags: 400 saying why, the connection goes on
        for tags, why in (("*", b"at least one tag"),
                          ("x" * (filters_limits.MAX_TAG_EXPRESSION_BYTES + 1), b"too long")):
            r = c.get_tags("tf5", 0, 0, tags)
            assert isinstance(r, ev.Result) and r.code == 400 and why in r.body, r
        assert isinstance(c.get_tags("tf5", 0, 0, "A"), ev.Value)
        # a long poll past unwanted records: woken by them, it waits on from past them, then answers a wanted one
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("r", c.get_tags("tf5", 0, 14, "A", max_wait_ms=20000)))
        t.start()
        pipeline_puts(broker.port, "tf5", 0, ["B"] * 3 + ["A"])
        t.join(30)
        nxt, records = decode_tagged_body(done["r"].body)
        assert nxt == 18 and [o for o, _rec in records] == [17]
        # a long poll that times out after passing over records says where to go on
        pipeline_puts(broker.port, "tf5", 0, ["B"] * 3)
        r = c.get_tags("tf5", 0, 18, "A", max_wait_ms=200)
        assert isinstance(r, ev.Value) and decode_tagged_body(r.body) == (21, [])


def test_text_get_tags_past_the_unit_limit_says_where_to_go_on(broker, monkeypatch):
    n = filters_limits.MAX_FILTER_SCAN_UNITS + 1
    pipeline_puts(broker.port, "tf6", 0, ["B"] * n + ["A"], payload=b"")
    with broker.client() as c:
        r = c.get_tags("tf6", 0, 0, "A")
        assert isinstance(r, ev.Value) and decode_tagged_body(r.body) == (filters_limits.MAX_FILTER_SCAN_UNITS, [])
        nxt, records = decode_tagged_body(c.get_tags("tf6", 0, filters_limits.MAX_FILTER_SCAN_UNITS, "A").body)
        assert nxt == n + 1 and [o for o, _rec in records] == [n]
        stats = c.stats_dict()
    assert int(stats["filter_skipped_units"]) >= n


def test_metaq_consumer_with_an_attribute_filter_asks_the_broker(broker):
    pipeline_puts(broker.port, "tf7", 0, tags_1_in_100(500))
    before = log_read_bytes(broker)
    got, lock = [], threading.Lock()
    done = threading.Event()

    def handle(message):
        with lock:
            got.append((message.offset, message.attribute, message.properties.get("KEYS")))
            if len(got) == 10:
                done.set()

    consumer = Consumer("CG7", brokers=[url_of(broker)], long_poll_ms=500)
    consumer.subscribe("tf7", handle, filter={"T3", "T99"})
    consumer.start()
    try:
        assert done.wait(30)
    finally:
        consumer.close()
    wanted = sorted(i for i in range(500) if i % 100 in (3, 99))
    assert sorted(o for o, _a, _k in got) == wanted
    assert all(a == "T%d" % (o % 100) and k == "k%d" % o for o, a, k in got)
    read = log_read_bytes(broker) - before
    assert 0 < read <= 10 * 300  # the 10 wanted records (about 280 bytes each), none of the 490 others


@pytest.mark.slow
def test_official_push_consumer_with_a_tag_expression(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory(store={"flush": "async", "flush_interval_ms": 50})
    for q in range(4):
        pipeline_puts(b.port, "tf8", q, tags_1_in_100(300))
    before = log_read_bytes(b)
    got = received(run_peer(tmp_path / "c", "consume", "--ns", ns_of(b), "--topic", "tf8", "--group", "CG8",
                            "--subscription", "T5 || T50", "--expect", 24, "--linger", 1))
    assert len(got) == 24 and {m["tags"] for m in got} == {"T5", "T50"}
    assert sorted((m["queue_id"], m["queue_offset"]) for m in got) == sorted(
        (q, i) for q in range(4) for i in range(300) if i % 100 in (5, 50))
    assert log_read_bytes(b) - before <= 24 * 300
