"""XAResource: the DB-API two-phase-commit interface over metaq brokers.

Real brokers for the behaviour; the scripted ``FakeBroker`` (tests/harness/fake_broker.py) only
for replies a real broker cannot be made to give on demand (lost, late or malformed).
"""

import socket
import time

import pytest

from metaq import errors
from metaq.client import Message, Partition
from metaq.client.message import SendResult
from metaq.client.transactions import XaError, Xid, default_unique_qualifier
from metaq.client.xa import XAResource
from metaq.protocol import events as ev
from metaq.transactions import wire
from metaq.client.local import free_port, small_config
from tests.harness.broker import consume_all, url_of
from tests.harness.fake_broker import CLOSE, HANG, xa_reply

QUALIFIER = "xa-test"


def payloads(broker, topic, partitions=4):
    with broker.client() as c:
        return sorted(rec.payload for p in range(partitions) for rec in consume_all(c, topic, p))


def resource(*brokers, qualifier=QUALIFIER, **kw):
    return XAResource(brokers=[url_of(b) for b in brokers], unique_qualifier=qualifier, **kw)


def prepared_branch(rm, xid, topic, *bodies):
    rm.tpc_begin(xid)
    for body in bodies:
        rm.send(Message(topic, body))
    assert rm.tpc_prepare() == wire.XA_OK


def code_of(call, *args):
    with pytest.raises(XaError) as info:
        call(*args)
    return info.value.xa_code


# -- ids, names and client-side state errors (no broker needed) ------------------------------


def test_xid_stores_bytes_and_round_trips_through_its_key():
    xid = Xid(1, "order-42", "mq")
    assert xid == (1, b"order-42", b"mq") and xid.gtrid == b"order-42" and isinstance(xid, tuple)
    assert Xid(7, bytearray(b"\x00\xff")) == (7, b"\x00\xff", b"")
    key = xid.key("uq")
    assert key == "XID:1:6f726465722d3432:6d71:uq"
    assert Xid.from_key(key) == xid and Xid.from_key("XID:7:00ff::uq") == (7, b"\x00\xff", b"")
    assert code_of(Xid.from_key, "TX:s:1") == wire.XAER_INVAL
    assert code_of(Xid.from_key, "XID:1:zz::uq") == wire.XAER_INVAL
    with pytest.raises(ValueError):
        Xid(1, b"x" * 65, b"")
    with pytest.raises(TypeError):
        Xid("1", b"g", b"b")
    with pytest.raises(TypeError):
        Xid(1, 42, b"b")


def test_default_qualifier_and_errors():
    q = default_unique_qualifier()
    assert q.startswith("XAMessageProducer-") and ":" not in q and not any(c.isspace() for c in q)
    assert socket.gethostname().split(":")[0].replace(" ", "-") in q
    with pytest.raises(ValueError):
        XAResource(brokers=["meta://127.0.0.1:1"], unique_qualifier="has space")
    with pytest.raises(ValueError):
        XAResource(brokers=["meta://127.0.0.1:1"], unique_qualifier="a:b")
    e = XaError(wire.XAER_NOTA, "no such branch")
    assert isinstance(e, errors.TransactionError) and e.code == 500 and e.xa_code == -4
    assert str(e) == "XAER_NOTA: no such branch" and e.code_name == "XAER_NOTA"


@pytest.mark.integration
def test_state_errors_are_raised_before_anything_is_sent():
    with XAResource(brokers=["meta://127.0.0.1:%d" % free_port()], unique_qualifier=QUALIFIER) as rm:
        for call in (rm.tpc_prepare, rm.tpc_commit, rm.tpc_rollback):
            assert code_of(call) == wire.XAER_PROTO
        assert code_of(rm.send, Message("t", b"x")) == wire.XAER_PROTO
        assert code_of(rm.tpc_begin, Xid(1, b"g", b"b")) == wire.XAER_RMFAIL  # nobody listens there
        assert rm.current_xid is None


# -- against real brokers ------------------------------------------------------------------


