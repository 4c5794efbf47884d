"""The gRPC MessagingService is a dispatcher: every RPC it serves is handled by the group of its operations (routes,
sends, receives, transactions' half messages, pulls), each in its own module, none by the service itself. No
broker, no network."""

from types import SimpleNamespace

from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.rpcs import MessagingService

#: Each served unary RPC -> the module of the group that handles it.
GROUPS = {
    "QueryRoute": "routing", "Heartbeat": "routing", "NotifyClientTermination": "routing",
    "SendMessage": "sends", "RecallMessage": "sends",
    "QueryAssignment": "receives", "ReceiveMessage": "receives", "AckMessage": "receives",
    "ChangeInvisibleDuration": "receives", "ForwardMessageToDeadLetterQueue": "receives",
    "EndTransaction": "halves",
    "PullMessage": "pulls", "UpdateOffset": "pulls", "GetOffset": "pulls", "QueryOffset": "pulls",
}


def _service():
    from metaq.rmq5.pulls import PullService
    pulls = PullService(None, None, None, None, None, lambda: ("127.0.0.1", 1), 1 << 20)
    return MessagingService(None, None, None, "b", 1024, lambda: ("127.0.0.1", 1), pulls=pulls)


def test_every_rpc_is_handled_by_its_groups_module_not_the_service():
    service = _service()
    handled = {rpc: type(handler.__self__).__module__.rsplit(".", 1)[1] for rpc, (_t, handler) in service.unary.items()}
    assert handled == GROUPS
    assert all(service.kind(rpc) == "unary" for rpc in GROUPS)
    assert service.kind("Telemetry") == "telemetry" and service.kind("SyncLiteSubscription") == "later"
    assert service.kind("NoSuchRpc") is None


def test_the_service_answers_a_call_through_its_group_and_counts_it():
    """A Heartbeat passes the dispatcher's checks (a client id, no authentication) and is answered by Routes."""
    service = _service()
    call = SimpleNamespace(metadata={"x-mq-client-id": "c1"}, user="", session=None)
    answer = pb.HeartbeatResponse.FromString(service.call("Heartbeat", call, pb.HeartbeatRequest().SerializeToString()))
    assert answer.status.code == pb.OK
    refused = pb.HeartbeatResponse.FromString(service.call("Heartbeat", SimpleNamespace(metadata={}), b""))
    assert refused.status.code == pb.CLIENT_ID_REQUIRED
    assert service.counts == {"calls": 2, "refused": 1, "sent": 0, "checks_sent": 0, "checks_unsent": 0,
                              "given_up": 0}


def test_a_refused_receive_is_a_status_then_a_delivery_timestamp(monkeypatch):
    monkeypatch.setattr("metaq.rmq5.calls.now_ms", lambda: 1_700_000_000_123)
    service = _service()
    status, stamp = [pb.ReceiveMessageResponse.FromString(r) for r in
                     service.call("ReceiveMessage", SimpleNamespace(metadata={}), b"")]
    assert status.WhichOneof("content") == "status" and status.status.code == pb.CLIENT_ID_REQUIRED
    assert stamp.WhichOneof("content") == "delivery_timestamp"
    assert stamp.delivery_timestamp.ToMilliseconds() == 1_700_000_000_123


def test_a_delivery_timestamp_is_written_as_protobuf_writes_it(monkeypatch):
    from metaq.rmq5.calls import delivered_now
    for ms in (1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_999, 1_000, 1):
        monkeypatch.setattr("metaq.rmq5.calls.now_ms", lambda ms=ms: ms)
        expected = pb.ReceiveMessageResponse()
        expected.delivery_timestamp.FromMilliseconds(ms)
        assert delivered_now() == expected.SerializeToString(), ms
