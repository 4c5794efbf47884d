"""The text ``lookup`` extension and the metaq client's ``keys.lookup`` against a real broker (README "Key index")."""

import time

import pytest

from metaq import limits
from metaq.client import keys
from metaq.client.local import small_config
from metaq.client.message import Message
from metaq.protocol import events as ev
from metaq.protocol.keylookup import decode_lookup_body

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
        for i in range(limits.MAX_KEY_QUERY_RESULTS + 5):
            put_keyed(c, "tL", b"%d" % i, "k")
        assert eventually(lambda: len(list(keys.lookup(Conn(c), "tL", "k"))) == limits.MAX_KEY_QUERY_RESULTS + 5)
        r = c.call(ev.Lookup("tL", "k", 0, 2**63 - 1, 10 ** 9, "", 7))
        page = decode_lookup_body(r.body)
        assert r.code == 200 and len(page.items) == limits.MAX_KEY_QUERY_RESULTS and page.cursor
        rest = decode_lookup_body(c.call(ev.Lookup("tL", "k", 0, 2**63 - 1, 100, page.cursor, 8)).body)
        assert len(rest.items) == 5 and rest.cursor is None
        assert [int(i.data[-1:]) for i in rest.items][-1] == 0  # the oldest last
        assert c.call(ev.Lookup("tL", "bad:cursor", 0, 1, 1, "x", 9)).code == 400
        long_key = "k" * (limits.MAX_KEY_BYTES + 1)
        c.send(("lookup tL %s 0 1 1 - 10\r\n" % long_key).encode())
        assert c.read_event().code == 400
        at_limit = c.call(ev.Lookup("tL", "k" * limits.MAX_KEY_BYTES, 0, 1, 1, "", 11))
        assert at_limit.code == 200 and decode_lookup_body(at_limit.body).items == []


def test_the_client_sends_its_message_key_as_keys():
    flag, data = Message("t", b"x", key="order-1").encode()
    assert b"\x02KEYS\x01order-1" in data
    flag, data = Message("t", b"x", key="order-1", properties={"KEYS": "mine"}).encode()
    assert b"KEYS\x01mine" in data and b"order-1" not in data
