"""Issue 55, point 2: one read path, paced. Every way a record leaves the broker for a user passes ``Guard.pace``
(docs/architecture.md "Pacing"), so a user's ``fetch_bytes_per_s`` holds on every port (docs/security.md
"Quotas"): a paced user's reads are delayed, never refused, and an unpaced user reading the same records at the
same time is not slowed; likewise ``produce_bytes_per_s`` on every port's writes. Real brokers, authentication on;
each test moves about a megabyte both ways side by side: lower bounds on the paced time only, and the unpaced
client done well before it."""

import base64
import threading
import time

import pytest

from metaq.mqtt import wire
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize
from tests.harness.acl import DEFAULT_USERS, SECRETS, login, secured_config, write_acl
from tests.harness.http import request, with_http
from tests.harness.mqtt import Raw, with_mqtt

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RATE = 250_000  # alice's fetch_bytes_per_s
BODY = b"x" * 10_000
COUNT = 100  # 1 MB: three seconds past the one-second burst at RATE


def paced_users():
    """alice paced at RATE both ways, reader (every topic) and admin unpaced, bob publishes orders."""
    users = {name: dict(entry) for name, entry in DEFAULT_USERS.items()}
    users["alice"]["quotas"] = {"fetch_bytes_per_s": RATE, "produce_bytes_per_s": RATE}
    return users


def paced_config(tmp_path, **more):
    cfg = secured_config(tmp_path, users=paced_users())
    write_acl(tmp_path / "acl.yaml", users=paced_users())
    for section, values in more.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def side_by_side(paced, unpaced):
    """Run ``paced()`` and ``unpaced()`` at once; ``(paced seconds, its result, unpaced seconds, its result)``."""
    out = {}

    def timed(name, fn):
        started = time.monotonic()
        result = fn()
        out[name] = (time.monotonic() - started, result)

    threads = [threading.Thread(target=timed, args=(name, fn)) for name, fn in (("p", paced), ("u", unpaced))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out["p"][0], out["p"][1], out["u"][0], out["u"][1]


def assert_paced(paced_s, unpaced_s, nbytes):
    assert paced_s >= (nbytes - RATE) / RATE * 0.8, paced_s  # bounded by her rate, less its one-second burst
    assert unpaced_s < paced_s / 2, (unpaced_s, paced_s)  # the unpaced reader was not held behind her


# -- MQTT ---------------------------------------------------------------------------------------------------------


def _subscriber(b, user, qos=0, window=None):
    raw = Raw(b, timeout=60.0)
    props = {"receive_maximum": window} if window else {}
    assert raw.connect(user + "-sub", username=user, password=SECRETS[user].encode(),
                       properties=props).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("orders/#", qos),)))
    assert raw.read().reason_codes == (qos,)
    return raw


def _receive(raw, n):
    """The payload bytes of the next ``n`` PUBLISHes ``raw`` reads (each acknowledged at QoS 1)."""
    got = 0
    while n:
        p = raw.read()
        assert p is not None
        if isinstance(p, wire.Publish):
            got += len(p.payload)
            n -= 1
            if p.qos:
                raw.send(wire.PubAck(p.packet_id))
    return got


def test_mqtt_delivery_is_paced_for_its_user_and_not_for_another(broker_factory, tmp_path):
    b = broker_factory(with_mqtt(paced_config(tmp_path)))
    alice, reader = _subscriber(b, "alice"), _subscriber(b, "reader")
    bob = Raw(b)
    assert bob.connect("bob-pub", username="bob", password=SECRETS["bob"].encode()).reason_code == 0

    def publish_then(raw):
        return lambda: _receive(raw, COUNT)

    for _ in range(COUNT):
        bob.send(wire.Publish("orders/eu", BODY, 0))
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(publish_then(alice), publish_then(reader))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- HTTP ---------------------------------------------------------------------------------------------------------


def put_records(b, topic="orders", partition=0):
    """COUNT records of BODY put by the admin over the text port."""
    with login(b, "admin") as c:
        c.send(b"".join(serialize(ev.Put(topic, partition, 0, BODY, i, metaq_checksum(BODY))) for i in range(COUNT)))
        assert [c.read_event().code for _ in range(COUNT)] == [200] * COUNT


