"""put_idem on a broker with authentication: 401 before auth, 403 for a topic the user may not publish to (the
general path and the burst path alike), nothing stored for either."""

from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize
from tests.harness.acl import login, secured_config


def idem(topic, seq, opaque):
    body = b"m%d" % seq
    return IdempotentPut(topic, 0, 0, body, opaque, metaq_checksum(body), 31, seq)


def test_put_idem_needs_a_user_who_may_publish(broker_factory, tmp_path):
    b = broker_factory(secured_config(tmp_path))
    with b.client() as c:
        r = c.call(idem("orders", 0, 1))
        assert r.code == 401 and b"authentication required" in r.body
    c = login(b, "alice")
    topics = ["orders"] * 20 + ["payroll"] + ["orders"] * 5
    c.send(b"".join(serialize(idem(t, i, i)) for i, t in enumerate(topics)))  # one pipeline: the burst path
    replies = [c.read_event() for _ in topics]
    assert [r.code for r in replies] == [200] * 20 + [403] + [200] * 5
    assert b"alice may not publish to topic payroll" in replies[20].body
    assert c.call(idem("payroll", 99, 99)).code == 403  # alone: the general path
    c.close()
    with login(b, "admin") as admin:
        assert admin.stats_dict()["idempotent_puts"] == "25"
        assert "payroll" not in admin.stats("topics")