def test_two_phase_commit_makes_the_messages_visible(broker):
    with resource(broker) as rm:
        xid = rm.xid(1, "g-commit", "mq")
        rm.tpc_begin(xid)
        assert rm.current_xid == xid and rm.broker_id == 7
        results = [rm.send(Message("txa", b"m%d" % i)) for i in range(6)]
        assert all(r.success and r.offset == -1 and r.partition.broker_id == 7 for r in results)
        assert code_of(rm.tpc_begin, rm.xid(1, "other", "mq")) == wire.XAER_PROTO  # one branch at a time
        assert rm.tpc_prepare() == wire.XA_OK
        assert code_of(rm.send, Message("txa", b"late")) == wire.XAER_PROTO  # no sends after prepare
        assert payloads(broker, "txa") == []  # prepared is not committed
        assert rm.tpc_recover() == [xid]
        rm.tpc_commit()
        assert rm.current_xid is None and rm.tpc_recover() == []
    assert payloads(broker, "txa") == sorted(b"m%d" % i for i in range(6))


def test_one_phase_commit_and_rollbacks(broker):
    with resource(broker) as rm:
        rm.tpc_begin(rm.xid(1, "g-1pc", "mq"))
        rm.send(Message("txb", b"one-phase"))
        rm.tpc_commit()  # not prepared: COMMIT_ONE_PHASE
        prepared_branch(rm, rm.xid(1, "g-prb", "mq"), "txb", b"prepared-then-rolled-back")
        rm.tpc_rollback()
        rm.tpc_begin(rm.xid(1, "g-arb", "mq"))
        rm.send(Message("txb", b"active-then-rolled-back"))
        rm.tpc_rollback()
        assert rm.tpc_recover() == []
    assert payloads(broker, "txb") == [b"one-phase"]


def test_an_empty_branch_is_read_only(broker):
    with resource(broker) as rm:
        xid = rm.xid(1, "g-empty", "mq")
        rm.tpc_begin(xid)
        assert rm.tpc_prepare() == wire.XA_RDONLY
        assert rm.tpc_recover() == []  # finished already
        rm.tpc_commit()  # nothing to do, nothing sent
        assert rm.current_xid is None
        rm.tpc_commit(xid)  # a coordinator's retry: the broker remembers the branch finished
        rm.tpc_begin(rm.xid(1, "g-empty2", "mq"))
        assert rm.tpc_prepare() == wire.XA_RDONLY
        rm.tpc_rollback()  # also nothing to do


def test_recovery_from_a_new_resource_sees_only_its_own_branches(broker):
    first = resource(broker)
    xid = first.xid(5, b"\x01in-doubt", b"\x02")
    prepared_branch(first, xid, "txr", b"r1", b"r2")
    first.close()  # the coordinator "dies" with the branch prepared
    with resource(broker, qualifier="someone-else") as other:
        foreign = other.xid(5, b"foreign", b"")
        prepared_branch(other, foreign, "txr", b"foreign")
        assert code_of(other.tpc_rollback, foreign) == wire.XAER_PROTO  # the recovery form: not during a branch
    with resource(broker) as second:
        assert second.tpc_recover() == [xid]  # not the other qualifier's branch
        second.tpc_commit(xid)
        assert second.tpc_recover() == []
        second.tpc_commit(xid)  # a repeat is answered with the decision and appends nothing
        assert code_of(second.tpc_rollback, xid) == wire.XAER_PROTO  # committed: it cannot be rolled back
    with resource(broker, qualifier="someone-else") as other:
        assert other.tpc_recover() == [foreign]
        other.tpc_rollback(foreign)  # recovery-time rollback
        assert other.tpc_recover() == []
    assert payloads(broker, "txr") == [b"r1", b"r2"]


def test_broker_error_codes(broker):
    with resource(broker) as rm, resource(broker) as peer:
        assert code_of(rm.tpc_commit, rm.xid(1, "never-begun", "mq")) == wire.XAER_NOTA
        assert code_of(rm.tpc_rollback, rm.xid(1, "never-begun", "mq")) == wire.XAER_NOTA
        xid = rm.xid(1, "g-unprepared", "mq")
        rm.tpc_begin(xid)
        rm.send(Message("txe", b"unprepared"))
        assert code_of(peer.tpc_commit, xid) == wire.XAER_PROTO  # two-phase commit of an unprepared branch
        assert code_of(peer.tpc_begin, xid) == wire.XAER_DUPID
        assert code_of(rm.tpc_commit, xid) == wire.XAER_PROTO  # recovery form while a branch is in progress
        rm.tpc_rollback()
    assert payloads(broker, "txe") == []