def _http_read_all(b, user):
    """The body bytes of the partition, read from 0 by HTTP gets of about 100 kB."""
    offset, got = 0, 0
    while True:
        r = request(b, "GET", "/api/topics/orders/partitions/0/messages?offset=%d&max_bytes=100000" % offset,
                    user=user, secret=SECRETS[user])
        assert r.status == 200, r
        messages = r.json()["messages"]
        if not messages:
            return got
        got += sum(len(base64.b64decode(m["body"])) for m in messages)
        offset = r.json()["next_offset"]


def test_http_gets_are_paced_for_their_user_and_not_for_another(broker_factory, tmp_path):
    b = broker_factory(with_http(paced_config(tmp_path)))
    put_records(b)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _http_read_all(b, "alice"),
                                                              lambda: _http_read_all(b, "reader"))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- RocketMQ 5 (gRPC) --------------------------------------------------------------------------------------------


def _grpc_broker(broker_factory, tmp_path):
    from metaq.client.local import free_port
    b = broker_factory(paced_config(tmp_path, grpc={"port": free_port()}))
    put_records(b)
    return b


def _grpc_metadata(user):
    from tests.rmq5.test_grpc_port import credentials
    return [("x-mq-client-id", "%s@1" % user)] + credentials(user, SECRETS[user])[1:]


def _grpc_pull_all(b, user, group):
    from tests.rmq5.test_grpc_port import Client, code
    from tests.rmq5.test_pull_grpc import pull
    c = Client(b.config["grpc"]["port"])
    try:
        offset, got = 0, 0
        while True:
            status, messages, nxt = pull(c, group, "orders", 0, offset, batch=8, metadata=_grpc_metadata(user),
                                         timeout=30)
            if code(status) != "OK":
                assert code(status) == "MESSAGE_NOT_FOUND", status
                return got
            got += sum(len(m.body) for m in messages)
            offset = nxt
    finally:
        c.close()


def _grpc_receive_all(b, user, group):
    from tests.rmq5.test_grpc_port import Client, code
    from tests.rmq5.test_pop_grpc import receive
    c = Client(b.config["grpc"]["port"])
    try:
        got = 0
        while True:
            status, messages = receive(c, group, "orders", batch=8, invisible_ms=120_000, metadata=_grpc_metadata(user))
            if code(status) != "OK":
                assert code(status) == "MESSAGE_NOT_FOUND", status
                return got
            got += sum(len(m.body) for m in messages)
    finally:
        c.close()


def test_grpc_pulls_are_paced_for_their_user_and_not_for_another(broker_factory, tmp_path):
    pytest.importorskip("grpc")
    b = _grpc_broker(broker_factory, tmp_path)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _grpc_pull_all(b, "alice", "billing"),
                                                              lambda: _grpc_pull_all(b, "reader", "any"))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


def test_grpc_receives_are_paced_for_their_user_and_not_for_another(broker_factory, tmp_path):
    pytest.importorskip("grpc")
    b = _grpc_broker(broker_factory, tmp_path)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _grpc_receive_all(b, "alice", "billing"),
                                                              lambda: _grpc_receive_all(b, "reader", "any"))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- POP over the text port ---------------------------------------------------------------------------------------


def _pop_receive_all(b, user, group):
    from metaq.pop.wire import Receive, decode_received
    with login(b, user) as c:
        got = 0
        while True:
            c.send(serialize(Receive("orders", group, 8, 120_000, False, 0, 0)))
            reply = c.read_event()
            assert reply.code == 200, reply
            items = decode_received(reply.body)
            if not items:
                return got
            got += sum(len(it.data) for it in items)


def test_pop_receives_are_paced_for_their_user_and_not_for_another(broker_factory, tmp_path):
    b = broker_factory(paced_config(tmp_path))
    put_records(b)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _pop_receive_all(b, "alice", "billing"),
                                                              lambda: _pop_receive_all(b, "reader", "any"))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- the produce rate on every port's writes ---------------------------------------------------------------------


