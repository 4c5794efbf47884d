"""Auto-renew over gRPC against a real broker process (grpcio and our generated messages): a receive with
``auto_renew`` stays invisible past its invisible duration while its client lives, the handle it was delivered with
acks it (or nacks it, ending the renewal) after its first deadline, a forged handle or another group's is refused,
and a client's end (NotifyClientTermination, its Telemetry stream closed) makes what it held visible again soon.
The port's ``renew_invisible_ms`` is short here so that the renewals happen within a few seconds."""

import queue
import time

import pytest
from h2.events import ResponseReceived
from h2.settings import SettingCodes

from metaq.client.local import BrokerProcess, free_port, small_config
from tests.rmq5.test_grpc_port import SERVICE, Client, RawH2, _has, code, message
from tests.rmq5.test_pop_grpc import ack, bodies, receive

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

RENEW_MS = 4000  # the renewal's invisible duration: rounds every second, a renewal 2 s before the deadline


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpcrenew")
    cfg = small_config(wd / "data", grpc={"port": free_port(), "renew_invisible_ms": RENEW_MS},
                       store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def clients(broker):
    """Two clients of one group: ``a`` a push consumer (auto_renew), ``b`` another consumer."""
    port = broker.config["grpc"]["port"]
    a = Client(port, metadata=(("x-mq-client-id", "push-a@1@1@x"),))
    b = Client(port, metadata=(("x-mq-client-id", "other-b@1@1@x"),))
    yield a, b
    a.close()
    b.close()


def auto_receive(c, group, topic, batch=8):
    """A push consumer's ReceiveMessage: ``auto_renew`` and no invisible duration; ``(status, [message])``."""
    request = pb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=batch, auto_renew=True,
                                       message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
    request.long_polling_timeout.FromMilliseconds(0)
    call = c.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.ReceiveMessageResponse.FromString)
    responses = list(call(request, metadata=c.metadata, timeout=10))
    [st] = [r.status for r in responses if r.WhichOneof("content") == "status"]
    return st, [r.message for r in responses if r.WhichOneof("content") == "message"]


def change(c, group, topic, handle, ms):
    request = pb.ChangeInvisibleDurationRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                                receipt_handle=handle)
    request.invisible_duration.FromMilliseconds(ms)
    return c.unary("ChangeInvisibleDuration", request, pb.ChangeInvisibleDurationResponse)


def handle_of(m):
    return m.system_properties.receipt_handle


def first_deadline(m):
    return int(handle_of(m).split(":")[3])


def past_first_deadline(got, extra_s=1.0):
    time.sleep(max(0.0, max(first_deadline(m) for m in got) / 1000.0 - time.time()) + extra_s)


def returned(c, group, topic, want, within_s):
    """Receive (10 s invisible) until ``want`` messages came back or ``within_s``; the messages and the seconds."""
    start, got = time.monotonic(), []
    while len(got) < want and time.monotonic() - start < within_s:
        _st, more = receive(c, group, topic, invisible_ms=10_000, poll_ms=200)
        got += more
    return got, time.monotonic() - start


@pytest.mark.slow
def test_a_push_consumers_message_stays_invisible_and_its_handle_acks_it_after_the_first_deadline(clients):
    a, b = clients
    a.send(message("tq-renew", b"long"))
    st, got = auto_receive(a, "g-renew", "tq-renew")
    assert code(st) == "OK" and bodies(got) == [b"long"]
    assert got[0].system_properties.invisible_duration.ToMilliseconds() == RENEW_MS
    past_first_deadline(got, extra_s=RENEW_MS / 1000.0)  # two deadlines past: renewed at least twice
    _st, none = receive(b, "g-renew", "tq-renew", poll_ms=0)
    assert none == []  # the other consumer of the group does not get it meanwhile
    p, o, attempt, deadline = handle_of(got[0]).split(":")
    for forged in ["%s:%s:%s:%d" % (p, o, attempt, int(deadline) + 1), "%s:%s:2:%s" % (p, o, deadline), "x"]:
        assert code(ack(a, "g-renew", "tq-renew", handles=[forged]).status) == "INVALID_RECEIPT_HANDLE"
    assert code(ack(b, "g-other", "tq-renew", got[0]).status) == "INVALID_RECEIPT_HANDLE"  # another group's
    assert code(ack(a, "g-renew", "tq-renew", got[0]).status) == "OK"  # the delivery's handle, 2 deadlines on
    back, _s = returned(b, "g-renew", "tq-renew", 1, RENEW_MS / 1000.0 + 1)
    assert back == []  # acknowledged: never delivered again


@pytest.mark.slow
def test_a_nack_with_the_deliverys_handle_after_a_renewal_ends_the_renewal(clients):
    a, b = clients
    a.send(message("tq-renack", b"again"))
    _st, got = auto_receive(a, "g-renack", "tq-renack")
    past_first_deadline(got)
    r = change(a, "g-renack", "tq-renack", handle_of(got[0]), 0)  # the push consumer's nack
    assert code(r.status) == "OK"
    back, _s = returned(b, "g-renack", "tq-renack", 1, RENEW_MS / 1000.0)
    assert bodies(back) == [b"again"] and back[0].system_properties.delivery_attempt == 2
    assert code(ack(a, "g-renack", "tq-renack", got[0]).status) == "INVALID_RECEIPT_HANDLE"  # the nack's ended it
    assert code(ack(b, "g-renack", "tq-renack", back[0]).status) == "OK"


