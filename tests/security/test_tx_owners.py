"""XA branches belong to the user who began them, and admin commands need the admin role (text port).

Real broker processes with a permissions file (``tests/harness/acl.py``: admin, alice, bob, reader), real
``auth`` handshakes, real restarts: what each user is answered is what these tests check.
"""

import contextlib

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.transactions.wire import XA_HEURCOM, XAER_DUPID, XAER_NOTA
from tests.harness.acl import SECRETS, write_acl
from tests.harness.tx import ok, payloads, recovered, tput, tx, tx_put, xa_code

pytestmark = pytest.mark.integration

RM = "shop-rm"
XID1 = "XID:1:0a01:b1:%s" % RM
XID2 = "XID:1:0a02:b1:%s" % RM
XID3 = "XID:1:0a03:b1:%s" % RM
NOT_OWNER = "permission denied: user bob may not act on transaction %s: it belongs to another user"
NOT_ADMIN = "permission denied: user %s is not an admin (the admin role is needed)"


@pytest.fixture
def acl_path(tmp_path):
    return write_acl(tmp_path / "acl.yaml")


@pytest.fixture
def secure(broker_factory, tmp_path, acl_path):
    return broker_factory(small_config(tmp_path / "data", security={"acl_file": acl_path}))


@contextlib.contextmanager
def login(broker, name):
    c = broker.client()
    try:
        r = c.auth(name, SECRETS[name])
        assert isinstance(r, ev.Result) and r.code == 200, r
        yield c
    finally:
        c.close()


def refused(reply, text, code=403):
    """The reply is ``result <code>`` whose text starts with ``text``."""
    assert isinstance(reply, ev.Result) and reply.code == code, reply
    assert bytes(reply.body).decode().startswith(text), reply.body
    return reply


def prepare(c, key, *bodies, topic="orders"):
    ok(tx(c, key, "BEGIN", 60, RM))
    for body in bodies:
        tput(c, key, topic, 0, body)
    c.send(b"transaction %s s1 END 0\r\n" % key.encode())  # no reply
    assert ok(tx(c, key, "PREPARE")) == b"0"


def test_a_prepared_branch_is_its_owners_even_after_a_restart(secure):
    with login(secure, "alice") as alice:
        prepare(alice, XID1, b"alice's order")
        assert recovered(alice) == [XID1] and recovered(alice, RM) == [XID1]
    with login(secure, "bob") as bob:  # bob may publish to orders: only the owner check refuses him
        for kind in ("COMMIT_TWO_PHASE", "ROLLBACK", "FORGET", "PREPARE", "COMMIT_ONE_PHASE"):
            refused(tx(bob, XID1, kind), NOT_OWNER % XID1)
        refused(tx_put(bob, XID1, "orders", 0, b"bob's addition"), NOT_OWNER % XID1)
        refused(tx(bob, XID1, "HEURISTIC_COMMIT"), NOT_ADMIN % "bob")
        assert recovered(bob) == [] and recovered(bob, RM) == []
        assert xa_code(tx(bob, XID1, "BEGIN", 60, RM)) == XAER_DUPID  # ids are global: a taken one stays taken
        assert xa_code(tx(bob, XID2, "COMMIT_TWO_PHASE")) == XAER_NOTA  # unknown: as for anyone
    secure.kill()
    secure.start()
    with login(secure, "bob") as bob:
        assert recovered(bob) == []
        refused(tx(bob, XID1, "COMMIT_TWO_PHASE"), NOT_OWNER % XID1)
        refused(tx(bob, XID1, "ROLLBACK"), NOT_OWNER % XID1)
    with login(secure, "alice") as alice:
        assert recovered(alice) == [XID1]
        assert payloads(alice, "orders", 0) == []
        ok(tx(alice, XID1, "COMMIT_TWO_PHASE"))
        assert payloads(alice, "orders", 0) == [b"alice's order"]
        assert recovered(alice) == []
        ok(tx(alice, XID1, "COMMIT_TWO_PHASE"))  # her retry is answered with the decision
    with login(secure, "bob") as bob:  # the decision stays hers: bob learns nothing of it
        refused(tx(bob, XID1, "COMMIT_TWO_PHASE"), NOT_OWNER % XID1)
        refused(tx(bob, XID1, "ROLLBACK"), NOT_OWNER % XID1)


