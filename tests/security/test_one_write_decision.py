"""Every write path refuses the same way (``PutPath.write_refusal``, the one decision): a user without the permission
and the broker's internal topics get the same code and the same words on the text put, a put_idem burst, a put_at
burst, a transactional put, a RocketMQ send, an HTTP put and an MQTT PUBLISH, and nothing is stored."""

from types import SimpleNamespace
from urllib.parse import quote

import pytest

from metaq.client.local import BrokerProcess, rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.mqtt import wire
from metaq.protocol.checksum import metaq_checksum
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.protocol.rocketmq.remoting import ResponseCode
from metaq.protocol.text import serialize
from metaq.timers.records import TIMER_TOPIC
from metaq.timers.wire import TimerPut
from metaq.serving.putpath import AUTHORIZED, PutPath, WriteGate
from tests.harness.acl import SECRETS, login, write_acl
from tests.harness.http import request, with_http
from tests.harness.mqtt import Raw, with_mqtt
from tests.harness.rocketmq import send_v1

ACL = "org.apache.rocketmq.acl.common.AclException: "
DENIED = "permission denied: user alice may not publish to topic payroll"
INTERNAL = (SCHEDULE_TOPIC, TIMER_TOPIC, "%RESENT%billing", "orders%P1")


def refusal_of(topic):
    """What the one decision says of ``topic`` for a writer it lets through otherwise."""
    path = PutPath(None, None, None, None, SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None,
                                                           replication=None, election=None,
                                                           isolation_refusal=lambda: None),
                   WriteGate())
    return str(path.write_refusal(topic, AUTHORIZED))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One broker for the module (text, remoting and HTTP ports, authentication on), killed at its end."""
    tmp = tmp_path_factory.mktemp("decision")
    cfg = rmq_config(tmp / "data", {}, security={"acl_file": write_acl(tmp / "acl.yaml")})
    (tmp / "b").mkdir()
    b = BrokerProcess(tmp / "b", with_mqtt(with_http(cfg)), ())
    b.start()
    yield b
    b.kill()


def plain(topic, opaque):
    return ev.Put(topic, 0, 0, b"p", opaque, metaq_checksum(b"p"))


def idem(topic, seq, opaque, pid=77):
    """A put_idem; ``pid``: a producer id of the user's own (another user's is refused: docs/security.md
    "Quotas")."""
    body = b"i%d" % seq
    return IdempotentPut(topic, 0, 0, body, opaque, metaq_checksum(body), pid, seq)


def timed(topic, opaque):
    return TimerPut(topic, 0, 0, b"t", opaque, metaq_checksum(b"t"), "+600000")


def text_refusals(b, user, topic):
    """``(code, body)`` of a put to ``topic`` by ``user`` on each text path, in a pipeline after accepted ones."""
    out = {}
    with login(b, user) as c:
        out["put"] = c.call(plain(topic, 1))
        pid = 77 + sum(user.encode())
        frames = [idem("orders", i, i, pid) for i in range(5)] + [idem(topic, 0, 5, pid)]  # one pipeline: burst path
        c.send(b"".join(serialize(f) for f in frames))
        replies = [c.read_event() for _ in frames]
        assert [r.code for r in replies[:5]] == [200] * 5, replies
        out["put_idem burst"] = replies[5]
        frames = [timed("orders", i) for i in range(5)] + [timed(topic, 5)]
        c.send(b"".join(serialize(f) for f in frames))
        replies = [c.read_event() for _ in frames]
        assert [r.code for r in replies[:5]] == [200] * 5, replies
        out["put_at burst"] = replies[5]
        out["transactional put"] = c.call(ev.Put(topic, 0, 0, b"x", c.opaque(), -1, "TX:decision:1"))
    return {path: (r.code, r.body.decode()) for path, r in out.items()}


def remoting_refusal(b, user, topic):
    with RemotingClient(b.config["remoting"]["port"], credentials=(user, SECRETS[user])) as rc:
        r = send_v1(rc, topic, b"r", queue=0)
    return r.code, r.remark


def http_refusal(b, user, topic):
    r = request(b, "POST", "/api/topics/%s/messages?partition=0" % quote(topic, safe=""), body=b"h", user=user,
                secret=SECRETS[user])
    return r.status, r.json()["error"]


def mqtt_refusal(b, user, topic):
    """The MQTT 5 PUBACK of a QoS 1 PUBLISH to ``topic`` (its first level) by ``user``: (reason code, reason string)."""
    raw = Raw(b)
    assert raw.connect("decision-%s" % user, username=user, password=SECRETS[user].encode()).reason_code == 0
    raw.send(wire.Publish(topic + "/x", b"m", 1, packet_id=1))
    ack = raw.read()
    raw.close()
    return ack.reason_code, ack.properties.get("reason_string")


def test_a_user_without_the_permission_is_refused_alike_on_every_path(broker):
    assert set(text_refusals(broker, "alice", "payroll").values()) == {(403, DENIED)}
    assert remoting_refusal(broker, "alice", "payroll") == (
        ResponseCode.SYSTEM_ERROR, ACL + "No default permission for topic:payroll (%s)" % DENIED)  # RocketMQ's words
    assert http_refusal(broker, "alice", "payroll") == (403, DENIED)
    assert mqtt_refusal(broker, "alice", "payroll") == (wire.NOT_AUTHORIZED, DENIED)
    with login(broker, "admin") as admin:
        assert "payroll" not in admin.stats("topics")


@pytest.mark.parametrize("topic", INTERNAL)
def test_an_internal_topic_is_refused_alike_on_every_path(broker, topic):
    expected = refusal_of(topic)
    assert set(text_refusals(broker, "admin", topic).values()) == {(400, expected)}
    assert remoting_refusal(broker, "admin", topic) == (ResponseCode.INVALID_PARAMETER, expected)
    assert http_refusal(broker, "admin", topic) == (400, expected)
    assert mqtt_refusal(broker, "admin", topic) == (wire.IMPLEMENTATION_SPECIFIC_ERROR, expected)


def test_a_user_who_may_not_is_refused_an_internal_topic_by_the_guard_first(broker):
    replies = text_refusals(broker, "alice", SCHEDULE_TOPIC)
    assert {code for code, _body in replies.values()} == {403}, replies
    assert http_refusal(broker, "alice", SCHEDULE_TOPIC)[0] == 403
