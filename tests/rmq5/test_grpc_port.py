"""The gRPC port against a real broker process: grpcio's client over our generated messages, and a raw HTTP/2
client (h2) for what grpcio would never send (more streams than announced, an oversized header block).

The official RocketMQ 5 Python client (``rocketmq-python-client``) installs the import package ``rocketmq``, the
one the test extra's RocketMQ 4 client (``rocketmq==0.4.4``) owns: the two cannot share an environment, so these
tests speak the protocol through grpcio with the messages generated from metaq/rmq5/messages.proto."""

import socket
import ssl
import time
import uuid
import queue

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from metaq.client.raw import TextClient
from metaq.protocol import events as ev
from metaq.protocol.message import iter_records
from metaq.protocol.properties import split_attribute
from tests.harness.acl import SECRETS, write_acl

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")
h2_connection = pytest.importorskip("h2.connection")
from h2.config import H2Configuration  # noqa: E402
from h2.errors import ErrorCodes  # noqa: E402
from h2.settings import SettingCodes, Settings  # noqa: E402
from h2.events import (ConnectionTerminated, DataReceived, PingAckReceived, ResponseReceived, StreamReset,  # noqa: E402
                       TrailersReceived)

pytestmark = pytest.mark.integration

SERVICE = "/apache.rocketmq.v2.MessagingService/"
MAX_BODY = 64 * 1024
MAX_MESSAGE = MAX_BODY + 64 * 1024  # the least the port takes with this body limit
MAX_STREAMS = 3
MAX_HEADERS = 4096


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpc5")
    cfg = small_config(wd / "data", grpc={"port": free_port(), "max_message_bytes": MAX_MESSAGE,
                                          "max_streams_per_connection": MAX_STREAMS, "max_header_bytes": MAX_HEADERS},
                       store={"flush": "async", "flush_interval_ms": 20}, limits={"max_body_bytes": MAX_BODY})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


class Client:
    """MessagingService over one grpcio channel; ``metadata`` added to every call."""

    def __init__(self, port, metadata=(("x-mq-client-id", "test@1@1@x"),)):
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.metadata = list(metadata)

    def unary(self, rpc, request, response_type, metadata=None, timeout=10):
        call = self.channel.unary_unary(SERVICE + rpc, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_type.FromString)
        return call(request, metadata=self.metadata if metadata is None else metadata, timeout=timeout)

    def raw(self, rpc, data, timeout=10):
        call = self.channel.unary_unary(SERVICE + rpc, request_serializer=None, response_deserializer=None)
        return call(data, metadata=self.metadata, timeout=timeout)

    def route(self, topic):
        return self.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=topic)), pb.QueryRouteResponse)

    def send(self, *messages, metadata=None):
        return self.unary("SendMessage", pb.SendMessageRequest(messages=messages), pb.SendMessageResponse, metadata)

    def close(self):
        self.channel.close()


@pytest.fixture
def client(broker):
    c = Client(broker.config["grpc"]["port"])
    yield c
    c.close()


def message(topic, body, tag=None, keys=(), group=None, deliver_ms=None, props=None, message_id=None):
    m = pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=props or {})
    sp = m.system_properties
    sp.message_id = uuid.uuid4().hex.upper() if message_id is None else message_id
    sp.message_type = pb.DELAY if deliver_ms else pb.FIFO if group else pb.NORMAL
    sp.born_timestamp.GetCurrentTime()
    if tag is not None:
        sp.tag = tag
    sp.keys.extend(keys)
    if group is not None:
        sp.message_group = group
    if deliver_ms is not None:
        sp.delivery_timestamp.FromMilliseconds(deliver_ms)
    return m


def stored(b, topic, partitions=4, ssl_context=None):
    """Every record of ``topic`` a text ``get`` reads, by partition: ``{partition: [record]}``."""
    out = {}
    with TextClient(b.host, b.port, 10, ssl_context) as text:
        for p in range(partitions):
            r = text.get(topic, p, 0, 1 << 20)
            out[p] = [rec for rec, _end in iter_records(r.body)] if isinstance(r, ev.Value) else []
    return out


