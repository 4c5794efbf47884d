"""Every front-end's write behaves the same, because every one goes through the put path (docs/architecture.md
"The put path"): one table of writes (a text put, a putb, the text fast path's pipelined puts, a put_at, an
idempotent put, a RocketMQ 4 SEND, a gRPC SendMessage, an MQTT QoS 1 PUBLISH, an HTTP put) run against real brokers
under each condition the put path decides for all of them:

* ``sync`` replication: no acknowledgement while the slave is stopped (within its timeout), the acknowledgement
  once it runs again, and the slave then holds the record;
* a full disk (a real tmpfs filled): a clear refusal, and what was acknowledged before is still there;
* a failed flush (a FUSE filesystem whose fsync fails): a clear refusal, and what was acknowledged is still there;
* a user's quota (``topics``: a write that would create one more topic than the user may own): its clear refusal,
  nothing written, and the user's other writes still taken.

Each write returns ``(acknowledged, what the broker said)``.
"""

import os
import signal
import threading
import time
import uuid

import pytest

from metaq.client.local import free_port, small_config
from metaq.client.raw import RemotingClient, TextClient
from metaq.idempotence.wire import IdempotentPut
from metaq.mqtt import wire as mqtt_wire
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.putbatch import PutBatch, sub_record
from metaq.protocol.text import serialize
from metaq.timers.records import TIMER_TOPIC
from metaq.timers.wire import TimerPut
from tests.harness.acl import SECRETS, write_acl
from tests.harness.fusefs import FaultMount
from tests.harness.http import request
from tests.harness.mqtt import Raw
from tests.harness.replication import master_config, stats
from tests.harness.rocketmq import send_v1
from tests.harness.tmpfs import fill, tmpfs
from tests.rmq5.test_grpc_port import credentials as signed

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

SERVICE = "/apache.rocketmq.v2.MessagingService/"
FAST_PATH_FRAMES = 4  # pipelined plain puts in one send: the fast path takes them as one burst


def _text(b, user=None):
    """A text connection of ``b``, logged in as ``user`` (``(name, secret)``) when given."""
    c = TextClient("127.0.0.1", b.port, timeout=30)
    if user is not None:
        r = c.auth(*user)
        assert r.code == 200, r
    return c


def _result(r):
    return (isinstance(r, ev.Result) and r.code == 200), "%s %s" % (getattr(r, "code", r), getattr(r, "body", b""))


def text_put(b, topic, payload, user=None):
    with _text(b, user) as c:
        return _result(c.call(ev.Put(topic, 0, 0, payload, c.opaque(), metaq_checksum(payload))))


def putb(b, topic, payload, user=None):
    body = b"".join(sub_record(topic.encode(), 0, 0, payload + b"%d" % k, metaq_checksum(payload + b"%d" % k), k)
                    for k in range(2))
    with _text(b, user) as c:
        return _result(c.call(PutBatch(topic, 2, body, c.opaque())))


def fast_path(b, topic, payload, user=None):
    """Plain puts pipelined in one send (the fast path, ``server/text/fastput.py``): every reply, in order."""
    frames = [ev.Put(topic, 0, 0, payload + b"%d" % k, k + 1, metaq_checksum(payload + b"%d" % k))
              for k in range(FAST_PATH_FRAMES)]
    with _text(b, user) as c:
        c.send(b"".join(serialize(f) for f in frames))
        results = [_result(c.read_event()) for _ in frames]
    return all(ok for ok, _ in results), "; ".join(why for _, why in results)


def put_at(b, topic, payload, user=None):
    with _text(b, user) as c:
        return _result(c.call(TimerPut(topic, 0, 0, payload, c.opaque(), metaq_checksum(payload), "+3600000")))


def put_idem(b, topic, payload, user=None):
    with _text(b, user) as c:
        return _result(c.call(IdempotentPut(topic, 0, 0, payload, c.opaque(), metaq_checksum(payload),
                                            uuid.uuid4().int >> 66, 0)))


def rocketmq_send(b, topic, payload, user=None):
    with RemotingClient(b.config["remoting"]["port"], timeout=30, credentials=user) as rc:
        r = send_v1(rc, topic, payload)
    return r.code == 0, "%s %s" % (r.code, r.remark)


def grpc_send(b, topic, payload, user=None):
    channel = grpc.insecure_channel("127.0.0.1:%d" % b.config["grpc"]["port"])
    try:
        m = pb.Message(topic=pb.Resource(name=topic), body=payload)
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.message_type = pb.NORMAL
        m.system_properties.born_timestamp.GetCurrentTime()
        call = channel.unary_unary(SERVICE + "SendMessage", request_serializer=lambda x: x.SerializeToString(),
                                   response_deserializer=pb.SendMessageResponse.FromString)
        metadata = [("x-mq-client-id", "wp@1@1@x")] if user is None else signed(*user)
        r = call(pb.SendMessageRequest(messages=[m]), metadata=metadata, timeout=30)
    finally:
        channel.close()
    return r.status.code == pb.OK, "%s %s" % (pb.Code.Name(r.status.code), r.status.message)


