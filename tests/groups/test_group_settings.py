"""Per-group settings against real brokers (docs/concepts.md "Per-group settings"): set through metaq-admin and
through HTTP, honoured by a text get, a POP receive, a RocketMQ remoting pull, heartbeat and send-back, gRPC's
ReceiveMessage, PullMessage and Settings; bad values refused with nothing changed; a group with no entry unchanged."""

import json

import pytest

from metaq import limits
from metaq.groups import limits as groups_limits
from metaq.pop import limits as pop_limits
from metaq import admincli as admin
from metaq.client.local import BrokerProcess, free_port, small_config
from metaq.client.raw import RemotingClient
from metaq.client.pop import SimpleConsumer
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.bodies import decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.http import request, with_http
from tests.harness.rocketmq import pull, send_v1

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

from tests.rmq5.test_grpc_port import Client, code  # noqa: E402
from tests.rmq5.test_pop_grpc import receive as grpc_receive, settings as grpc_settings  # noqa: E402
from tests.rmq5.test_pull_grpc import pull as grpc_pull  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("groupset")
    cfg = with_http(small_config(wd / "data", grpc={"port": free_port()},
                                 remoting={"port": free_port(), "access_message_in_memory_max_ratio": 0},
                                 store={"flush": "async", "flush_interval_ms": 20},
                                 topics=[{"name": "gs*", "partitions": 1}]))
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def rc(broker):
    with RemotingClient(broker.config["remoting"]["port"]) as client:
        yield client


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def cli(broker, *args):
    return admin.main(["--brokers", url(broker), "--json", "group-settings"] + list(args))


def show(broker, group):
    return request(broker, "GET", "/api/group-settings/%s" % group).json()


def test_consumption_disabled_through_metaq_admin_refuses_every_protocols_reads(broker, rc, capsys):
    topic = "gs-off"
    with broker.client() as c:
        c.put_ok(topic, b"one", 0)
    assert cli(broker, "set", "frozen", "--consumption-enabled", "false") == 0
    assert json.loads(capsys.readouterr().out)[0]["consumption_enabled"] is False
    with broker.client() as c:
        refused = c.get(topic, 0, 0, group="frozen")
        assert (refused.code, b"frozen" in refused.body, b"consumption is disabled" in refused.body) == (403, 1, 1)
        assert isinstance(c.get(topic, 0, 0, group="others"), ev.Value)  # a group with no entry: as before
    with SimpleConsumer(url(broker), "frozen", topic) as pop:  # POP receive over the text port
        with pytest.raises(Exception, match="frozen"):
            pop.receive(1)
    r = pull(rc, topic, 0, 0, group="frozen")  # RocketMQ's answer: NO_PERMISSION naming the group
    assert r.code == C.NO_PERMISSION
    assert r.remark.startswith("subscription group no permission, frozen")
    assert pull(rc, topic, 0, 0, group="others").code == C.SUCCESS
    g = Client(broker.config["grpc"]["port"])
    try:
        st, got = grpc_receive(g, "frozen", topic)
        assert (code(st), got) == ("FORBIDDEN", []) and "frozen" in st.message
        st, got, _next = grpc_pull(g, "frozen", topic, 0, 0)  # PullMessage: the same answer
        assert (code(st), got) == ("FORBIDDEN", []) and "frozen" in st.message
        st, got, _next = grpc_pull(g, "others", topic, 0, 0)
        assert (code(st), [m.body for m in got]) == ("OK", [b"one"])
    finally:
        g.close()
    assert cli(broker, "set", "frozen", "--consumption-enabled", "true") == 0  # enabled again: reads go on
    capsys.readouterr()
    with broker.client() as c:
        assert isinstance(c.get(topic, 0, 0, group="frozen"), ev.Value)


def test_max_retries_set_through_http_dead_letters_a_pop_message_after_its_retries(broker):
    topic = "gs-retry"
    with broker.client() as c:
        c.put_ok(topic, b"poison", 0)
    r = request(broker, "PUT", "/api/group-settings/fragile?max_retries=1")
    assert (r.status, r.json()["max_retries"]) == (200, 1)
    inv = pop_limits.POP_MIN_INVISIBLE_MS
    with SimpleConsumer(url(broker), "fragile", topic, invisible_ms=inv) as a:
        attempts = []
        for _ in range(20):
            attempts += [x.attempt for x in a.receive(1, wait_s=1)]
            if len(attempts) == 2:
                break
        assert attempts == [1, 2]  # the first delivery and its one retry
        assert a.receive(1, wait_s=0.5) == []  # the next receive moved it to the dead letters
    with broker.client() as c:
        dead = c.get("%DLQ%fragile", 0, 0)
        assert isinstance(dead, ev.Value) and b"poison" in dead.body
    g = Client(broker.config["grpc"]["port"])
    try:  # gRPC's Settings answer the group's max_retries + 1 attempts, whatever the client asked
        s = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(
            name="fragile")))
        s.backoff_policy.max_attempts = 16
        answer = next(g.channel.stream_stream(
            "/apache.rocketmq.v2.MessagingService/Telemetry", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString)(iter([pb.TelemetryCommand(settings=s)]),
                                                                  metadata=g.metadata, timeout=10))
        assert answer.settings.backoff_policy.max_attempts == 2
        assert grpc_settings(g, max_attempts=5).settings.backoff_policy.max_attempts == 5  # no group: the client's
    finally:
        g.close()


