"""Where a gRPC ReceiveMessage is answered (docs/rocketmq5.md "Receives"), against real broker processes: with
authentication off a receive that finds messages at once (or asked for no long poll) is answered on its connection's
reader, one that long-polls from its greenlet; with authentication on, always from its greenlet. Either way the
answers are the same."""

import threading
import time

import pytest

from tests.harness.grpc_turns import inline_and_spawned
from tests.rmq5.test_grpc_port import Client, code, credentials, message
from tests.rmq5.test_pop_grpc import ack, receive

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

TOPIC, GROUP = "orders-recvturn", "billing"


def _seen(st, got):
    """What a client can compare between brokers: the status, then each message's body, tag, attempt and invisible
    duration, in body order (receipt handles hold deadlines)."""
    return code(st), sorted((m.body, m.system_properties.tag, m.system_properties.delivery_attempt,
                             m.system_properties.invisible_duration.ToMilliseconds()) for m in got)


def _receives(port, metadata):
    """Receives of every kind: found at once, nothing there without a long poll, every message filtered out, a
    long poll a send ends, a redelivery, and a refusal."""
    c = Client(port, metadata=metadata)
    other = Client(port, metadata=metadata)
    try:
        out = []
        sent = [message(TOPIC, b"m%d" % i, tag="Wanted" if i % 2 else "Other") for i in range(4)]
        assert code(c.send(*sent).status) == "OK"
        st, got = receive(c, GROUP, TOPIC, batch=8, invisible_ms=2000)  # found at once
        out.append(_seen(st, got))
        got.sort(key=lambda m: m.body)
        assert code(ack(c, GROUP, TOPIC, *got[:3]).status) == "OK"
        out.append(_seen(*receive(c, GROUP, TOPIC, batch=4)))  # nothing there, no long poll
        out.append(_seen(*receive(c, GROUP, TOPIC, batch=4, poll_ms=8000)))  # the unacknowledged one, again
        assert code(c.send(*[message(TOPIC + "-f", b"f%d" % i, tag="Other") for i in range(3)]).status) == "OK"
        wanted = pb.FilterExpression(type=pb.TAG, expression="Wanted")
        out.append(_seen(*receive(c, GROUP, TOPIC + "-f", batch=4, expression=wanted)))  # every one filtered out
        polled = {}

        def poll():
            polled["got"] = receive(other, GROUP, TOPIC + "-late", batch=4, poll_ms=8000)

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.5)  # the receive is parked in its long poll
        assert "got" not in polled
        assert code(c.send(message(TOPIC + "-late", b"late")).status) == "OK"
        t.join(10)
        out.append(_seen(*polled["got"]))
        out.append(_seen(*receive(c, "no spaces", TOPIC, batch=4)))
        return out
    finally:
        c.close()
        other.close()


def test_a_receive_answered_on_the_reader_equals_one_answered_from_its_greenlet(tmp_path):
    """The same receives to two fresh brokers: authentication off answers those that find messages at once on the
    reader, on (alice's credentials) every one from its greenlet; every answer is the same."""
    inline, spawned = inline_and_spawned(tmp_path, _receives, "recv@1@1@x", credentials)
    assert inline == spawned
    assert [s for s, _m in inline] == ["OK", "MESSAGE_NOT_FOUND", "OK", "MESSAGE_NOT_FOUND", "OK",
                                       "ILLEGAL_CONSUMER_GROUP"]
    assert [m[0] for m in inline[0][1]] == [b"m0", b"m1", b"m2", b"m3"]
    assert [m[0] for m in inline[2][1]] == [b"m3"] and inline[2][1][0][2] == 2  # redelivered, attempt 2
    assert [m[0] for m in inline[4][1]] == [b"late"]
