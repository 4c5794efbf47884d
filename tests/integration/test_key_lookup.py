"""The text ``lookup`` extension and the metaq client's ``keys.lookup`` against a real broker (README "Key index")."""

import time

import pytest

from metaq.keys import limits as keys_limits
from metaq.client import keys
from metaq.client.local import small_config
from metaq.client.message import Message
from metaq.protocol import events as ev
from metaq.keys.wire import decode_lookup_body

FAST = {"store": {"flush": "async", "flush_interval_ms": 20}}


class Conn:
    """A raw TextClient as the ``BrokerConnection`` ``keys.lookup`` takes."""

    def __init__(self, client):
        self.client = client

    def call(self, event, timeout=None):
        return self.client.call(event)


def put_keyed(c, topic, body, key_words, partition=0):
    c.put_ok(topic, body, partition, attribute="\x02KEYS\x01" + key_words)


def eventually(fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


@pytest.mark.slow
def test_a_key_with_ten_thousand_messages_comes_back_complete_by_pages(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "d", **FAST))
    with b.client() as c:
        for i in range(10_000):
            put_keyed(c, "tKey", b"%d" % i, "hot k%d" % i, partition=i % 2)
        put_keyed(c, "tKey", b"last", "other")
        assert eventually(lambda: list(keys.lookup(Conn(c), "tKey", "other")))
        got = list(keys.lookup(Conn(c), "tKey", "hot"))
        assert sorted(int(m.body) for m in got) == list(range(10_000))
        assert [m.body for m in keys.lookup(Conn(c), "tKey", "k77")] == [b"77"]
        assert got[0].properties["KEYS"] == "hot k9999" and {m.partition for m in got} == {0, 1}


def test_the_text_lookup_pages_bounds_and_refusals(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "d", **FAST))
    with b.client() as c:
        for i in range(keys_limits.MAX_KEY_QUERY_RESULTS + 5):
            put_keyed(c, "tL", b"%d" % i, "k")
        assert eventually(lambda: len(list(keys.lookup(Conn(c), "tL", "k"))) == keys_limits.MAX_KEY_QUERY_RESULTS + 5)
        r = c.call(ev.Lookup("tL", "k", 0, 2**63 - 1, 10 ** 9, "", 7))
        page = decode_lookup_body(r.body)
        assert r.code == 200 and len(page.items) == keys_limits.MAX_KEY_QUERY_RESULTS and page.cursor
        rest = decode_lookup_body(c.call(ev.Lookup("tL", "k", 0, 2**63 - 1, 100, page.cursor, 8)).body)
        assert len(rest.items) == 5 and rest.cursor is None
        assert [int(i.data[-1:]) for i in rest.items][-1] == 0  # the oldest last
        assert c.call(ev.Lookup("tL", "bad:cursor", 0, 1, 1, "x", 9)).code == 400
        long_key = "k" * (keys_limits.MAX_KEY_BYTES + 1)
        c.send(("lookup tL %s 0 1 1 - 10\r\n" % long_key).encode())
        assert c.read_event().code == 400
        at_limit = c.call(ev.Lookup("tL", "k" * keys_limits.MAX_KEY_BYTES, 0, 1, 1, "", 11))
        assert at_limit.code == 200 and decode_lookup_body(at_limit.body).items == []


def test_the_client_sends_its_message_key_as_keys():
    flag, data = Message("t", b"x", key="order-1").encode()
    assert b"\x02KEYS\x01order-1" in data
    flag, data = Message("t", b"x", key="order-1", properties={"KEYS": "mine"}).encode()
    assert b"KEYS\x01mine" in data and b"order-1" not in data


def test_consumer_lookup_finds_a_keys_messages_on_every_partition_within_the_time_bounds(broker_factory, tmp_path):
    from metaq.client import Consumer, Producer
    from metaq.client.message import Partition
    from tests.harness.broker import url_of

    b = broker_factory(small_config(tmp_path / "d", **FAST))
    with Producer(brokers=[url_of(b)]) as producer:  # round robin: the key's messages on each partition
        sent = [producer.send(Message("tCL", b"first %d" % i, key="order-9")) for i in range(4)]
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        sent += [producer.send(Message("tCL", b"later %d" % i, key="order-9")) for i in range(2)]
        producer.send(Message("tCL", b"someone else", key="order-10"))
    assert all(r.success for r in sent)
    with Consumer("lookups", brokers=[url_of(b)]) as consumer:
        got = eventually(lambda: [m for m in consumer.lookup("tCL", "order-9")] if len(
            consumer.lookup("tCL", "order-9")) == 6 else None)
        assert got, "the key's six messages were not all indexed within 10 s"
        assert [m.body for m in got[:2]] == [b"later 1", b"later 0"]  # newest first
        assert sorted((str(m.partition), m.offset) for m in got) == sorted((str(r.partition), r.offset) for r in sent)
        assert all(isinstance(m.partition, Partition) for m in got)
        assert [m.body for m in consumer.lookup("tCL", "order-9", since=middle)] == [b"later 1", b"later 0"]
        assert len(consumer.lookup("tCL", "order-9", until=middle)) == 4
        assert consumer.lookup("tCL", "no-such-key") == []


def test_the_readme_key_index_example_runs_as_written(tmp_path):
    """docs/messaging.md's "Key index" example against a broker configured like `make run`."""
    import pathlib
    import re
    import subprocess
    import sys

    import yaml

    from metaq.client.local import BrokerProcess

    root = pathlib.Path(__file__).resolve().parents[2]
    from tests.harness.docs import section as doc_section

    [code] = re.findall(r"```python\n(.*?)```", doc_section("messaging.md", "Key index"), re.S)
    with open(root / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg["broker"]["port"] = 0
    cfg["broker"]["data_dir"] = str(tmp_path / "data")
    cfg["mqtt"]["port"] = 0  # conf/server.yaml's 1883 may be taken (a make run of the reader's, another test)
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        out = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:8123", "127.0.0.1:%d" % b.port)],
                             cwd=str(tmp_path), env={"PYTHONPATH": str(root), "HOME": str(tmp_path)},
                             capture_output=True, text=True, timeout=60)
    finally:
        b.kill()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["b'order 42 shipped'", "b'order 42 paid'", "b'order 42 created'"]