def _grpc_send_all(b, user):
    from tests.rmq5.test_grpc_port import Client, code, message
    c = Client(b.config["grpc"]["port"])
    try:
        for _ in range(COUNT):
            assert code(c.send(message("orders", BODY), metadata=_grpc_metadata(user)).status) == "OK"
        return COUNT * len(BODY)
    finally:
        c.close()


def _http_put_all(b, user):
    for _ in range(COUNT):
        r = request(b, "POST", "/api/topics/orders/messages?partition=0", body=BODY, user=user, secret=SECRETS[user])
        assert r.status == 200, r
    return COUNT * len(BODY)


def _mqtt_publish_all(b, user):
    raw = Raw(b, timeout=60.0)
    try:
        assert raw.connect(user + "-pub", username=user, password=SECRETS[user].encode()).reason_code == 0
        for first in range(0, COUNT, 10):  # within the broker's Receive Maximum
            for i in range(first, first + 10):
                raw.send(wire.Publish("orders/eu", BODY, 1, packet_id=i + 1))
            acks = [raw.read() for _ in range(10)]
            assert all(isinstance(a, wire.PubAck) and not a.reason_code for a in acks), acks
        return COUNT * len(BODY)
    finally:
        raw.close()


@pytest.mark.parametrize("port", ["grpc", "http", "mqtt"])
def test_writes_are_paced_by_the_produce_rate_on_every_port(broker_factory, tmp_path, port):
    from metaq.client.local import free_port
    if port == "grpc":
        pytest.importorskip("grpc")
        b, write = broker_factory(paced_config(tmp_path, grpc={"port": free_port()})), _grpc_send_all
    elif port == "http":
        b, write = broker_factory(with_http(paced_config(tmp_path))), _http_put_all
    else:
        b, write = broker_factory(with_mqtt(paced_config(tmp_path))), _mqtt_publish_all
    paced_s, paced_sent, unpaced_s, unpaced_sent = side_by_side(lambda: write(b, "alice"), lambda: write(b, "admin"))
    assert paced_sent == unpaced_sent == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- RocketMQ 4 pulls (remoting) ----------------------------------------------------------------------------------


def _remoting_pull_all(b, user, group):
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode
    with RemotingClient(b.config["remoting"]["port"], timeout=30, credentials=(user, SECRETS[user])) as rc:
        offset, got = 0, 0
        while True:
            r = rc.call(RequestCode.PULL_MESSAGE, {"consumerGroup": group, "topic": "orders", "queueId": 0,
                                                   "queueOffset": offset, "maxMsgNums": 8, "sysFlag": 0,
                                                   "commitOffset": 0, "suspendTimeoutMillis": 0})
            if r.code != ResponseCode.SUCCESS:
                assert r.code == ResponseCode.PULL_NOT_FOUND, r
                return got
            got += len(r.body)
            offset = int(r.ext_fields["nextBeginOffset"])


def test_remoting_pulls_are_paced_for_their_user_and_not_for_another(broker_factory, tmp_path):
    from metaq.client.local import free_port
    b = broker_factory(paced_config(tmp_path, remoting={"port": free_port()}))
    put_records(b)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _remoting_pull_all(b, "alice", "billing"),
                                                              lambda: _remoting_pull_all(b, "reader", "any"))
    assert paced_got == unpaced_got >= COUNT * len(BODY)  # the bodies, and each message's header around them
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


# -- text gets, side by side --------------------------------------------------------------------------------------


def _text_read_all(b, user):
    with login(b, user) as c:
        offset, got = 0, 0
        while True:
            records = c.get_records("orders", 0, offset, max_size=100_000)
            if not isinstance(records, list) or not records:
                return got
            got += sum(len(r.data) for r in records)
            offset += len(records)


def test_text_gets_are_paced_for_their_user_and_not_for_another_at_the_same_time(broker_factory, tmp_path):
    b = broker_factory(paced_config(tmp_path))
    put_records(b)
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _text_read_all(b, "alice"),
                                                              lambda: _text_read_all(b, "reader"))
    assert paced_got == unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, COUNT * len(BODY))


