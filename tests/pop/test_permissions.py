"""Per-message acknowledgement's permissions (docs/messaging.md "Per-message acknowledgement (POP)"): as a `get`
with a group, consume as the group and subscribe to the topic; the POP journal is an admin's."""

from metaq.pop.wire import Ack, ChangeInvisible, Receive
from metaq.protocol import events as ev
from tests.harness.acl import login, secured_config


def test_receive_ack_and_change_need_the_group_and_the_topic(broker_factory, tmp_path):
    b = broker_factory(secured_config(tmp_path))
    alice, bob = login(b, "alice"), login(b, "bob")  # alice: orders* pub|sub, group billing; bob: publishes orders
    try:
        assert alice.put_ok("orders", b"x", 0)
        r = alice.call(Receive("orders", "billing", 1, 60_000, False, 1))
        assert r.code == 200 and r.body
        for who, event in ((bob, Receive("orders", "billing", 1, 60_000, False, 2)),  # no subscribe, no group
                           (alice, Receive("orders", "payments", 1, 60_000, False, 3)),  # not alice's group
                           (alice, Receive("payroll", "billing", 1, 60_000, False, 4)),  # a topic denied her
                           (bob, Ack("orders", "billing", ("0:0:1:1",), 5)),
                           (bob, ChangeInvisible("orders", "billing", "0:0:1:1", 1000, 6))):
            r = who.call(event)
            assert isinstance(r, ev.Result) and r.code == 403, (event, r)
        r = alice.call(ev.Get("%POP%", "billing", 0, 0, 1024, 7, None))  # the journal: an admin's only
        assert r.code == 403
        assert alice.put("%POP%", b"x", 0).code in (400, 403)
    finally:
        alice.close()
        bob.close()
