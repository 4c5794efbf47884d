"""The Python client's timed sends (``Message(deliver_at=...)``, ``Message(delay=...)``) and ``Producer.cancel``
against a real broker (README "Any delivery time", "Cancel")."""

import datetime
import time

import pytest

from metaq.client import Consumer, Message, Producer
from metaq.client.timers import when_of
from tests.harness.broker import url_of, wait_for


def test_when_of():
    assert when_of() is None
    assert when_of(deliver_at=1_700_000_000_123) == "@1700000000123"
    at = datetime.datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
    assert when_of(deliver_at=at) == "@%d" % round(at.timestamp() * 1000)
    assert when_of(delay=datetime.timedelta(milliseconds=1500)) == "+1500"
    assert when_of(delay=2.25) == "+2250"
    assert when_of(delay=0) == "+0"


@pytest.mark.parametrize("kwargs", [{"delay": -1}, {"delay": "5"}, {"delay": float("nan")}, {"delay": True},
                                    {"deliver_at": -5}, {"deliver_at": 1.5}, {"deliver_at": "tomorrow"},
                                    {"delay": datetime.timedelta(seconds=-1)}, {"delay": 1, "deliver_at": 1},
                                    {"delay": 1, "delay_level": 2}, {"delay": 1, "priority": 0}])
def test_bad_times_are_refused_before_sending(kwargs):
    with pytest.raises(ValueError):
        Message("orders", b"x", **kwargs)


def test_timed_sends_arrive_when_due_and_cancel_says_which(broker):
    url = url_of(broker)
    with Producer(brokers=[url]) as producer:
        sent_at = time.time()
        later = producer.send(Message("orders", b"later", attribute="t", delay=1.0))
        at = producer.send(Message("orders", b"at", deliver_at=datetime.datetime.now() + datetime.timedelta(
            milliseconds=500)))
        gone = producer.send(Message("orders", b"cancelled", delay=datetime.timedelta(days=30)))
        assert later.success and at.success and gone.success, (later, at, gone)
        assert later.offset is None and later.msg_id > 0
        assert producer.cancel(gone.msg_id) == "cancelled"
        assert producer.cancel(gone.msg_id) == "cancelled"
        assert producer.cancel(later.msg_id + 1) == "unknown"
        seen = {}
        consumer = Consumer("g-timer", brokers=[url], long_poll_ms=300)
        consumer.subscribe("orders", lambda msg: seen.setdefault(msg.body, (time.time(), msg)))
        consumer.start()
        try:
            wait_for(lambda: len(seen) == 2, timeout=15, what="both messages")
            assert producer.cancel(later.msg_id) == "delivered"
        finally:
            consumer.close()
    assert set(seen) == {b"later", b"at"}
    assert seen[b"later"][1].id == later.msg_id and seen[b"later"][1].attribute == "t"
    assert seen[b"later"][0] >= sent_at + 1.0 - 0.01  # the broker's clock is this host's


def test_timed_message_in_a_transaction_or_idempotent_is_refused(broker):
    url = url_of(broker)
    with Producer(brokers=[url]) as producer:
        with pytest.raises(ValueError, match="transaction"):
            with producer.transaction():
                producer.send(Message("orders", b"tx", delay=1))
