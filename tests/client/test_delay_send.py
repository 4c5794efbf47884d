"""The Python client's delayed sends (``Message(delay_level=...)``) against a real broker."""

import time

import pytest

from metaq.client import Consumer, Message, Producer
from metaq.client.local import small_config
from tests.harness.broker import url_of, wait_for


@pytest.fixture
def delay_broker(broker_factory, tmp_path):
    return broker_factory(small_config(tmp_path / "data", delay={"levels": "1s 2s"}))


def test_delayed_send_arrives_after_its_delay_and_plain_sends_at_once(delay_broker):
    url = url_of(delay_broker)
    with Producer(brokers=[url]) as producer:
        sent_at = time.monotonic()
        delayed = producer.send(Message("orders", b"later", attribute="t", delay_level=2))
        plain = producer.send(Message("orders", b"now"))
    assert delayed.success and plain.success, (delayed, plain)
    assert delayed.offset is None and delayed.msg_id > 0
    assert plain.offset is not None

    seen = {}
    consumer = Consumer("g-delay", brokers=[url], long_poll_ms=500)
    consumer.subscribe("orders", lambda msg: seen.setdefault(msg.body, (time.monotonic() - sent_at, msg)))
    consumer.start()
    try:
        wait_for(lambda: len(seen) == 2, timeout=15, what="both messages")
    finally:
        consumer.close()
    assert set(seen) == {b"later", b"now"}
    waited, msg = seen[b"later"]
    assert waited >= 2.0 - 0.05, "a level-2 (2 s) message arrived after %.2f s" % waited
    assert msg.attribute == "t" and msg.id == delayed.msg_id
    assert seen[b"now"][0] < waited


def test_bad_delay_levels_are_refused_before_sending(delay_broker):
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            Message("orders", b"x", delay_level=bad)


def test_delayed_message_inside_a_transaction_is_refused_and_nothing_is_stored(delay_broker):
    url = url_of(delay_broker)
    with Producer(brokers=[url]) as producer:
        with pytest.raises(ValueError, match="transaction"):
            with producer.transaction():
                producer.send(Message("orders", b"tx", delay_level=1))
        assert producer.send(Message("orders", b"after")).success
    got = []
    consumer = Consumer("g-tx", brokers=[url], long_poll_ms=200)
    consumer.subscribe("orders", lambda msg: got.append(msg.body))
    consumer.start()
    try:
        wait_for(lambda: b"after" in got, timeout=10, what="the plain message")
        time.sleep(1.5)  # past level 1: a delayed copy would have arrived by now
    finally:
        consumer.close()
    assert got == [b"after"]
