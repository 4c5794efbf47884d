"""An isolated ``async`` master stops acknowledging (``replication.max_isolation_ms``; replication/isolation.py):
the decision with the times passed in, the setting's defaults, and the put path asking it. No network."""

from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.server.config import DEFAULT_MAX_ISOLATION_MS, ConfigError, load_config
from metaq.serving.putpath import AUTHORIZED, PutPath, WriteGate
from metaq.server.replication import isolation
from metaq.server.replication.election import Election
from metaq.server.replication.leadership import Lease
from metaq.server.replication.master import ReplicationServer
from metaq.server.replication.roles import Roles

HA = {"replication.ha": "auto", "replication.port": 8124, "replication.slave_id": 1, "zk.connect": "127.0.0.1:2181"}
T = 5000.0  # a monotonic time


def test_off_never_refuses():
    for bound in (0, 0.0, None):
        assert isolation.refusal(bound, T, T - 100, T - 100) is None


def test_a_channel_that_never_spoke_does_not_count():
    assert isolation.refusal(1.0, T, None, None) is None  # a manual master whose slaves have not connected yet


@pytest.mark.parametrize("slave_at, zk_at", [(T - 1.0, None), (None, T - 1.0), (T - 1.0, T - 50), (T - 50, T - 1.0),
                                             (T - 0.2, T - 0.3)])
def test_either_contact_within_the_bound_keeps_writes(slave_at, zk_at):
    assert isolation.refusal(1.0, T, slave_at, zk_at) is None  # at the bound itself: still within


@pytest.mark.parametrize("slave_at, zk_at", [(T - 1.001, None), (None, T - 1.001), (T - 1.001, T - 1.5),
                                             (T - 30, T - 2)])
def test_no_contact_within_the_bound_refuses_naming_both_silences(slave_at, zk_at):
    why = isolation.refusal(1.0, T, slave_at, zk_at)
    assert why.startswith("ISOLATED: this async master has heard from no slave")
    assert "replication.max_isolation_ms: 1000" in why and "nothing was stored" in why
    if zk_at is not None:
        assert "from ZooKeeper for %.1f s" % (T - zk_at) in why
    if slave_at is not None:
        assert "from no slave for %.1f s" % (T - slave_at) in why


def test_a_late_contact_lifts_the_refusal():
    assert isolation.refusal(1.0, T, T - 3, T - 3) is not None
    assert isolation.refusal(1.0, T, T - 0.01, T - 3) is None  # a slave's ACK after SIGCONT
    assert isolation.refusal(1.0, T, T - 3, T - 0.01) is None  # ZooKeeper confirmed our leadership again


# -- the setting ---------------------------------------------------------------------------------------------------

def bound(overrides):
    return load_config(None, overrides).max_isolation_ms()


def test_the_default_is_on_only_for_an_elected_async_master():
    assert DEFAULT_MAX_ISOLATION_MS == 1000
    assert bound(dict(HA)) == 1000
    assert bound(dict(HA, **{"replication.mode": "sync"})) == 0  # sync: a put waits for the slaves already
    assert bound({}) == 0  # standalone: never refuses
    assert bound({"replication.port": 8124}) == 0  # ha: manual: a person decides a promotion
    assert bound({"replication.max_isolation_ms": 500}) == 0  # no replication port: standalone, whatever it says


def test_an_explicit_setting_wins_and_zero_is_off():
    assert bound(dict(HA, **{"replication.max_isolation_ms": 0})) == 0
    assert bound(dict(HA, **{"replication.max_isolation_ms": 250})) == 250
    assert bound({"replication.port": 8124, "replication.max_isolation_ms": 2000}) == 2000
    assert bound(dict(HA, **{"replication.max_isolation_ms": 600000})) == 600000


@pytest.mark.parametrize("value", [-1, 600001, "soon"])
def test_a_bad_setting_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match="max_isolation_ms"):
        load_config(None, dict(HA, **{"replication.max_isolation_ms": value}))