def test_a_client_that_terminates_has_its_messages_delivered_again_promptly(clients):
    a, b = clients
    a.send(message("tq-rterm", b"t1"), message("tq-rterm", b"t2"))
    _st, got = auto_receive(a, "g-rterm", "tq-rterm")
    assert len(got) == 2
    r = a.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest(group=pb.Resource(name="g-rterm")),
                pb.NotifyClientTerminationResponse)
    assert code(r.status) == "OK"
    back, seconds = returned(b, "g-rterm", "tq-rterm", 2, RENEW_MS / 1000.0)
    assert bodies(back) == [b"t1", b"t2"] and seconds < RENEW_MS / 1000.0 - 1  # well before their deadline
    assert code(ack(a, "g-rterm", "tq-rterm", *got).status) == "INVALID_RECEIPT_HANDLE"
    assert code(ack(b, "g-rterm", "tq-rterm", *back).status) == "OK"


def test_a_client_whose_telemetry_stream_closes_has_its_messages_delivered_again_promptly(clients):
    a, b = clients
    commands = queue.Queue()
    commands.put(pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PUSH_CONSUMER,
                                                          subscription=pb.Subscription())))
    telemetry = a.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=pb.TelemetryCommand.FromString)
    stream = telemetry(iter(commands.get, None), metadata=a.metadata, timeout=30)
    assert code(next(stream).status) == "OK"  # the stream is open, its Settings answered
    a.send(message("tq-rtele", b"held"))
    _st, got = auto_receive(a, "g-rtele", "tq-rtele")
    assert bodies(got) == [b"held"]
    stream.cancel()  # the client's only Telemetry stream ends (its process died, its channel closed)
    back, seconds = returned(b, "g-rtele", "tq-rtele", 1, RENEW_MS / 1000.0)
    assert bodies(back) == [b"held"] and seconds < RENEW_MS / 1000.0 - 1


@pytest.mark.slow
@pytest.mark.fault
def test_the_deliverys_handle_acks_the_renewed_message_after_a_kill_9_and_a_restart(tmp_path):
    """The renewal is journaled: the restarted broker (which renews nothing it did not deliver itself) still takes
    the handle the client was given, until the renewed deadline."""
    renew_ms = 15_000  # renewed 7.5 s before its deadline: the kill and the restart fit before the renewed one
    cfg = small_config(tmp_path / "data", grpc={"port": free_port(), "renew_invisible_ms": renew_ms},
                       store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        a = Client(b.config["grpc"]["port"], metadata=(("x-mq-client-id", "push-r@1@1@x"),))
        a.send(message("tq-rkill", b"kept"))
        _st, got = auto_receive(a, "g-rkill", "tq-rkill")
        past_first_deadline(got, extra_s=0.5)
        time.sleep(0.2)  # the renewal reaches the journal's async flush
        b.kill()
        b.start()
        a.close()
        a = Client(b.config["grpc"]["port"], metadata=(("x-mq-client-id", "push-r@1@1@x"),))
        r = ack(a, "g-rkill", "tq-rkill", got[0])
        assert code(r.status) == "OK", r
        _st, none = receive(a, "g-rkill", "tq-rkill", poll_ms=0)
        assert none == []
        a.close()
    finally:
        b.kill()


@pytest.mark.parametrize("auto_renew", [True, False], ids=["push", "simple"])
def test_a_receive_whose_answer_never_reached_the_client_is_delivered_again_promptly(broker, clients, auto_renew):
    """The client's window for the answer stays shut and it resets the call: what the receive took is visible again
    at once (not renewed while the client lives, nor held for the 60 s the simple receive asked)."""
    a, b = clients
    topic, group = "tq-unsent-%s" % auto_renew, "g-unsent-%s" % auto_renew
    a.send(message(topic, b"lost on the way"))
    raw = RawH2(broker.config["grpc"]["port"])
    try:
        raw.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 0})  # no byte of an answer may come
        request = pb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=8, auto_renew=auto_renew,
                                           message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
        if not auto_renew:
            request.invisible_duration.FromMilliseconds(60_000)
        request.long_polling_timeout.FromMilliseconds(0)
        body = request.SerializeToString()
        sid, _h = raw.open("ReceiveMessage")
        raw.conn.send_data(sid, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
        raw.flush()
        assert _has(ResponseReceived)(raw.events(_has(ResponseReceived)))  # answering: its messages taken
        raw.conn.reset_stream(sid)
        raw.flush()
        back, seconds = returned(b, group, topic, 1, 10)
        assert bodies(back) == [b"lost on the way"] and back[0].system_properties.delivery_attempt == 2, seconds
        assert code(ack(b, group, topic, *back).status) == "OK"
    finally:
        raw.close()
    assert "a receive of %s/%s did not reach its client: 1 messages" % (group, topic) in broker.log_text()