def code(status):
    return pb.Code.Name(status.code)


# -- routes, sends, a text get reading them ----------------------------------------------------------------------


def test_a_route_names_this_port_as_broker_0_of_every_queue(broker, client):
    r = client.route("tq-route")
    assert code(r.status) == "OK"
    assert [q.id for q in r.message_queues] == [0, 1, 2, 3]  # t* topics have 4 partitions (small_config)
    q = r.message_queues[0]
    assert q.topic.name == "tq-route" and q.permission == pb.READ_WRITE and q.broker.id == 0
    assert [(a.host, a.port) for a in q.broker.endpoints.addresses] == [("127.0.0.1", broker.config["grpc"]["port"])]
    assert q.broker.endpoints.scheme == pb.IPv4
    assert set(q.accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}
    assert code(client.route("no spaces allowed").status) == "TOPIC_NOT_FOUND"


def test_sends_are_read_by_a_text_get_with_their_tag_keys_and_properties(broker, client):
    msgs = [message("tq-send", b"body-%d" % i, tag="TagA", keys=["k%d" % i, "order-%d" % i],
                    props={"color": "red", "n": str(i)}) for i in range(3)]
    r = client.send(*msgs)
    assert code(r.status) == "OK"
    assert [e.message_id for e in r.entries] == [m.system_properties.message_id for m in msgs]
    assert all(code(e.status) == "OK" for e in r.entries)
    got = {}
    for p, recs in stored(broker, "tq-send").items():
        for rec in recs:
            tags, props, from_rocketmq = split_attribute(rec.attribute)
            got[rec.payload] = (tags, props, from_rocketmq, p)
    assert sorted(got) == [b"body-0", b"body-1", b"body-2"]
    for i, m in enumerate(msgs):
        tags, props, from_rocketmq, p = got[b"body-%d" % i]
        assert from_rocketmq and tags == "TagA"
        assert props["KEYS"] == "k%d order-%d" % (i, i) and props["UNIQ_KEY"] == m.system_properties.message_id
        assert props["color"] == "red" and props["n"] == str(i)
        entry = r.entries[i]
        assert got[b"body-%d" % i][3] in range(4) and entry.offset >= 0


def test_a_message_group_keeps_one_queue_and_its_order(broker, client):
    for i in range(8):
        assert code(client.send(message("tq-fifo", b"g-%d" % i, group="order-7")).status) == "OK"
    by_queue = {p: [rec.payload for rec in recs] for p, recs in stored(broker, "tq-fifo").items() if recs}
    assert list(by_queue.values()) == [[b"g-%d" % i for i in range(8)]]  # one queue, in the order sent
    (p, _), = by_queue.items()
    _tags, props, _r = split_attribute(stored(broker, "tq-fifo")[p][0].attribute)
    assert props["__SHARDINGKEY"] == "order-7"


def test_a_delivery_time_holds_the_message_in_metaqs_timers_until_then(broker, client):
    due = int(time.time() * 1000) + 1500
    r = client.send(message("tq-timed", b"later", deliver_ms=due, tag="T"))
    assert code(r.status) == "OK"
    assert not any(stored(broker, "tq-timed").values())  # not visible before its time
    deadline = time.time() + 15
    while time.time() < deadline:
        recs = [rec for recs in stored(broker, "tq-timed").values() for rec in recs]
        if recs:
            break
        time.sleep(0.2)
    assert [rec.payload for rec in recs] == [b"later"]
    assert time.time() * 1000 >= due
    _tags, props, _r = split_attribute(recs[0].attribute)
    assert props["TIMER_DELIVER_MS"] == str(due)


def recall(client, topic, handle):
    return client.unary("RecallMessage", pb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle),
                        pb.RecallMessageResponse)