def test_a_stale_commit_cannot_complete_a_newer_branch(broker):
    """The Bufstream scenario: a late or repeated commit of an old xid reaches the broker after a new branch began."""
    with resource(broker) as rm, resource(broker) as stale:
        old = rm.xid(1, "g-old", "mq")
        prepared_branch(rm, old, "txs", b"old")
        rm.tpc_commit()
        new = rm.xid(1, "g-new", "mq")
        prepared_branch(rm, new, "txs", b"new")
        stale.tpc_commit(old)  # the duplicate commit: answered with the commit made, nothing appended
        assert code_of(stale.tpc_rollback, old) == wire.XAER_PROTO
        assert payloads(broker, "txs") == [b"old"]  # the new branch untouched: still prepared
        assert rm.tpc_recover() == [new]
        rm.tpc_commit()
    assert payloads(broker, "txs") == [b"new", b"old"]  # each exactly once


def test_a_failed_send_makes_the_branch_roll_back(broker):
    with resource(broker) as rm:
        rm.tpc_begin(rm.xid(1, "g-fail", "mq"))
        rm.send(Message("txf", b"good"))
        assert code_of(rm.send, Message("txf", b"x" * (300 * 1024))) == wire.XAER_RMERR  # over the broker's limit
        assert code_of(rm.tpc_prepare) == wire.XA_RBROLLBACK
        rm.tpc_rollback()  # what a coordinator does next: fine
        assert rm.tpc_recover() == [] and rm.current_xid is None
        rm.tpc_begin(rm.xid(1, "g-fail2", "mq"))
        rm.send(Message("txf", b"ok"))
        rm.tpc_commit()
    assert payloads(broker, "txf") == [b"ok"]


@pytest.mark.slow
def test_an_unprepared_branch_times_out(broker):
    with resource(broker, timeout=1) as rm:
        rm.tpc_begin(rm.xid(1, "g-timeout", "mq"))
        rm.send(Message("txt", b"late"))
        time.sleep(3.0)
        assert code_of(rm.tpc_prepare) == wire.XA_RBTIMEOUT
        rm.tpc_rollback()
    assert payloads(broker, "txt") == []


def test_several_brokers_lowest_id_and_merged_recovery(broker_factory, tmp_path):
    b7 = broker_factory()
    b5 = broker_factory(config=small_config(tmp_path / "data5", broker={"id": 5}))
    with resource(b7, b5) as both, resource(b7) as only7:
        x5 = both.xid(1, "g-on-5", "mq")
        both.tpc_begin(x5)
        assert both.broker_id == 5  # the lowest broker id, whatever the list order
        assert both.send(Message("txm", b"on5")).partition.broker_id == 5
        assert both.tpc_prepare() == wire.XA_OK
        x7 = only7.xid(1, "g-on-7", "mq")
        prepared_branch(only7, x7, "txm", b"on7")
        assert sorted(both.tpc_recover()) == sorted([x5, x7])  # RECOVER on every broker, merged
        both.tpc_commit()
        both.tpc_commit(x7)  # sent to broker 7, where recovery found it
    assert payloads(b5, "txm") == [b"on5"] and payloads(b7, "txm") == [b"on7"]


def test_zookeeper_mode(broker_factory, tmp_path, zk_connect):
    from metaq.client.cluster import ZkCluster
    from tests.harness.broker import wait_for

    broker = broker_factory(config=small_config(tmp_path / "d", zk={"connect": zk_connect}))
    cluster = ZkCluster(zk_connect)
    try:
        wait_for(lambda: cluster.broker_urls(), what="broker registered")
    finally:
        cluster.close()
    with XAResource(zk_connect=zk_connect, unique_qualifier=QUALIFIER) as rm:
        xid = rm.xid(1, "g-zk", "mq")
        prepared_branch(rm, xid, "txz", b"zk")
        assert rm.broker_id == 7 and rm.tpc_recover() == [xid]
        rm.tpc_commit()
    assert payloads(broker, "txz") == [b"zk"]


# -- error paths, against a scripted fake broker --------------------------------------------