def test_a_send_back_without_its_own_maximum_takes_the_groups_max_retries(broker, rc):
    request(broker, "PUT", "/api/group-settings/brittle?max_retries=0")
    sent = send_v1(rc, "gs-back", b"poison", props={"UNIQ_KEY": "U9"})
    back = {"offset": parse_offset_msg_id(sent.ext_fields["msgId"])[2], "group": "brittle", "delayLevel": 0,
            "originMsgId": "U9", "originTopic": "gs-back"}
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS  # no maxReconsumeTimes: the group's 0
    [dead] = decode_stored_messages(pull(rc, "%DLQ%brittle", 0, 0, group="admin").body)
    assert dead.body == b"poison"
    other = dict(back, group="sturdy")  # no settings: the broker's remoting.max_reconsume_times (16)
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, other).code == C.SUCCESS
    max_dead = rc.call(R.GET_MAX_OFFSET, {"topic": "%DLQ%sturdy", "queueId": 0})
    assert int(max_dead.ext_fields.get("offset", 0)) == 0  # a retry (scheduled), not a dead letter


def heartbeat(client_id, group, model):
    return json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": model, "consumeFromWhere": 0, "unitMode": False,
        "subscriptionDataSet": [{"topic": "gs-b", "subString": "*", "subVersion": "1", "classFilterMode": False}]}]
    }).encode()


def test_broadcasting_consumers_of_a_group_without_broadcast_are_refused(broker, rc):
    assert request(broker, "PUT", "/api/group-settings/single?broadcast_allowed=false").status == 200
    r = rc.call(R.HEART_BEAT, body=heartbeat("c@1", "single", "BROADCASTING"))
    assert r.code == C.NO_PERMISSION and "can not consume by broadcast way" in r.remark and "single" in r.remark
    assert rc.call(R.HEART_BEAT, body=heartbeat("c@1", "single", "CLUSTERING")).code == C.SUCCESS
    with broker.client() as c:
        c.put_ok("gs-b", b"x", 0)
    assert pull(rc, "gs-b", 0, 0, group="single").code == C.SUCCESS  # clustering: served
    assert rc.call(R.HEART_BEAT, body=heartbeat("c@2", "wide", "BROADCASTING")).code == C.SUCCESS  # no entry
    assert pull(rc, "gs-b", 0, 0, group="wide").code == C.SUCCESS
    assert request(broker, "PUT", "/api/group-settings/wide?broadcast_allowed=false").status == 200
    r = pull(rc, "gs-b", 0, 0, group="wide")  # registered before the change: its pulls are refused now
    assert r.code == C.NO_PERMISSION and "can not consume by broadcast way" in r.remark


def test_a_slow_pull_of_a_group_reading_from_a_slave_is_told_that_slave(broker, rc):
    with broker.client() as c:
        for i in range(3):
            c.put_ok("gs-slow", b"m%d" % i, 0)
    assert request(broker, "PUT", "/api/group-settings/lagging?read_from_slave_when_slow=2").status == 200
    # this broker deems no byte of the log in memory (access_message_in_memory_max_ratio 0): every backlog is slow
    r = pull(rc, "gs-slow", 0, 0, group="lagging", max_nums=1)
    assert (r.code, r.ext_fields["suggestWhichBrokerId"]) == (C.SUCCESS, "2")
    r = pull(rc, "gs-slow", 0, 0, group="quick", max_nums=1)
    assert (r.code, r.ext_fields["suggestWhichBrokerId"]) == (C.SUCCESS, "0")  # no entry: the master, as before


def test_bad_values_and_unknown_settings_are_refused_with_nothing_changed(broker, capsys):
    assert cli(broker, "set", "careful", "--max-retries", "3") == 0
    capsys.readouterr()
    before = show(broker, "careful")
    assert cli(broker, "set", "careful", "--max-retries", "-1") == 3
    assert "max_retries must be 0..%d" % groups_limits.MAX_GROUP_RETRIES in capsys.readouterr().err
    r = request(broker, "PUT", "/api/group-settings/careful?max_retries=2&consumption_enabled=maybe")
    assert r.status == 400 and "consumption_enabled must be true or false" in r.json()["error"]
    r = request(broker, "PUT", "/api/group-settings/careful?retries=2")
    assert r.status == 400 and "unknown group setting retries" in r.json()["error"]
    r = request(broker, "PUT", "/api/group-settings/careful?read_from_slave_when_slow=0")
    assert r.status == 400 and "read_from_slave_when_slow must be 1..%d" % limits.MAX_BROKER_ID in r.json()["error"]
    assert show(broker, "careful") == before  # nothing changed
    assert request(broker, "DELETE", "/api/group-settings/careful").status == 200
    assert show(broker, "careful")["default"] is True
    assert request(broker, "DELETE", "/api/group-settings/careful").status == 404
    listed = {g["group"] for g in request(broker, "GET", "/api/group-settings").json()["groups"]}
    assert "careful" not in listed and "fragile" in listed