def test_a_recalled_timed_message_is_never_delivered(broker, client):
    due = int(time.time() * 1000) + 1500
    [entry] = client.send(message("tq-recall", b"recalled", deliver_ms=due)).entries
    [kept] = client.send(message("tq-recall", b"kept", deliver_ms=due)).entries
    assert entry.recall_handle and kept.recall_handle and entry.recall_handle != kept.recall_handle
    assert code(recall(client, "tq-other", entry.recall_handle).status) == "BAD_REQUEST"  # another topic
    assert code(recall(client, "tq-recall", "bm90IGEgaGFuZGxl").status) == "BAD_REQUEST"  # "not a handle"
    assert code(recall(client, "tq-recall", "%%%").status) == "BAD_REQUEST"
    r = recall(client, "tq-recall", entry.recall_handle)
    assert code(r.status) == "OK" and r.message_id == entry.message_id
    assert code(recall(client, "tq-recall", entry.recall_handle).status) == "NOT_FOUND"  # cancelled already
    deadline = time.time() + 15
    while time.time() < deadline and not any(stored(broker, "tq-recall").values()):
        time.sleep(0.2)
    time.sleep(0.5)
    assert [rec.payload for recs in stored(broker, "tq-recall").values() for rec in recs] == [b"kept"]
    assert code(recall(client, "tq-recall", kept.recall_handle).status) == "NOT_FOUND"  # delivered


def test_heartbeat_and_termination_are_answered_ok(client):
    beat = client.unary("Heartbeat", pb.HeartbeatRequest(client_type=pb.PRODUCER), pb.HeartbeatResponse)
    bye = client.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest(),
                       pb.NotifyClientTerminationResponse)
    assert code(beat.status) == "OK" and code(bye.status) == "OK"


# -- statuses ----------------------------------------------------------------------------------------------


def test_bad_requests_get_the_protocols_statuses_and_the_connection_goes_on(broker, client):
    r = client.send(message("tq-bad", b"x", message_id=" "))
    assert code(r.status) == "ILLEGAL_MESSAGE_ID" and code(r.entries[0].status) == "ILLEGAL_MESSAGE_ID"
    r = client.send(message("tq-bad", b"ok"), message("tq-bad", b""))  # one good, one empty: both answered
    assert code(r.status) == "MULTIPLE_RESULTS"
    assert [code(e.status) for e in r.entries] == ["OK", "MESSAGE_BODY_EMPTY"]
    r = client.send(message("tq-bad", b"x"), metadata=[])
    assert code(r.status) == "CLIENT_ID_REQUIRED"
    with pytest.raises(grpc.RpcError) as err:
        client.raw("SendMessage", b"\xff\xff\xff")  # no protobuf message
    assert err.value.code() == grpc.StatusCode.INTERNAL
    with pytest.raises(grpc.RpcError) as err:
        client.raw("NoSuchMethod", b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.RpcError) as err:
        client.unary("SyncLiteSubscription", pb.SyncLiteSubscriptionRequest(), pb.SyncLiteSubscriptionResponse)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED and "lite" in err.value.details()
    assert [rec.payload for recs in stored(broker, "tq-bad").values() for rec in recs] == [b"ok"]
    assert code(client.route("tq-bad").status) == "OK"  # the same connection still serves
    with broker.client() as text:
        summary = text.stats_dict()
    assert summary["grpc_port"] == str(broker.config["grpc"]["port"]) and int(summary["grpc_connections"]) >= 1
    assert int(summary["grpc_refused"]) >= 1 and int(summary["grpc_sent"]) >= 1  # CLIENT_ID_REQUIRED; the good one
    assert int(summary["grpc_calls"]) > int(summary["grpc_refused"])


def test_telemetry_answers_every_settings_on_a_stream_that_stays_open(broker, client):
    requests = queue.Queue()
    call = client.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=pb.TelemetryCommand.FromString)
    answers = call(iter(requests.get, None), metadata=client.metadata, timeout=20)
    producer = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="tq-tel")]))
    requests.put(pb.TelemetryCommand(settings=producer))
    first = next(answers)
    assert code(first.status) == "OK" and first.settings.publishing.max_body_size == MAX_BODY
    assert first.settings.backoff_policy.max_attempts == 3
    assert first.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    consumer = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(name="g")))
    requests.put(pb.TelemetryCommand(settings=consumer))  # the same stream, still open
    second = next(answers)
    assert code(second.status) == "OK" and second.settings.subscription.long_polling_timeout.seconds == 20
    assert second.settings.backoff_policy.max_attempts > 1
    requests.put(pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER)))  # neither pub nor sub
    with pytest.raises(grpc.RpcError) as err:
        next(answers)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    requests.put(None)


