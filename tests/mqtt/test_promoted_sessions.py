"""A promoted slave's sessions (metaq.mqtt.port ``MqttPort.role_changed``): the real port over a real store, the
master's records written by a second port on the same log. Those the slave learned by following, or reloaded after a
cut, are ``recovered`` once it is promoted, as those a broker loads at its start are (in an MQTT cluster they give
way to a copy another broker holds live: docs/mqtt.md "Which copy stands after a restart"); a CONNECT claiming one
makes it this broker's own; none counts as begun by a Clean Start 1 CONNECT."""

from types import SimpleNamespace

import pytest

from metaq.mqtt.follow import SavedSession
from metaq.mqtt.port import MqttPort
from metaq.server.guard import Guard
from metaq.clock import now_ms
from tests.server.test_inprocess import Parts, config


class _Role:
    def __init__(self, master):
        self.master = master

    def __call__(self):
        return self.master


def _port(p, role):
    return MqttPort(p.core, p.config.mqtt, p.store, p.path, Guard(p.config.security), p.waiters,
                    p.config.store.max_transfer_size, role)


def _session(client_id):
    return SavedSession(client_id, None, 5, 600, now_ms(), True, [("t/#", 1, False, ["t"], False, None)], {}, [],
                        [], [])


def _connection():
    return SimpleNamespace(session=SimpleNamespace(user=None))


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    yield p
    p.close()


def _master_and_slave(parts):
    """``(master port, slave port, the slave's role)`` over one log: what the first writes the second follows."""
    master = _port(parts, _Role(True))
    role = _Role(False)
    slave = _port(parts, role)
    assert slave.follow.replicating
    return master, slave, role


def _promote(slave, role):
    role.master = True
    slave.role_changed(None)


def test_a_promoted_slaves_learned_sessions_count_as_recovered(parts):
    master, slave, role = _master_and_slave(parts)
    for client_id in ("meter-1", "meter-2"):
        master.adopt(_session(client_id))  # the master's records of its devices' sessions
    _promote(slave, role)
    assert sorted(slave.table.sessions) == ["meter-1", "meter-2"]
    assert not slave.table.sessions["meter-1"].connected  # their connections ended with the old master
    assert slave.recovered("meter-1") and slave.recovered("meter-2")
    conn = _connection()
    assert slave.claim(conn, "meter-1", False) is None  # a CONNECT to the promoted broker: its own from now on
    assert not slave.recovered("meter-1") and slave.recovered("meter-2")
    slave.release(conn, "meter-1")
    assert not slave.recovered("meter-1")  # claimed once: never a recovered copy again
    slave.end_session("meter-2")
    assert not slave.recovered("meter-2") and "meter-2" not in slave.table.sessions


def test_sessions_a_slave_reloaded_after_a_cut_count_as_recovered_once_promoted(parts):
    master, slave, role = _master_and_slave(parts)
    master.adopt(_session("meter-1"))
    kept = parts.store.written_position
    master.adopt(_session("meter-2"))  # the old master's tail, cut at the handshake with the new one
    parts.store.follow_now(slave.follow)
    with parts.store_lock:
        parts.store.truncate_log(kept, now_ms())
    _promote(slave, role)
    assert list(slave.table.sessions) == ["meter-1"]
    assert slave.recovered("meter-1") and not slave.recovered("meter-2")


def test_a_session_a_slave_learned_is_not_begun_by_a_clean_start_connect_to_the_slave(parts):
    """A slave takes a connection with Clean Start 1 and no session expiry (it keeps no session): one of a client
    id whose session it learned, ended before the promotion, did not begin that session; one still open did begin
    what it holds."""
    master, slave, role = _master_and_slave(parts)
    master.adopt(_session("meter-1"))
    parts.store.follow_now(slave.follow)
    gone, still = _connection(), _connection()
    assert slave.claim(gone, "meter-1", True) is None
    slave.release(gone, "meter-1")
    assert slave.claim(still, "probe-1", True) is None
    _promote(slave, role)
    assert not slave.began_clean("meter-1") and slave.recovered("meter-1")
    assert slave.began_clean("probe-1") and not slave.recovered("probe-1")


def test_a_master_keeps_its_own_recovered_set_when_told_it_is_master(parts):
    """The role told again to a broker that was master already (no promotion) changes nothing: a session its
    connection claimed stays its own."""
    master = _port(parts, _Role(True))
    master.adopt(_session("meter-1"))
    assert not master.recovered("meter-1")  # written by this broker as master: not recovered
    master.role_changed(None)
    assert not master.recovered("meter-1")
