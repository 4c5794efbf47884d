"""The one topic-write decision (``PutPath.write_refusal``), without a network: its order, its answers, and the
burst paths' filter giving the same answers."""

from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.timers.records import TIMER_TOPIC
from metaq.server.config import load_config
from metaq.server.guard import Guard
from metaq.serving.putpath import AUTHORIZED, PutPath, WriteGate
from metaq.serving.takers import before_refused_topic, writable_topics
from tests.harness.acl import write_acl
from tests.server.test_guard import login

REFUSED_NAMES = (SCHEDULE_TOPIC, TIMER_TOPIC, "%RESENT%billing", "orders%P1")


def path_with(guard=None, slave=None, gate=None, unconfirmable=None):
    roles = SimpleNamespace(slave_refusal=slave, unconfirmable_refusal=unconfirmable, replication=None, election=None,
                            isolation_refusal=lambda: None)
    return PutPath(None, None, None, None, roles, gate or WriteGate(), guard=guard)


@pytest.fixture
def guard(tmp_path):
    return Guard(load_config(None, {"security.acl_file": write_acl(tmp_path / "acl.yaml")}).security)


def test_auth_off_refuses_only_the_broker_s_own_topics():
    path = path_with()
    assert path.write_refusal("orders", None) is None
    for name in REFUSED_NAMES:
        exc = path.write_refusal(name, None)
        assert isinstance(exc, errors.ClientError) and exc.code == 400, name
    assert "internal topic for delayed delivery" in str(path.write_refusal(SCHEDULE_TOPIC, None))
    assert "internal topic for timers" in str(path.write_refusal(TIMER_TOPIC, None))
    assert "internal topic for the transaction journal" in str(path.write_refusal("%TX%", None))
    assert "internal topic for per-message acknowledgements" in str(path.write_refusal("%POP%", None))
    assert "internal topic for MQTT sessions" in str(path.write_refusal("%MQTT%", None))
    assert "priority level's internal topic" in str(path.write_refusal("orders%P1", None))
    assert path.write_refusal("%RESENT%billing", AUTHORIZED, internal=True) is None  # the broker's own journal write


def test_permission_comes_first_then_the_broker_then_the_name(guard):
    gate = WriteGate()
    gate.disk_full("disk full")
    alice = login(guard, guard.session("127.0.0.1"), "alice")
    slave = path_with(guard, slave="this broker is a slave")
    full = path_with(guard, gate=gate)
    assert isinstance(slave.write_refusal("payroll", alice), errors.Forbidden)
    assert isinstance(slave.write_refusal("payroll", guard.session("127.0.0.1")), errors.Unauthenticated)
    assert isinstance(slave.write_refusal("orders", alice), errors.Unavailable)
    assert isinstance(full.write_refusal("orders", alice), errors.DiskFull)
    assert isinstance(slave.write_refusal(SCHEDULE_TOPIC, AUTHORIZED), errors.Unavailable)
    # the internal topics are an admin's at the guard (403) and nobody's at the name (400)
    assert isinstance(path_with(guard).write_refusal(SCHEDULE_TOPIC, alice), errors.Forbidden)
    admin = login(guard, guard.session("127.0.0.1"), "admin")
    exc = path_with(guard).write_refusal(SCHEDULE_TOPIC, admin)
    assert type(exc) is errors.ClientError and exc.code == 400


def test_check_write_raises_the_refusal(guard):
    alice = login(guard, guard.session("127.0.0.1"), "alice")
    path = path_with(guard)
    path.check_write("orders", alice)
    with pytest.raises(errors.Forbidden, match="alice may not publish to topic payroll"):
        path.check_write("payroll", alice)


def test_the_burst_filter_answers_as_the_decision(guard):
    alice = login(guard, guard.session("127.0.0.1"), "alice")
    path = path_with(guard)
    may = writable_topics(path, alice)
    for name in ("orders", "orders-eu", "payroll", "x") + REFUSED_NAMES:
        assert may(name.encode()) is (path.write_refusal(name, alice) is None), name
    frames = [(t, 0) for t in (b"orders", b"orders", b"orders-eu", b"payroll", b"orders")]
    assert before_refused_topic(frames, writable_topics(path, alice)) == frames[:3]


def test_the_burst_filter_asks_once_per_topic():
    asked = []

    class Counting:
        def write_refusal(self, topic, session):
            asked.append(topic)
            return None

    may = writable_topics(Counting(), None)
    assert all(may(t) for t in (b"a", b"b", b"a", b"a", b"b"))
    assert asked == ["a", "b"]


def test_a_sync_master_no_slave_could_confirm_for_refuses_before_writing_after_the_other_refusals(guard):
    """Issue 41 point 5: the refusal is part of the one decision, after a slave's and the gate's; a put of any path
    asks it (check_write) before anything is written, and its text says nothing was stored."""
    alone = "SLAVE_NOT_AVAILABLE: replication mode is sync and no slave is connected: nothing was stored"
    exc = path_with(unconfirmable=alone).write_refusal("orders", None)
    assert type(exc) is errors.Unavailable and exc.code == 503 and "nothing was stored" in str(exc)
    with pytest.raises(errors.Unavailable, match="nothing was stored"):
        path_with(unconfirmable=alone).check_write("orders", AUTHORIZED, internal=True)
    with pytest.raises(errors.Unavailable, match="nothing was stored"):
        path_with(unconfirmable=alone).check_writable()  # a commit, a cancel, a resend
    gate = WriteGate()
    gate.disk_full("disk full")
    assert isinstance(path_with(gate=gate, unconfirmable=alone).write_refusal("orders", None), errors.DiskFull)
    assert str(path_with(slave="a slave", unconfirmable=alone).write_refusal("orders", None)) == "a slave"
    alice = login(guard, guard.session("127.0.0.1"), "alice")
    assert isinstance(path_with(guard, unconfirmable=alone).write_refusal("payroll", alice), errors.Forbidden)


def test_a_write_without_a_topic_is_refused_from_the_moment_the_broker_refuses():
    gate = WriteGate()
    roles = SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None, replication=None, election=None,
                            isolation_refusal=lambda: None)
    path = PutPath(None, None, None, None, roles, gate)
    gate.on_change = path.changed  # as the broker wires them
    path.check_writable()
    path.check_writable()
    gate.disk_full("the disk is full")
    with pytest.raises(errors.DiskFull):
        path.check_writable()
    gate.refresh()  # space again
    path.check_writable()
    roles.slave_refusal = "this broker is a slave now"
    path.changed()  # what the roles' listeners are told at a deposition
    with pytest.raises(errors.Unavailable, match="slave now"):
        path.check_writable()
    with pytest.raises(errors.Unavailable, match="slave now"):
        path.check_writable()


def test_an_elected_master_s_writes_without_a_topic_ask_its_lease_each_time():
    roles = SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None, replication=None,
                            election=SimpleNamespace(), isolation_refusal=lambda: None)
    path = PutPath(None, None, None, None, roles, WriteGate())
    path.check_writable()
    roles.slave_refusal = "its lease ran out"  # moves with the clock: nobody is told
    with pytest.raises(errors.Unavailable, match="lease ran out"):
        path.check_writable()
