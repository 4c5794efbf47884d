"""RocketMQ 5's delivery-time properties on the remoting port (README "Any delivery time"): TIMER_DELIVER_MS,
TIMER_DELAY_SEC, TIMER_DELAY_MS go to the timer store; bad values are a clear error and store nothing."""

import time

import pytest

from metaq.protocol.rocketmq.remoting import ResponseCode
from tests.harness.broker import consume_all, wait_for
from bench.rocketmq_peer import run_peer
from metaq.client.local import ns_of
from tests.harness.rocketmq import require_official_client, send_v1
from tests.harness.timers import timers


def now_ms():
    return int(time.time() * 1000)


def test_the_three_properties_deliver_when_due(rmq_broker, rc):
    t0 = now_ms()
    cases = [({"TIMER_DELIVER_MS": str(t0 + 800)}, t0 + 800), ({"TIMER_DELAY_SEC": "1"}, t0 + 1000),
             ({"TIMER_DELAY_MS": "600"}, t0 + 600), ({"TIMER_DELIVER_MS": "1000"}, t0)]  # past: at once
    for n, (props, _due) in enumerate(cases):
        r = send_v1(rc, "tT1", b"m%d" % n, queue=0, props=dict(props, TAGS="a"))
        assert r.code == ResponseCode.SUCCESS, r.remark
    with rmq_broker.client() as text:
        got = wait_for(lambda: (lambda g: g if len(g) == 4 else None)(consume_all(text, "tT1", 0)), 15,
                       "four deliveries", interval=0.1)
        for offset, rec in enumerate(got):
            due = cases[int(rec.payload[1:])][1]
            r = text.offset_at("tT1", 0, due)
            assert int(r.body) <= offset, ("delivered early", rec.payload)
        assert timers(text) == []


@pytest.mark.parametrize("props, why", [
    ({"TIMER_DELAY_SEC": "-1"}, "not a whole number"),
    ({"TIMER_DELAY_MS": "soon"}, "not a whole number"),
    ({"TIMER_DELIVER_MS": "1.5"}, "not a whole number"),
    ({"TIMER_DELAY_MS": "5", "TIMER_DELAY_SEC": "1"}, "not TIMER_DELAY_SEC and TIMER_DELAY_MS"),
    ({"TIMER_DELAY_MS": "5", "DELAY": "2"}, "both"),
    ({"TIMER_DELAY_SEC": "999999999999"}, "days ahead"),
])
def test_bad_timer_properties_are_refused_and_nothing_stored(rmq_broker, rc, props, why):
    r = send_v1(rc, "tT2", b"x", queue=0, props=props)
    assert r.code != ResponseCode.SUCCESS and why in r.remark, r.remark
    with rmq_broker.client() as text:
        assert timers(text) == []
        assert all(consume_all(text, "tT2", p) == [] for p in range(4))


def test_the_official_client_sets_a_delivery_delay(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory()
    sent = [s for s in run_peer(tmp_path / "p", "produce", "--ns", ns_of(b), "--topic", "tT3", "--count", 5,
                                "--property", "TIMER_DELAY_MS=1500") if "msg_id" in s]
    assert len(sent) == 5, sent
    with b.client() as text:
        got = wait_for(lambda: (lambda g: g if len(g) == 5 else None)(
            [(p, o, r) for p in range(4) for o, r in enumerate(consume_all(text, "tT3", p))]), 20, "five deliveries",
            interval=0.1)
        earliest_due = int(min(s["t"] for s in sent) * 1000) - 1000 + 1500  # sends answered within 1 s of the put
        for p, o, rec in got:
            r = text.offset_at("tT3", p, earliest_due)
            assert int(r.body) <= o, ("delivered early", rec.payload)
    assert sorted(r.payload for _p, _o, r in got) == sorted(b"m-%d" % i for i in range(5))