def test_a_live_slave_is_heard_within_a_quarter_of_the_bound():
    server = ReplicationServer(None, None, load_config(None, dict(HA)))
    assert server.isolation_s == 1.0 and server.heartbeat_s == 0.25 and server.heard_at is None
    off = ReplicationServer(None, None, load_config(None, dict(HA, **{"replication.max_isolation_ms": 0})))
    assert off.isolation_s == 0 and off.heartbeat_s == 1.0


def test_the_lease_is_renewed_within_a_quarter_of_the_bound():
    def every(overrides):
        return Election(load_config(None, overrides), None, None, None, "/ids/7", lambda: "meta://h:1").renew_every_s()

    assert every(dict(HA)) == 0.25  # the bound (1 s), not the lease (15 s), sets the pace
    assert every(dict(HA, **{"replication.max_isolation_ms": 0})) == 15.0 / 4
    assert every(dict(HA, **{"replication.mode": "sync"})) == 15.0 / 4
    assert every(dict(HA, **{"replication.max_isolation_ms": 60000})) == 15.0 / 4  # the lease's pace when shorter


def test_the_lease_remembers_when_zookeeper_last_confirmed_us():
    lease = Lease(2.0)
    assert lease.confirmed_at is None
    assert lease.renew(10.0, lease.generation) and lease.confirmed_at == 10.0
    lease.renew(9.0)  # a reply to an older request: never back
    assert lease.confirmed_at == 10.0
    old = lease.generation
    lease.revoke("deposed")
    assert lease.confirmed_at is None
    assert not lease.renew(11.0, old) and lease.confirmed_at is None


# -- the put path asks it ------------------------------------------------------------------------------------------

def path_of(heard_at, confirmed_at=None, isolation_s=1.0, slave_link=None, election=True):
    lease = SimpleNamespace(confirmed_at=confirmed_at)
    roles = SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None, slave_link=slave_link,
                            replication=SimpleNamespace(isolation_s=isolation_s, heard_at=heard_at),
                            election=SimpleNamespace(lease=lease) if election else None)
    roles.isolation_refusal = lambda: Roles.isolation_refusal(roles)  # the real decision over these parts
    return PutPath(None, None, None, None, roles, WriteGate())


def test_every_writer_of_an_isolated_master_gets_503(monkeypatch):
    monkeypatch.setattr("metaq.server.replication.roles.time.monotonic", lambda: T)
    path = path_of(heard_at=T - 2.0, confirmed_at=T - 1.5)
    exc = path.write_refusal("orders", AUTHORIZED)
    assert isinstance(exc, errors.Unavailable) and exc.code == 503 and "ISOLATED" in str(exc)
    assert path.refusal.startswith("ISOLATED")  # the burst paths fall back to the one decision
    with pytest.raises(errors.Unavailable, match="ISOLATED"):
        path.check_writable()  # commits, cancels, admin writes
    assert path_of(heard_at=T - 2.0, confirmed_at=T - 0.5).write_refusal("orders", AUTHORIZED) is None
    assert path_of(heard_at=T - 0.5, confirmed_at=None, election=False).write_refusal("orders", AUTHORIZED) is None
    assert path_of(heard_at=T - 2.0, isolation_s=0).write_refusal("orders", AUTHORIZED) is None
    assert path_of(heard_at=None, election=False).refusal is None  # manual, no slave yet: as before


def test_a_slave_or_a_standalone_broker_is_never_isolated(monkeypatch):
    monkeypatch.setattr("metaq.server.replication.roles.time.monotonic", lambda: T)
    assert path_of(heard_at=T - 9, slave_link=object()).isolation_refusal() is None
    standalone = PutPath(None, None, None, None, SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None,
                                                                 replication=None, election=None,
                                                                 isolation_refusal=lambda: None),
                         WriteGate())
    assert standalone.write_refusal("orders", None) is None
