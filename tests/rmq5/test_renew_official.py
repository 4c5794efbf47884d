"""Auto-renew against the official RocketMQ 5 Python client's PushConsumer (tests/rmq5/test_official_client.py says
how the client is driven): a handler that takes longer than the invisible duration gets each message once and its
acks succeed, while another consumer of the group gets nothing meanwhile; a push consumer whose process dies has
its unacknowledged messages delivered again promptly, not after their invisible duration. The port's
``renew_invisible_ms`` is 4 s here (60 s by default) so that a 10 s handler outlasts two of them."""

import time

import pytest

from metaq.client.local import BrokerProcess, free_port
from tests.rmq5.test_official_client import Official, client_python, endpoint, grpc_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RENEW_S = 4
HANDLER_S = 10


@pytest.fixture(scope="module")
def python():
    return client_python()


@pytest.fixture(scope="module")
def broker(tmp_path_factory, python):
    wd = tmp_path_factory.mktemp("renew5")
    cfg = grpc_config(wd / "data", free_port())
    cfg["grpc"]["renew_invisible_ms"] = RENEW_S * 1000
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture(scope="module")
def official(broker, python, tmp_path_factory):
    o = Official(python, endpoint(broker), tmp_path_factory.mktemp("renew5-home"))
    yield o
    o.close()


def watch(official, consumer, until, within_s):
    """Receive as ``consumer`` (acknowledging) until ``until()`` or ``within_s``; every message it got."""
    got, end = [], time.monotonic() + within_s
    while not until() and time.monotonic() < end:
        got += official.receive_all(consumer, 1, invisible_s=RENEW_S, timeout=1.0)
    return got


def test_a_handler_slower_than_the_invisible_duration_gets_each_message_once_and_its_acks_succeed(official):
    official.call("producer", name="p-renew", topics=["tq-o-renew"])
    official.call("send", producer="p-renew", messages=[{"topic": "tq-o-renew", "body": "r%d" % i} for i in range(2)])
    official.call("push", name="c-renew", group="g-o-renew", subscriptions={"tq-o-renew": ["TAG", "*"]},
                  sleep_s=HANDLER_S)
    deadline = time.monotonic() + 20
    while len(official.call("pushed", name="c-renew")["calls"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(official.call("pushed", name="c-renew")["calls"]) == [["r0", 1], ["r1", 1]]
    official.call("consumer", name="c-renew-other", group="g-o-renew", subscriptions={"tq-o-renew": ["TAG", "*"]})

    def both_done():
        return len(official.call("pushed", name="c-renew")["done"]) >= 2

    meanwhile = watch(official, "c-renew-other", both_done, HANDLER_S + 10)
    pushed = official.call("pushed", name="c-renew")
    assert sorted(pushed["done"]) == [["r0", 1], ["r1", 1]], pushed  # each once, never delivered again
    assert meanwhile == []  # the group's other consumer got none of them while the handler held them
    time.sleep(1)  # the acks the client sends once each handler returned
    official.call("shutdown", name="c-renew")  # whatever it still held would be visible again at once
    after = watch(official, "c-renew-other", lambda: False, 4)
    assert after == []  # acknowledged: the handle of the delivery acked it two renewals later
    assert sorted(official.call("pushed", name="c-renew")["calls"]) == [["r0", 1], ["r1", 1]]


def test_a_push_consumer_that_dies_has_its_unacknowledged_messages_delivered_again_promptly(official, broker,
                                                                                            python, tmp_path):
    official.call("producer", name="p-die", topics=["tq-o-die"])
    official.call("consumer", name="c-die-other", group="g-o-die", subscriptions={"tq-o-die": ["TAG", "*"]})
    dying = Official(python, endpoint(broker), tmp_path / "dying")
    try:
        dying.call("push", name="c-die", group="g-o-die", subscriptions={"tq-o-die": ["TAG", "*"]}, sleep_s=600)
        official.call("send", producer="p-die", messages=[{"topic": "tq-o-die", "body": "d0"}])
        deadline = time.monotonic() + 20
        while not dying.call("pushed", name="c-die")["calls"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert dying.call("pushed", name="c-die")["calls"] == [["d0", 1]]
        time.sleep(RENEW_S)  # renewed meanwhile: its deadline is up to RENEW_S ahead
        dying.proc.kill()  # its Telemetry stream closes with its connections
        dying.proc.wait(10)
        start = time.monotonic()
        got = official.receive_all("c-die-other", 1, invisible_s=RENEW_S, timeout=RENEW_S)
        seconds = time.monotonic() - start
        assert [(m["body"], m["attempt"]) for m in got] == [("d0", 2)]
        assert seconds < RENEW_S / 2, "delivered again %.1f s after the client died" % seconds
    finally:
        dying.close()