def test_an_admin_sees_and_decides_every_branch(secure):
    with login(secure, "alice") as alice:
        prepare(alice, XID1, b"one")
        prepare(alice, XID2, b"two")
    with login(secure, "bob") as bob:
        prepare(bob, XID3, b"bob's")
        assert recovered(bob) == [XID3]
        refused(tx(bob, XID1, "HEURISTIC_COMMIT"), NOT_ADMIN % "bob")
        refused(tx(bob, XID1, "HEURISTIC_ROLLBACK"), NOT_ADMIN % "bob")
    with login(secure, "admin") as admin:
        assert recovered(admin) == [XID1, XID2, XID3]
        ok(tx(admin, XID1, "HEURISTIC_COMMIT"))
        ok(tx(admin, XID2, "HEURISTIC_ROLLBACK"))
        ok(tx(admin, XID3, "ROLLBACK"))  # an admin may also act as the owner would
        assert payloads(admin, "orders", 0) == [b"one"]
    with login(secure, "alice") as alice:
        assert xa_code(tx(alice, XID1, "COMMIT_TWO_PHASE")) == XA_HEURCOM  # told what the operator decided
        assert recovered(alice) == [XID1, XID2]  # the outcomes are hers to forget
    with login(secure, "bob") as bob:
        assert recovered(bob) == []
        refused(tx(bob, XID1, "FORGET"), NOT_OWNER % XID1)
    with login(secure, "alice") as alice:
        ok(tx(alice, XID1, "FORGET"))
        assert recovered(alice) == [XID2]
    with login(secure, "admin") as admin:
        ok(tx(admin, XID2, "FORGET"))
        assert recovered(admin) == []


def test_a_transactional_put_needs_pub_on_its_topic(secure):
    with login(secure, "alice") as alice:
        ok(tx(alice, XID1, "BEGIN", 60, RM))
        refused(tx_put(alice, XID1, "payroll", 0, b"salaries"), "permission denied: user alice may not publish to "
                                                               "topic payroll")
        assert ok(tx(alice, XID1, "PREPARE")) == b"3"  # XA_RDONLY: the refused put left nothing in the branch


def test_every_admin_command_is_refused_to_a_non_admin(secure):
    with login(secure, "alice") as alice:
        prepare(alice, XID1, b"in doubt")
    for name in ("alice", "bob", "reader"):
        with login(secure, name) as c:
            not_admin = NOT_ADMIN % name
            refused(c.call(ev.Promote(False, c.opaque())), not_admin)
            refused(c.call(ev.Promote(True, c.opaque())), not_admin)
            refused(c.call(ev.Stats("reset", c.opaque())), not_admin)
            refused(c.call(ev.Stats("transactions", c.opaque())), not_admin)
            refused(tx(c, XID1, "HEURISTIC_COMMIT"), not_admin)
            refused(tx(c, XID1, "HEURISTIC_ROLLBACK"), not_admin)
            refused(c.call(ev.Sync("orders", 0, 0, 1, b"x", c.opaque())), not_admin)
            assert recovered(c) == ([XID1] if name == "alice" else [])
            ok(c.call(ev.Stats(None, c.opaque())))  # the summary: any user
    with login(secure, "bob") as bob:  # bob may consume as no group
        refused(bob.call(ev.CommitOffset("billing", "orders", 0, 0, bob.opaque())),
                "permission denied: user bob may not consume as group billing")
    with login(secure, "alice") as alice:  # alice consumes as billing only
        refused(alice.call(ev.CommitOffset("audit", "orders", 0, 0, alice.opaque())),
                "permission denied: user alice may not consume as group audit")
        ok(alice.call(ev.CommitOffset("billing", "orders", 0, 0, alice.opaque())))
    with login(secure, "admin") as admin:  # the same commands pass the check (and do what they do)
        refused(admin.call(ev.Promote(False, admin.opaque())), "not a slave: broker 7 is already a master",
                code=400)
        ok(admin.call(ev.Stats("reset", admin.opaque())))
        assert XID1 in ok(admin.call(ev.Stats("transactions", admin.opaque()))).decode()
        refused(admin.call(ev.Sync("orders", 0, 0, 1, b"x", admin.opaque())),
                "sync is accepted only by a replication slave", code=503)
        ok(admin.call(ev.CommitOffset("audit", "orders", 0, 0, admin.opaque())))
        assert recovered(admin) == [XID1]
        ok(tx(admin, XID1, "HEURISTIC_ROLLBACK"))
        ok(tx(admin, XID1, "FORGET"))
    with secure.client() as anonymous:  # and nothing at all before auth
        for reply in (tx(anonymous, "null", "RECOVER"), tx(anonymous, XID1, "BEGIN", 60, RM),
                      anonymous.call(ev.Promote(False, anonymous.opaque()))):
            refused(reply, "authentication required", code=401)


def test_a_branch_from_before_authentication_is_the_admins(broker_factory, tmp_path, acl_path):
    """Begun with authentication off (no owner), the branch is left to an admin once it is turned on."""
    b = broker_factory(small_config(tmp_path / "data"))
    with b.client() as c:
        prepare(c, XID1, b"from before")
        assert recovered(c) == [XID1]
    b.stop()
    b.config["security"] = {"acl_file": acl_path}
    b.start()
    with login(b, "alice") as alice:
        assert recovered(alice) == []
        refused(tx(alice, XID1, "COMMIT_TWO_PHASE"), "permission denied: user alice may not act on transaction")
    with login(b, "admin") as admin:
        assert recovered(admin) == [XID1]
        ok(tx(admin, XID1, "COMMIT_TWO_PHASE"))
        assert payloads(admin, "orders", 0) == [b"from before"]