def test_a_paced_grpc_receive_never_outlives_its_deadline_nor_takes_what_it_cannot_answer(broker_factory, tmp_path):
    """Her budget is one for every port: a text get of the whole partition leaves alice owing seconds; a receive
    whose deadline comes sooner answers MESSAGE_NOT_FOUND within it, having taken nothing (no message made
    invisible), and once she is back within her rate a receive gets the first messages."""
    grpc = pytest.importorskip("grpc")
    from metaq.rmq5 import messages_pb2 as pb
    from tests.rmq5.test_grpc_port import SERVICE, Client, code
    from tests.rmq5.test_pop_grpc import receive
    b = _grpc_broker(broker_factory, tmp_path)
    with login(b, "alice") as text:
        assert len(text.get_records("orders", 0, 0, max_size=1024 * 1024)) == COUNT  # she owes about 3 s now
    c = Client(b.config["grpc"]["port"])
    try:
        request = pb_receive_request(batch=8)
        call = c.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=pb.ReceiveMessageResponse.FromString)
        started = time.monotonic()
        try:
            responses = list(call(request, metadata=_grpc_metadata("alice"), timeout=1.5))
        except grpc.RpcError as exc:  # the deadline passed with the call still waiting
            pytest.fail("the paced receive outlived its deadline: %s" % exc)
        assert time.monotonic() - started < 1.5
        assert code(responses[0].status) == "MESSAGE_NOT_FOUND"
        time.sleep(3.5)  # back within her rate
        status, messages = receive(c, "billing", "orders", batch=8, metadata=_grpc_metadata("alice"))
        assert code(status) == "OK" and [m.system_properties.queue_offset for m in messages] == list(range(8))
    finally:
        c.close()


def pb_receive_request(batch):
    from metaq.rmq5 import messages_pb2
    request = messages_pb2.ReceiveMessageRequest(group=messages_pb2.Resource(name="billing"), batch_size=batch,
                                                 message_queue=messages_pb2.MessageQueue(
                                                     topic=messages_pb2.Resource(name="orders"), id=-1))
    request.invisible_duration.FromMilliseconds(120_000)
    request.long_polling_timeout.FromMilliseconds(0)
    return request


def test_a_paced_qos_1_subscriber_keeps_its_window_and_another_users_is_not_slowed(broker_factory, tmp_path):
    """At QoS 1 the paced session still holds at most its window in flight (Receive Maximum 4: the broker sends
    no fifth before an acknowledgement), and an unpaced QoS 1 subscriber of the same messages is done well before."""
    b = broker_factory(with_mqtt(paced_config(tmp_path)))
    alice, reader = _subscriber(b, "alice", qos=1, window=4), _subscriber(b, "reader", qos=1)
    bob = Raw(b)
    assert bob.connect("bob-pub", username="bob", password=SECRETS["bob"].encode()).reason_code == 0
    for i in range(COUNT):
        bob.send(wire.Publish("orders/eu", BODY, 1, packet_id=i % 60000 + 1))
        if i % 10 == 9:
            for _ in range(10):
                assert isinstance(bob.read(), wire.PubAck)
    alice.sock.settimeout(1.0)
    unacked = []
    try:
        while True:
            p = alice.read()
            assert isinstance(p, wire.Publish)
            unacked.append(p)
    except OSError:  # nothing more comes without an acknowledgement
        pass
    assert len(unacked) == 4
    alice.sock.settimeout(60.0)
    for p in unacked:
        alice.send(wire.PubAck(p.packet_id))
    paced_s, paced_got, unpaced_s, unpaced_got = side_by_side(lambda: _receive(alice, COUNT - 4),
                                                              lambda: _receive(reader, COUNT))
    assert paced_got == (COUNT - 4) * len(BODY) and unpaced_got == COUNT * len(BODY)
    assert_paced(paced_s, unpaced_s, (COUNT - 4) * len(BODY))