# -- named limits ------------------------------------------------------------------------------------------


def padded_send(size):
    """A SendMessageRequest of exactly ``size`` bytes serialized: three messages, each body within MAX_BODY."""
    first = [message("tq-size", b"x" * (size // 3), message_id="SIZE-%d" % i) for i in range(2)]
    m = message("tq-size", b"", message_id="SIZE-2")
    m.body = b"x" * (size - pb.SendMessageRequest(messages=first + [m]).ByteSize() - 3)
    while pb.SendMessageRequest(messages=first + [m]).ByteSize() < size:
        m.body += b"x"
    while pb.SendMessageRequest(messages=first + [m]).ByteSize() > size:
        m.body = m.body[:-1]
    request = pb.SendMessageRequest(messages=first + [m])
    assert request.ByteSize() == size and all(len(x.body) <= MAX_BODY for x in request.messages)
    return request


def test_a_message_at_grpc_max_message_bytes_is_served_and_one_byte_more_is_resource_exhausted(broker, client):
    r = client.unary("SendMessage", padded_send(MAX_MESSAGE), pb.SendMessageResponse)
    assert code(r.status) == "OK"
    with pytest.raises(grpc.RpcError) as err:
        client.unary("SendMessage", padded_send(MAX_MESSAGE + 1), pb.SendMessageResponse)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "grpc.max_message_bytes" in err.value.details()
    assert code(client.route("tq-size").status) == "OK"  # the connection goes on


class RawH2:
    """A bare HTTP/2 client over a socket (prior knowledge, h2c): what grpcio would never send."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2_connection.H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()

    def flush(self):
        self.sock.sendall(self.conn.data_to_send())

    def open(self, rpc, extra=(), end=False):
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + rpc), (":authority", "x"),
                   ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", "raw")] + list(extra)
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid, headers

    def events(self, until, timeout=10):
        """Events read until ``until(events)`` holds or the connection ends; the events."""
        got, deadline = [], time.time() + timeout
        while time.time() < deadline and not until(got):
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                break
            if not data:
                got.append("closed")
                break
            got.extend(self.conn.receive_data(data))
            pending = self.conn.data_to_send()
            if pending:
                self.sock.sendall(pending)
        return got

    def close(self):
        self.sock.close()


def _has(kind):
    return lambda got: any(isinstance(e, kind) for e in got)


def test_max_streams_per_connection_is_announced_and_one_stream_more_is_refused(broker):
    raw = RawH2(broker.config["grpc"]["port"])
    try:
        raw.events(lambda got: raw.conn.remote_settings.max_concurrent_streams == MAX_STREAMS, timeout=5)
        assert raw.conn.remote_settings.max_concurrent_streams == MAX_STREAMS
        streams = [raw.open("Telemetry")[0] for _ in range(MAX_STREAMS)]  # long-lived streams, all open at once
        settings = pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()))
        body = settings.SerializeToString()
        raw.conn.send_data(streams[-1], b"\0" + len(body).to_bytes(4, "big") + body)
        raw.flush()
        got = raw.events(_has(DataReceived))
        assert any(isinstance(e, DataReceived) and e.stream_id == streams[-1] for e in got)  # at the limit: served
        # h2 would refuse to open one more than the broker announced: make it forget the announcement
        raw.conn.remote_settings = Settings(client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 100})
        refused = raw.open("Telemetry")[0]
        got = raw.events(_has(StreamReset))
        assert [e.error_code for e in got if isinstance(e, StreamReset) and e.stream_id == refused] == [
            ErrorCodes.REFUSED_STREAM], got  # a gRPC client retries it
        assert "closed" not in got and not any(isinstance(e, ConnectionTerminated) for e in got)
        raw.conn.send_data(streams[0], b"\0" + len(body).to_bytes(4, "big") + body)  # the connection goes on
        raw.flush()
        got = raw.events(_has(DataReceived))
        assert any(isinstance(e, DataReceived) and e.stream_id == streams[0] for e in got), got
    finally:
        raw.close()


def test_a_header_block_at_grpc_max_header_bytes_is_served_and_one_byte_more_ends_the_connection(broker):
    from metaq.rmq5.wire import header_list_size
    port = broker.config["grpc"]["port"]
    for extra, served in ((0, True), (1, False)):
        raw = RawH2(port)
        try:
            base = header_list_size(raw_headers := [(":method", "POST"), (":scheme", "http"),
                                                    (":path", SERVICE + "Heartbeat"), (":authority", "x"),
                                                    ("content-type", "application/grpc"), ("te", "trailers"),
                                                    ("x-mq-client-id", "raw")])
            pad = MAX_HEADERS - base - len("x-pad") - 32 + extra
            sid, headers = raw.open("Heartbeat", [("x-pad", "p" * pad)])
            assert header_list_size(headers) == MAX_HEADERS + extra and headers[:7] == raw_headers
            if served:
                raw.conn.send_data(sid, b"\0\0\0\0\0", end_stream=True)  # an empty HeartbeatRequest
                raw.flush()
                got = raw.events(_has(TrailersReceived))
                assert _has(ResponseReceived)(got)
                trailers = dict(next(e for e in got if isinstance(e, TrailersReceived)).headers)
                assert trailers["grpc-status"] == "0"
            else:
                got = raw.events(lambda got: "closed" in got)
                assert any(isinstance(e, ConnectionTerminated) for e in got)
        finally:
            raw.close()


def test_a_connection_survives_a_client_ping_and_a_cancelled_call(broker):
    raw = RawH2(broker.config["grpc"]["port"])
    try:
        raw.conn.ping(b"12345678")
        raw.flush()
        assert _has(PingAckReceived)(raw.events(_has(PingAckReceived)))
        sid, _h = raw.open("SendMessage")
        raw.conn.reset_stream(sid)
        raw.flush()
        sid, _h = raw.open("Heartbeat")
        raw.conn.send_data(sid, b"\0\0\0\0\0", end_stream=True)
        raw.flush()
        got = raw.events(_has(TrailersReceived))
        assert dict(next(e for e in got if isinstance(e, TrailersReceived)).headers)["grpc-status"] == "0"
    finally:
        raw.close()


def test_the_connection_cap_counts_the_grpc_port_with_the_others(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       limits={"max_connections": 2, "max_connections_per_address": 2})
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        with b.client() as text:  # one slot taken on the text port
            c = Client(cfg["grpc"]["port"])
            try:
                assert code(c.route("tq-cap").status) == "OK"  # the second slot: the gRPC connection
                extra = socket.create_connection(("127.0.0.1", cfg["grpc"]["port"]), timeout=5)
                try:  # past the cap: closed without a byte, as on every port without words of its own
                    assert extra.recv(100) == b""
                finally:
                    extra.close()
                assert text.stats_dict()["grpc_connections"] == "1"
            finally:
                c.close()
    finally:
        b.kill()


# -- authentication ----------------------------------------------------------------------------------------


def signing_date(at=None):
    """``x-mq-date-time`` as a client signs it: ``at`` (seconds since the epoch, default now), UTC."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if at is None else at))


def credentials(user, secret, date_time=None):
    """The metadata of a call signed as ``user`` at ``date_time`` (default: now, as clients sign each call)."""
    from metaq.auth.proofs import mqv2_signature
    date_time = signing_date() if date_time is None else date_time
    sig = mqv2_signature(secret.encode(), date_time).upper()  # Java and Node send upper case
    return [("x-mq-client-id", "auth@1"), ("x-mq-date-time", date_time),
            ("authorization", "MQv2-HMAC-SHA1 Credential=%s, SignedHeaders=x-mq-date-time, Signature=%s"
             % (user, sig))]


def test_credentials_go_through_the_same_users_and_permissions(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"])
    try:
        ok = c.send(message("orders", b"signed"), metadata=credentials("alice", SECRETS["alice"]))
        assert code(ok.status) == "OK"
        wrong = c.send(message("orders", b"forged"), metadata=credentials("alice", "not-alices-secret-0000"))
        assert code(wrong.status) == "UNAUTHORIZED" and "accessKey=alice" in wrong.status.message
        none = c.send(message("orders", b"anonymous"), metadata=[("x-mq-client-id", "anon")])
        assert code(none.status) == "UNAUTHORIZED"
        denied = c.send(message("payroll", b"not-hers"), metadata=credentials("alice", SECRETS["alice"]))
        assert code(denied.status) == "FORBIDDEN" and code(denied.entries[0].status) == "FORBIDDEN"
        assert code(c.route("orders").status) == "UNAUTHORIZED"  # every RPC needs a user
        telemetry = c.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=pb.TelemetryCommand.FromString)
        producer = pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()))
        with pytest.raises(grpc.RpcError) as err:  # Telemetry's refusals end the stream (the proxy's way)
            next(telemetry(iter([producer]), metadata=credentials("alice", "not-alices-secret-0000"), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "UNAUTHORIZED" in err.value.details()
        answer = next(telemetry(iter([producer]), metadata=credentials("alice", SECRETS["alice"]), timeout=10))
        assert code(answer.status) == "OK"
        assert code(c.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name="orders")),
                            pb.QueryRouteResponse, credentials("bob", SECRETS["bob"])).status) == "OK"
        # a recall handle proves nothing of who sent the message: its sender (the timer's owner) or an admin recalls
        def timed_request():
            timed = c.send(message("orders", b"timed", deliver_ms=int(time.time() * 1000) + 60_000),
                           metadata=credentials("alice", SECRETS["alice"]))
            return pb.RecallMessageRequest(topic=pb.Resource(name="orders"),
                                           recall_handle=timed.entries[0].recall_handle)

        request = timed_request()
        not_bobs = c.unary("RecallMessage", request, pb.RecallMessageResponse, credentials("bob", SECRETS["bob"]))
        assert code(not_bobs.status) == "FORBIDDEN"  # bob may publish to orders, but did not send it
        hers = c.unary("RecallMessage", request, pb.RecallMessageResponse, credentials("alice", SECRETS["alice"]))
        assert code(hers.status) == "OK"
        admins = c.unary("RecallMessage", timed_request(), pb.RecallMessageResponse,
                         credentials("admin", SECRETS["admin"]))
        assert code(admins.status) == "OK"
        with b.client() as text:
            assert text.auth("admin", SECRETS["admin"]).code == 200
            replies = [text.get("orders", p, 0, 1 << 20) for p in (0, 1)]
        payloads = [rec.payload for r in replies if isinstance(r, ev.Value) for rec, _end in iter_records(r.body)]
        assert payloads == [b"signed"]
    finally:
        c.close()
        b.kill()


# -- TLS -----------------------------------------------------------------------------------------------------


def test_with_tls_on_the_port_speaks_grpc_over_tls_and_refuses_plaintext(tmp_path):
    from tests.harness.pki import Pki
    pki = Pki(tmp_path / "pki")
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()}, security={"tls": pki.tls_config("on")})
    b = BrokerProcess(tmp_path, cfg).start()
    with open(pki.ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    channel = grpc.secure_channel("127.0.0.1:%d" % cfg["grpc"]["port"], creds)  # grpc requires ALPN h2
    plain = Client(cfg["grpc"]["port"])
    try:
        send = channel.unary_unary(SERVICE + "SendMessage", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.SendMessageResponse.FromString)
        r = send(pb.SendMessageRequest(messages=[message("tq-tls", b"over tls")]),
                 metadata=[("x-mq-client-id", "tls")], timeout=10)
        assert code(r.status) == "OK"
        with pytest.raises(grpc.RpcError) as err:
            plain.route("tq-tls")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        ctx = ssl.create_default_context(cafile=pki.ca)
        assert [rec.payload for recs in stored(b, "tq-tls", ssl_context=ctx).values() for rec in recs] == [b"over tls"]
    finally:
        channel.close()
        plain.close()
        b.kill()