def mqtt_publish(b, topic, payload, user=None):
    raw = Raw(b, timeout=30)
    try:
        login = {} if user is None else {"username": user[0], "password": user[1].encode()}
        ack = raw.connect("wp-%s" % uuid.uuid4().hex[:8], **login)
        assert isinstance(ack, mqtt_wire.Connack) and ack.reason_code == 0, ack
        raw.send(mqtt_wire.Publish(topic + "/x", payload, qos=1, packet_id=1))
        p = raw.read()
    finally:
        raw.close()
    if p is None:
        return False, "closed"
    return p.reason_code == 0, "%s %s" % (p.reason_code, p.properties.get("reason_string", ""))


def http_put(b, topic, payload, user=None):
    r = request(b, "POST", "/api/topics/%s/messages?partition=0" % topic, body=payload, timeout=30,
                **({} if user is None else {"user": user[0], "secret": user[1]}))
    return r.status == 200, "%s %s" % (r.status, r.body[:200])


#: Every front-end's write: the table the conditions run over.
WRITES = {"text put": text_put, "putb": putb, "text fast path": fast_path, "put_at": put_at,
          "idempotent put": put_idem, "RocketMQ 4 send": rocketmq_send, "gRPC SendMessage": grpc_send,
          "MQTT PUBLISH QoS 1": mqtt_publish, "HTTP put": http_put}


def every_port(data_dir, **sections):
    """A config with every front-end's port: text, RocketMQ remoting, gRPC, MQTT, HTTP."""
    cfg = small_config(data_dir, **sections)
    for port in ("remoting", "grpc", "mqtt", "http"):
        cfg.setdefault(port, {})["port"] = free_port()
    return cfg


def topic_of(name):
    return "twp" + "".join(ch for ch in name.lower() if ch.isalnum())


def burst_puts(b):
    return int(stats(b)["burst_puts"])


# -- sync replication -----------------------------------------------------------------------------------------------

SYNC_TIMEOUT_MS = 20_000  # far longer than the test holds the slave stopped
HELD_S = 1.5  # how long the slave is stopped while a write waits


