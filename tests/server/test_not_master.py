"""Issue 41 points 4 and 5 without a network: who refuses an offset commit (``Roles.not_master``, the decision puts
read) and how the refusal names the master; when a ``sync`` master refuses a put before writing it
(``ReplicationServer.no_slave_refusal``); the client reading the refusal back and committing on the named master."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.client.message import Partition
from metaq.client.replies import reply_error
from metaq.client.offsets import BrokerOffsetStore
from metaq.protocol import events as ev
from metaq.server.config import load_config
from metaq.server.replication.insync import InSyncSet
from metaq.server.replication.leadership import Lease
from metaq.server.replication.master import ReplicationServer, SlaveState
from metaq.server.replication.roles import Roles

MASTER = "meta://10.0.0.5:8123"


def roles_of(role="slave", slave_link=None, election=None):
    """A Roles as the put path and the dispatchers read it (its state set by hand: no store, no links)."""
    roles = Roles.__new__(Roles)
    roles.config = load_config(None, {"broker.id": 7})
    roles.role, roles.slave_link, roles.election, roles.replication = role, slave_link, election, None
    roles.behind = roles.unrecorded = None  # neither behind a recorded epoch nor waiting to record its own
    return roles


def election(leader, leading=False, member=1, lease_refusal=None):
    lease = SimpleNamespace(refusal=lambda: lease_refusal)
    return SimpleNamespace(current_leader=lambda: leader, leading=leading, member=member, lease=lease)


def test_a_member_following_the_elected_master_refuses_commits_naming_it():
    roles = roles_of(slave_link=SimpleNamespace(master="10.0.0.5:8124"),
                     election=election({"member": 0, "url": MASTER, "replication": "10.0.0.5:8124"}))
    exc = roles.not_master()
    assert isinstance(exc, errors.NotMaster) and isinstance(exc, errors.Unavailable) and exc.code == 503
    assert exc.master == MASTER
    assert str(exc) == ("NOT_MASTER: this broker is not the master: this broker is a replication slave of "
                        "10.0.0.5:8124 (read-only): send puts to the master; the master is %s" % MASTER)


def test_a_member_with_no_master_and_a_manual_slave_refuse_without_naming_one():
    waiting = roles_of(election=election(None)).not_master()
    assert waiting.master is None and "no elected master yet" in str(waiting)
    assert str(waiting).endswith("; the master is not known here")
    manual = roles_of(slave_link=SimpleNamespace(master="10.0.0.5:8124")).not_master()
    assert manual.master is None and "replication slave of 10.0.0.5:8124" in str(manual)


def test_a_master_whose_lease_ran_out_refuses_commits_at_once_and_never_names_itself():
    """A deposed master (paused past its session, then resumed) refuses from the moment its lease says so, before
    its election pass has seen the new leader."""
    ours = {"member": 1, "url": "meta://10.0.0.6:8123"}
    roles = roles_of(role="master", election=election(ours, leading=True, lease_refusal="its lease expired"))
    exc = roles.not_master()
    assert isinstance(exc, errors.NotMaster) and exc.master is None and "its lease expired" in str(exc)
    lease = Lease(0.01)  # the real lease: renewed, then past its duration
    lease.renew(0.0, lease.generation)
    assert lease.refusal() is not None
    deposed = roles_of(role="master", election=SimpleNamespace(current_leader=lambda: ours, leading=True, member=1,
                                                                lease=lease))
    assert deposed.not_master() is not None and deposed.slave_refusal is not None  # the one decision, both


def test_the_master_that_may_acknowledge_takes_commits():
    assert roles_of(role="master").not_master() is None
    assert roles_of(role="master", election=election({"member": 1, "url": MASTER}, leading=True)).not_master() is None


@pytest.mark.parametrize("master", [MASTER, None])
def test_the_refusal_s_text_is_read_back_by_the_client(master):
    exc = errors.not_master("this broker is a replication slave of a:1 (read-only): x; y", master)
    back = reply_error(ev.Result(503, str(exc).encode(), 3))
    assert type(back) is errors.NotMaster and back.master == master
    named = reply_error(ev.Result(503, str(exc).encode(), 3), "commit_offset g t 7-0")
    assert type(named) is errors.NotMaster and str(named).startswith("commit_offset g t 7-0: result 503 NOT_MASTER")
    assert type(reply_error(ev.Result(503, b"SLAVE_NOT_AVAILABLE: nothing was stored", 3))) is errors.Unavailable
    assert errors.parse_not_master("NOT_MASTER: whatever") is None  # no master clause: not ours


# -- point 5: refused before writing -----------------------------------------------------------------------------

def server(mode, insync=None):
    cfg = load_config(None, {"replication.mode": mode, "replication.port": 1})
    return ReplicationServer(None, None, cfg, insync=insync)


def test_a_sync_master_with_no_slave_connected_refuses_before_writing():
    s = server("sync")
    assert "no slave is connected: nothing was stored" in s.no_slave_refusal()
    s.slaves[1] = SlaveState(1, ("127.0.0.1", 1), 0)
    assert s.no_slave_refusal() is None  # one connected: the put is written and waits for its ack
    assert server("async").no_slave_refusal() is None


def test_an_elected_sync_master_with_an_empty_in_sync_set_refuses_before_writing():
    insync = InSyncSet(me=0, lag_s=2.0)
    s = server("sync", insync)
    assert "no slave is in sync with this master (ha: auto): nothing was stored" in s.no_slave_refusal()
    insync.join(1)
    assert s.no_slave_refusal() is None  # a member that dies now is waited for: written, then 503 unconfirmed
    insync.leave(1)
    assert s.no_slave_refusal() is not None


# -- the client's broker offset store -----------------------------------------------------------------------------

class Conn:
    def __init__(self, url, answers, sent):
        self.url, self.answers, self.sent = url, answers, sent

    def _answer(self, event):
        self.sent.append((self.url, event.offset))
        return ev.Result(*self.answers[self.url])

    def request(self, event, timeout=None):
        f = Future()
        f.set_result(self._answer(event))
        return f

    def call(self, event, timeout=None):
        return self._answer(event)


class Pool:
    def __init__(self, answers):
        self.answers, self.sent = answers, []

    def get(self, url):
        return Conn(url, self.answers, self.sent)


OLD = "meta://10.0.0.6:8123"
P0 = Partition(7, 0)


def test_a_commit_refused_as_not_master_is_sent_to_the_master_it_names():
    refusal = str(errors.not_master("deposed", MASTER)).encode()
    pool = Pool({OLD: (503, refusal, 0), MASTER: (200, b"", 0)})
    store = BrokerOffsetStore(pool, lambda broker_id: OLD, "g")
    assert store.commit({("t", P0): (5, 1)}) == 1
    assert pool.sent == [(OLD, 5), (MASTER, 5)]
    assert store.commit({("t", P0): (5, 1)}) == 0  # recorded as written


def test_a_refusal_naming_no_master_or_a_second_refusal_fails_the_commit_for_the_next_one_to_retry():
    pool = Pool({OLD: (503, str(errors.not_master("waiting")).encode(), 0)})
    store = BrokerOffsetStore(pool, lambda broker_id: OLD, "g")
    with pytest.raises(errors.Unavailable, match="NOT_MASTER"):
        store.commit({("t", P0): (5, 1)})
    assert pool.sent == [(OLD, 5)]
    bounced = Pool({OLD: (503, str(errors.not_master("a", MASTER)).encode(), 0),
                    MASTER: (503, str(errors.not_master("b", OLD)).encode(), 0)})
    store = BrokerOffsetStore(bounced, lambda broker_id: OLD, "g")
    with pytest.raises(errors.Unavailable):
        store.commit({("t", P0): (5, 1)})
    assert bounced.sent == [(OLD, 5), (MASTER, 5)]  # once, never back and forth
    bounced.answers[OLD] = (200, b"", 0)
    assert store.commit({("t", P0): (5, 1)}) == 1  # not recorded as written: the next commit sends it again
