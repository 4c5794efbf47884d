"""``putb`` against a real broker: stored records equal single puts', all or nothing, the write decision, limits."""

import signal
import time

from metaq import limits
from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.putbatch import PutBatch, decode_runs, expand_runs, sub_record
from metaq.protocol.text import serialize
from tests.harness.acl import login, secured_config
from tests.harness.broker import consume_all
from tests.harness.replication import sync_pair


def batch_body(topic, items):
    """``items``: ``(partition, payload, attribute)``; the sub-records, numbered."""
    out = []
    for k, (partition, payload, attribute) in enumerate(items):
        flag, data = encode_payload(payload, attribute)
        out.append(sub_record(topic.encode(), partition, flag, data, metaq_checksum(data), k))
    return b"".join(out)


def putb(client, topic, items, count=None, body=None):
    body = batch_body(topic, items) if body is None else body
    return client.call(PutBatch(topic, len(items) if count is None else count, body, client.opaque()))


def placed(reply):
    assert isinstance(reply, ev.Result) and reply.code == 200, reply
    return expand_runs(decode_runs(reply.body))


def held(broker, topic, partitions=4):
    with broker.client() as c:
        return {p: consume_all(c, topic, p) for p in range(partitions)}


def test_batch_stores_the_records_single_puts_store(broker):
    items = [(k % 3, b"m%d" % k + b"x" * k, "k=%d" % k if k % 4 == 0 else None) for k in range(300)]
    with broker.client() as c:
        where = placed(putb(c, "tbatch", items))
        singles = [c.put_ok("tsingle", payload, partition, attribute) for partition, payload, attribute in items]
    assert [(p, o) for _i, p, o in where] == [(p, o) for _i, p, o in singles]  # same partitions, same offsets
    assert len({i for i, _p, _o in where}) == len(items)
    batch, single = held(broker, "tbatch"), held(broker, "tsingle")
    for (msg_id, p, offset), (_partition, payload, attribute) in zip(where, items, strict=True):
        b, s = batch[p][offset], single[p][offset]
        assert b.msg_id == msg_id and (b.payload, b.attribute) == (payload, attribute)
        assert (b.flag, b.data, b.checksum) == (s.flag, s.data, s.checksum)


def test_a_bad_sub_record_stores_nothing(broker):
    good = [(0, b"a%d" % k, None) for k in range(5)]
    body = batch_body("tnone", good)
    with broker.client() as c:
        c.put_ok("tnone", b"first", 0)
        wrong_checksum = body.replace(b"put tnone 0 2 0 %d 2\r\n" % metaq_checksum(b"a2"),
                                      b"put tnone 0 2 0 %d 2\r\n" % (metaq_checksum(b"a2") ^ 1))
        assert wrong_checksum != body
        cases = {
            "checksum": dict(body=wrong_checksum),
            "count says more": dict(count=6, body=body),
            "count says fewer": dict(count=4, body=body),
            "truncated": dict(body=body[:-1]),
            "partition": dict(body=body + batch_body("tnone", [(4, b"z", None)]), count=6),
            "topic": dict(body=body + batch_body("tother", [(0, b"z", None)]), count=6),
            "not a put": dict(body=body[:10] + b"X" + body[11:]),
        }
        for name, kw in cases.items():
            r = putb(c, "tnone", good, **kw)
            assert isinstance(r, ev.Result) and r.code == 400, (name, r)
            assert b"nothing was stored" in r.body, (name, r.body)
        assert c.put_ok("tnone", b"after", 0)[2] == 1  # the connection goes on; offset 1: none of the above stored
    assert [r.payload for r in held(broker, "tnone")[0]] == [b"first", b"after"]


def test_batch_limits_at_the_limit_and_one_past(broker):
    items = [(k % 4, b"", None) for k in range(limits.MAX_BATCH_MESSAGES)]
    with broker.client() as c:
        assert len(placed(putb(c, "tlimit", items))) == limits.MAX_BATCH_MESSAGES
        r = putb(c, "tlimit", items + [(0, b"", None)])
        assert r.code == 400 and b"count" in r.body, r
        assert c.put_ok("tlimit", b"x", 0)[2] == limits.MAX_BATCH_MESSAGES // 4  # nothing of the refused one
        max_body = 256 * 1024  # small_config's limits.max_body_bytes
        n = max_body - len(b"put tlimit 1 %d 0 -1 0\r\n" % max_body)  # a sub-record of exactly max_body bytes
        exact = sub_record(b"tlimit", 1, 0, b"y" * n, -1, 0)
        assert len(exact) == max_body
        assert len(placed(c.call(PutBatch("tlimit", 1, exact, 5)))) == 1
        over = sub_record(b"tlimit", 1, 0, b"y" * (n + 1), -1, 0)
        c.send(serialize(PutBatch("tlimit", 1, over, 6)))
        r = c.read_event()
        assert r.code == 400 and b"exceeds the limit" in r.body, r


def test_a_batch_to_a_topic_the_user_may_not_write_is_refused(broker_factory, tmp_path):
    broker = broker_factory(secured_config(tmp_path))
    with login(broker, "bob") as bob:
        assert len(placed(putb(bob, "orders", [(0, b"ok", None)]))) == 1
        r = putb(bob, "payroll", [(0, b"no", None)])
        assert r.code == 403, r
    with login(broker, "admin") as admin:
        assert consume_all(admin, "payroll", 0) == []


def test_an_acknowledged_sync_batch_survives_kill_9(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", store={"flush": "sync"}))
    items = [(k % 2, b"d" * 200, None) for k in range(1000)]  # 10 batches pass a 1 MiB segment: a roll mid-batch
    with broker.client() as c:
        where = []
        for _ in range(10):
            where += placed(putb(c, "tdurable", items))
    broker.kill()  # kill -9 right after the acknowledgements: what they acknowledged is on disk
    broker.start()
    stored = held(broker, "tdurable", 2)
    assert sum(len(v) for v in stored.values()) == 10_000
    assert [(stored[p][offset].msg_id, stored[p][offset].payload) for _i, p, offset in where] == \
        [(i, b"d" * 200) for i, _p, _o in where]


def test_an_async_batch_wakes_a_long_poll(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", store={"flush": "async"}))
    with broker.client() as waiting, broker.client() as c:
        c.put_ok("twake", b"create", 1)
        waiting.send(serialize(ev.Get("twake", "g", 1, 1, 1 << 20, 9, 10_000)))
        time.sleep(0.3)  # parked by now
        placed(putb(c, "twake", [(0, b"zero", None), (1, b"one", None)]))
        r = waiting.read_event()
    assert isinstance(r, ev.Value) and b"one" in r.body, r


def test_a_batch_is_acknowledged_with_sync_replication_once_the_slave_has_it(broker_factory, tmp_path):
    master, slave = sync_pair(broker_factory, tmp_path, sync_timeout_ms=500)
    items = [(k % 4, b"r%d" % k, None) for k in range(200)]
    with master.client() as c:
        where = placed(putb(c, "trepl", items))  # answered: the slave has every record
        with slave.client() as s:
            for msg_id, p, offset in where[::17]:
                rec = s.get_records("trepl", p, offset)[0]
                assert rec.msg_id == msg_id
        slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: no slave confirms the next batch
        try:
            r = putb(c, "trepl", items)
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
        finally:
            slave.proc.send_signal(signal.SIGCONT)