@pytest.fixture(scope="module")
def sync_pair(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("wp-sync")
    (wd / "m").mkdir()
    (wd / "s").mkdir()
    rport = free_port()
    cfg = master_config(wd / "m", rport, mode="sync", sync_timeout_ms=SYNC_TIMEOUT_MS)
    for port in ("remoting", "grpc", "mqtt", "http"):
        cfg.setdefault(port, {})["port"] = free_port()
    master = BrokerProcess(wd / "m", cfg).start()
    slave = BrokerProcess(wd / "s", small_config(os.path.join(str(wd / "s"), "data")),
                          extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"]).start()
    deadline = time.monotonic() + 20
    while stats(master)["replication_slaves"] != "1":
        assert time.monotonic() < deadline, "the slave did not connect"
        time.sleep(0.05)
    yield master, slave
    slave.proc.send_signal(signal.SIGCONT)
    slave.kill()
    master.kill()


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("name", sorted(WRITES))
def test_sync_replication_acknowledges_a_write_only_once_the_slave_has_it(sync_pair, name):
    master, slave = sync_pair
    write, topic = WRITES[name], topic_of(name)
    assert write(master, topic, b"first")[0]  # the topic and its partition exist before the slave is stopped
    fast_before = burst_puts(master)
    done = {}
    slave.proc.send_signal(signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: done.update(result=write(master, topic, b"while the slave sleeps")),
                             daemon=True)
        t.start()
        t.join(HELD_S)
        assert "result" not in done, "%s was acknowledged while the slave was stopped: %s" % (name, done)
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    t.join(SYNC_TIMEOUT_MS / 1000.0)
    assert done.get("result", (False,))[0], done
    master_end = int(stats(master)["log_end_position"])
    assert int(stats(slave)["log_end_position"]) >= master_end  # acknowledged: the slave had it
    if name == "text fast path":
        assert burst_puts(master) - fast_before == FAST_PATH_FRAMES  # taken by the fast path, not left to the general


@pytest.mark.slow
@pytest.mark.fault
def test_a_grpc_send_waiting_for_the_slave_stalls_neither_its_connection_nor_another(sync_pair):
    """With ``sync`` replication a gRPC send waits in a greenlet of its own: while it waits for the stopped slave, a
    call on its connection and a call on another are answered."""
    master, slave = sync_pair
    topic = topic_of("gRPC SendMessage")
    assert grpc_send(master, topic, b"first")[0]
    channels = [grpc.insecure_channel("127.0.0.1:%d" % master.config["grpc"]["port"]) for _ in range(2)]
    route = [c.unary_unary(SERVICE + "QueryRoute", request_serializer=lambda x: x.SerializeToString(),
                           response_deserializer=pb.QueryRouteResponse.FromString) for c in channels]
    send = channels[0].unary_unary(SERVICE + "SendMessage", request_serializer=lambda x: x.SerializeToString(),
                                   response_deserializer=pb.SendMessageResponse.FromString)
    m = pb.Message(topic=pb.Resource(name=topic), body=b"while the slave sleeps")
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    metadata = [("x-mq-client-id", "wp@1@1@x")]
    slave.proc.send_signal(signal.SIGSTOP)
    try:
        waiting = send.future(pb.SendMessageRequest(messages=[m]), metadata=metadata, timeout=30)
        time.sleep(0.3)
        assert not waiting.done()
        for ask in route:  # its own connection, then another
            r = ask(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=metadata, timeout=HELD_S)
            assert r.status.code == pb.OK
        assert not waiting.done()
    finally:
        slave.proc.send_signal(signal.SIGCONT)
    try:
        assert waiting.result(SYNC_TIMEOUT_MS / 1000.0).status.code == pb.OK
    finally:
        for c in channels:
            c.close()

# -- a full disk ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("wp-disk")
    mnt = wd / "mnt"
    with tmpfs(mnt, "24m"):
        cfg = every_port(mnt / "data", store={"disk_warn_ratio": 0.9, "disk_danger_ratio": 0.9,
                                              "disk_check_interval_s": 0.1})
        b = BrokerProcess(wd, cfg).start()
        try:
            acked = {}
            for name, write in WRITES.items():  # each front-end's topic exists and holds an acknowledged write
                ok, why = write(b, topic_of(name), b"before the disk filled")
                assert ok, (name, why)
                acked[name] = int(stats(b)["log_end_position"])
            fill(mnt)
            deadline = time.monotonic() + 10
            while stats(b)["writes_refused"] != "true":
                assert time.monotonic() < deadline, "the broker did not see its disk full"
                time.sleep(0.05)
            yield b
        finally:
            b.kill()


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_full_disk_refuses_every_write_clearly_and_keeps_what_was_acknowledged(full_disk, name):
    b = full_disk
    topic = topic_of(name)
    end = stats(b)["log_end_position"]
    ok, why = WRITES[name](b, topic, b"refused")
    assert not ok, "%s was acknowledged on a full disk: %s" % (name, why)
    assert "disk usage" in why and "writes are refused" in why, why
    assert stats(b)["log_end_position"] == end  # nothing written
    with _text(b) as c:  # what was acknowledged before is still there
        assert c.get_records(topic if name != "put_at" else TIMER_TOPIC, 0, 0)


# -- a failed flush -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def failed_flush(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("wp-flush")
    fs = FaultMount(str(wd)).start()
    b = None
    try:
        cfg = every_port(os.path.join(fs.mountpoint, "data"), store={"flush": "sync", "segment_size": 4 << 20})
        b = BrokerProcess(wd, cfg).start()
        for name, write in WRITES.items():
            ok, why = write(b, topic_of(name), b"before the flush failed")
            assert ok, (name, why)
        fs.set_fault("eio")
        with _text(b) as c:
            r = c.put("twpfault", b"its flush fails", 0)
            assert r.code == 500, r  # written, its flush failed: not acknowledged
        assert stats(b)["writes_refused"] == "true"
        yield b
    finally:
        if b is not None:
            b.kill()
        fs.stop()


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_failed_flush_refuses_every_write_clearly_and_keeps_what_was_acknowledged(failed_flush, name):
    b = failed_flush
    topic = topic_of(name)
    end = stats(b)["log_end_position"]
    ok, why = WRITES[name](b, topic, b"refused")
    assert not ok, "%s was acknowledged after a failed flush: %s" % (name, why)
    assert "writes are refused after a failed flush" in why, why
    assert stats(b)["log_end_position"] == end
    with _text(b) as c:
        assert c.get_records(topic if name != "put_at" else TIMER_TOPIC, 0, 0)


# -- a user's quota -------------------------------------------------------------------------------------------------

ALICE = ("alice", SECRETS["alice"])  # publishes to orders* (tests/harness/acl.py)


def log_end(b):
    with _text(b, ("admin", SECRETS["admin"])) as c:
        return c.stats_dict()["log_end_position"]


@pytest.fixture(scope="module")
def topic_quota(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("wp-quota")
    cfg = every_port(wd / "data", security={"acl_file": write_acl(wd / "acl.yaml", quotas={"topics": 1})})
    b = BrokerProcess(wd, cfg).start()
    try:
        ok, why = text_put(b, "orders", b"alice's one topic", ALICE)
        assert ok, why
        yield b
    finally:
        b.kill()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WRITES))
def test_a_write_past_the_users_topic_quota_is_refused_clearly_and_writes_nothing(topic_quota, name):
    b = topic_quota
    write = WRITES[name]
    end = log_end(b)
    ok, why = write(b, "orders" + topic_of(name), b"one topic too many", ALICE)
    assert not ok, "%s created a topic past alice's quota: %s" % (name, why)
    assert "quota" in why and "topics" in why, why
    assert log_end(b) == end  # nothing written
    ok, why = write(b, "orders", b"her own topic still takes writes", ALICE)
    assert ok, why