def fake_resource(fake_broker, **kw):
    return XAResource(brokers=[fake_broker.url], unique_qualifier=QUALIFIER, request_timeout=0.5, **kw)


def test_fake_wire_forms(fake):
    broker = fake()
    with fake_resource(broker, timeout=30) as rm:
        xid = rm.xid(3, "g", "b")
        rm.tpc_begin(xid)
        assert rm.broker_id == 3
        assert rm.send(Message("tf", b"x")) == SendResult(True, Partition(3, 0), -1, -1, None)
        rm.tpc_prepare()
        rm.tpc_commit()
    tx = [e for e in broker.requests if isinstance(e, ev.Transaction)]
    assert [e.tx_type for e in tx] == ["BEGIN", "END", "PREPARE", "COMMIT_TWO_PHASE"]
    assert {e.tx_key for e in tx} == {"XID:3:67:62:xa-test"} and ":" not in tx[0].session_id
    assert (tx[0].timeout, tx[0].unique_qualifier) == (30, QUALIFIER)
    put = next(e for e in broker.requests if isinstance(e, ev.Put))
    assert put.tx_key == "XID:3:67:62:xa-test"


def test_fake_unexpected_replies(fake):
    replies = {}
    broker = fake(lambda e: replies.get(getattr(e, "tx_type", None)))
    with fake_resource(broker) as rm:
        replies["PREPARE"] = ev.Result(200, b"banana", 0)
        rm.tpc_begin(rm.xid(1, "g", "b"))
        rm.send(Message("tf", b"x"))
        assert code_of(rm.tpc_prepare) == wire.XAER_RMERR
        rm.tpc_rollback()
        replies["PREPARE"] = ev.Result(500, b"java.io.IOException: disk", 0)  # a 500 without the XA form
        rm.tpc_begin(rm.xid(1, "g2", "b"))
        with pytest.raises(XaError) as info:
            rm.tpc_prepare()
        assert info.value.xa_code == wire.XAER_RMERR and "disk" in str(info.value)
        rm.tpc_rollback()
        replies["RECOVER"] = ev.Result(200, b"XID:1:67:62:xa-test\r\nXID:1:67:63:other\r\ngarbage\r\nTX:s:1\r\n", 0)
        assert rm.tpc_recover() == [Xid(1, "g", "b")]  # only well-formed XA ids of our qualifier
        replies["COMMIT_TWO_PHASE"] = xa_reply(wire.XA_HEURRB, "rolled back by an operator")
        assert code_of(rm.tpc_commit, Xid(1, "g", "b")) == wire.XA_HEURRB
        rm.tpc_forget(Xid(1, "g", "b"))
    assert broker.types()[-1] == "FORGET"


def test_fake_lost_replies(fake):
    replies = {}
    broker = fake(lambda e: replies.get(getattr(e, "tx_type", None)))
    with fake_resource(broker) as rm:
        replies["BEGIN"] = HANG
        assert code_of(rm.tpc_begin, rm.xid(1, "g", "b")) == wire.XA_RBTIMEOUT  # as MetaQ's client
        assert rm.current_xid is None
        replies.clear()
        replies["PREPARE"] = HANG
        rm.tpc_begin(rm.xid(1, "g", "b"))
        assert code_of(rm.tpc_prepare) == wire.XA_RBTIMEOUT
        assert broker.types()[-1] == "ROLLBACK"  # the branch is rolled back so that the answer holds
        rm.tpc_rollback()
        replies.clear()
        replies["COMMIT_TWO_PHASE"] = CLOSE
        rm.tpc_begin(rm.xid(1, "g3", "b"))
        rm.tpc_prepare()
        with pytest.raises(XaError) as info:
            rm.tpc_commit()
        assert info.value.xa_code == wire.XAER_RMFAIL and "outcome unknown" in str(info.value)
        replies["COMMIT_TWO_PHASE"] = HANG  # a timeout of a commit is unknown too, never "rolled back"
        assert code_of(rm.tpc_commit, rm.xid(1, "g3", "b")) == wire.XAER_RMFAIL
        replies["RECOVER"] = HANG
        assert code_of(rm.tpc_recover) == wire.XAER_RMFAIL  # a partial list is never returned
