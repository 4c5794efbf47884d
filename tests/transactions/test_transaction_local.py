"""Local transactions (``with producer.transaction(): producer.send(...)``).

Real brokers for the behaviour; a scripted ``FakeBroker`` (tests/harness/fake_broker.py) only for error paths
the real broker cannot be made to produce on demand (a lost or malformed reply).
"""

import re
import threading
import time

import pytest

from metaq import errors
from metaq.client import Message, Partition, Producer
from metaq.client.transactions import XaError
from metaq.protocol import events as ev
from metaq.transactions import wire
from metaq.client.local import small_config
from tests.harness.broker import consume_all, url_of
from tests.harness.fake_broker import CLOSE, HANG, xa_reply

def stored(broker, topic, partitions=4):
    with broker.client() as c:
        return {p: consume_all(c, topic, p) for p in range(partitions)}


def payloads(broker, topic, partitions=4):
    return sorted(rec.payload for recs in stored(broker, topic, partitions).values() for rec in recs)


def second_broker(broker_factory, tmp_path, broker_id=8):
    return broker_factory(config=small_config(tmp_path / ("data%d" % broker_id), broker={"id": broker_id}))


# -- against real brokers ------------------------------------------------------------------


def test_commit_puts_everything_on_one_broker_contiguously(broker_factory, tmp_path):
    brokers = {7: broker_factory(), 8: second_broker(broker_factory, tmp_path)}
    for b in brokers.values():
        with b.client() as raw:
            raw.put_ok("ttx", b"setup")  # the topic exists on both brokers
    stop = threading.Event()

    def other_writer():  # plain puts to the same partitions while the transaction is open
        with Producer(brokers=[url_of(b) for b in brokers.values()]) as other:
            while not stop.is_set():
                assert other.send(Message("ttx", b"plain")).success

    with Producer(brokers=[url_of(brokers[7]), url_of(brokers[8])]) as producer:
        writer = threading.Thread(target=other_writer)
        writer.start()
        try:
            with producer.transaction() as tx:
                assert tx.tx_key is None and tx.broker_id is None  # nothing sent yet
                results = []
                for i in range(40):
                    results.append(producer.send(Message("ttx", b"tx-%02d" % i)))
                    time.sleep(0.01)
                bid = tx.broker_id
                assert re.fullmatch(r"TX:[0-9A-Za-z-]+-\d+-\d+:1", tx.tx_key)
        finally:
            stop.set()
            writer.join(30)
    assert tx.state == "committed"
    assert all(r.success and r.offset == -1 and r.msg_id == -1 for r in results), results[:3]
    assert {r.partition.broker_id for r in results} == {bid}
    assert len({r.partition for r in results}) == 4  # the selector spread them over that broker's partitions
    other = brokers[15 - bid]
    assert b"tx-00" not in payloads(other, "ttx")  # nothing on the other broker
    mine = stored(brokers[bid], "ttx")
    assert sorted(rec.payload for recs in mine.values() for rec in recs if rec.payload.startswith(b"tx-")) == \
        sorted(b"tx-%02d" % i for i in range(40))
    for p, recs in mine.items():
        where = [i for i, rec in enumerate(recs) if rec.payload.startswith(b"tx-")]
        assert where == list(range(where[0], where[0] + len(where))), (p, where)  # contiguous offsets
        sent = [b"tx-%02d" % i for i, r in enumerate(results) if r.partition.partition == p]
        assert [recs[i].payload for i in where] == sent  # in the order sent


def test_an_exception_rolls_back_and_propagates(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        with pytest.raises(ValueError, match="boom"):
            with producer.transaction() as tx:
                for i in range(5):
                    assert producer.send(Message("trb", b"rb-%d" % i)).success
                raise ValueError("boom")
        assert tx.state == "rolled back" and not tx.is_open
        assert producer.send(Message("trb", b"after")).success  # outside the transaction again
        with producer.transaction() as tx2:
            producer.send(Message("trb", b"second"))
        assert tx2.tx_key.endswith(":2")  # the producer's counter goes on
    assert payloads(broker, "trb") == [b"after", b"second"]


def test_explicit_rollback_and_commit(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        with producer.transaction() as tx:
            producer.send(Message("texp", b"discarded"))
            tx.rollback()
            with pytest.raises(XaError) as info:
                tx.commit()
            assert info.value.xa_code == wire.XAER_PROTO
            assert producer.send(Message("texp", b"plain")).success  # no longer in a transaction
        tx = producer.transaction()  # without ``with``
        producer.send(Message("texp", b"kept"))
        producer.send_async(Message("texp", b"kept-async")).result(10)
        assert producer.send_oneway(Message("texp", b"kept-oneway")) is True
        tx.commit()
        assert tx.state == "committed"
        with producer.transaction():  # an empty transaction sends nothing and commits trivially
            pass
        with pytest.raises(XaError) as info:
            with producer.transaction():
                producer.transaction()
        assert info.value.xa_code == wire.XAER_PROTO
    assert payloads(broker, "texp") == [b"kept", b"kept-async", b"kept-oneway", b"plain"]


def test_readers_see_nothing_until_commit(broker):
    with Producer(brokers=[url_of(broker)]) as producer, broker.client() as raw:
        raw.put_ok("tvis", b"setup", partition=0)
        with producer.transaction() as tx:
            for i in range(8):
                producer.send(Message("tvis", b"v%d" % i))
            time.sleep(0.5)
            for p in range(4):
                start = 1 if p == 0 else 0
                assert raw.get("tvis", p, start).code == 404  # nothing readable while open
            waiting = raw.get("tvis", 1, 0, max_wait_ms=1000)  # a long poll is not woken by a transactional put
            assert isinstance(waiting, ev.Result) and waiting.code == 404
        assert tx.state == "committed"
        assert payloads(broker, "tvis") == sorted([b"setup"] + [b"v%d" % i for i in range(8)])


def test_other_threads_are_not_in_the_transaction(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        outside = []
        with producer.transaction() as tx:
            producer.send(Message("tthr", b"in-tx"))
            t = threading.Thread(target=lambda: outside.append(producer.send(Message("tthr", b"other-thread"))))
            t.start()
            t.join(30)
            assert outside[0].success and outside[0].msg_id > 0 and outside[0].offset >= 0  # stored at once
            assert payloads(broker, "tthr") == [b"other-thread"]
            tx.rollback()
    assert payloads(broker, "tthr") == [b"other-thread"]


def test_a_failed_send_makes_the_transaction_rollback_only(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        tx = producer.transaction()
        assert producer.send(Message("tfail", b"good")).success
        bad = producer.send(Message("tfail", b"x" * (300 * 1024)))  # over this broker's 256 KiB limit
        assert not bad.success and isinstance(bad.error, errors.ClientError)
        assert tx.rollback_only
        later = producer.send(Message("tfail", b"later"))
        assert not later.success and later.error.xa_code == wire.XA_RBROLLBACK
        with pytest.raises(XaError) as info:
            tx.commit()
        assert info.value.xa_code == wire.XA_RBROLLBACK and "exceeds the limit" in str(info.value)
        assert tx.state == "rolled back"
        assert producer.send(Message("tfail", b"plain")).success
    assert payloads(broker, "tfail") == [b"plain"]


@pytest.mark.slow
def test_timeout_expires_and_commit_says_so(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        tx = producer.transaction(timeout=1)
        assert producer.send(Message("ttime", b"late")).success
        time.sleep(3.0)
        with pytest.raises(XaError) as info:
            tx.commit()
        assert info.value.xa_code == wire.XA_RBTIMEOUT
        assert tx.state == "rolled back"
    assert payloads(broker, "ttime") == []


def test_the_transaction_dies_with_its_connection(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        tx = producer.transaction()
        assert producer.send(Message("tconn", b"lost")).success
        producer.connection(url_of(broker)).close()  # the connection the transaction began on
        with pytest.raises(XaError) as info:
            tx.commit()
        assert info.value.xa_code == 101 and "connection" in str(info.value)  # XA_RBCOMMFAIL
        assert producer.send(Message("tconn", b"plain")).success
    assert payloads(broker, "tconn") == [b"plain"]


# -- error paths, against a scripted fake broker --------------------------------------------


def _tx_producer(fake_broker, **kw):
    return Producer(brokers=[fake_broker.url], send_timeout=1.0, **kw)


def test_fake_commit_without_reply_is_unknown(fake):
    broker = fake(lambda e: HANG if getattr(e, "tx_type", None) == "COMMIT_ONE_PHASE" else None)
    with _tx_producer(broker) as producer:
        tx = producer.transaction(timeout=5, request_timeout=0.5)
        assert producer.send(Message("tf", b"x")) == (True, Partition(3, 0), -1, -1, None, False)
        with pytest.raises(XaError) as info:
            tx.commit()
    assert info.value.xa_code == wire.XAER_RMFAIL and "outcome unknown" in str(info.value)
    assert tx.state == "failed"
    begin = next(e for e in broker.requests if isinstance(e, ev.Transaction))
    assert (begin.tx_type, begin.timeout, begin.unique_qualifier) == ("BEGIN", 5, None)
    assert ":" not in begin.session_id and begin.tx_key == "TX:%s:1" % begin.session_id
    put = next(e for e in broker.requests if isinstance(e, ev.Put))
    assert put.tx_key == begin.tx_key and put.checksum != -1


def test_fake_connection_lost_at_commit_is_unknown(fake):
    broker = fake(lambda e: CLOSE if getattr(e, "tx_type", None) == "COMMIT_ONE_PHASE" else None)
    with _tx_producer(broker) as producer:
        tx = producer.transaction()
        producer.send(Message("tf", b"x"))
        with pytest.raises(XaError) as info:
            tx.commit()
    assert info.value.xa_code == wire.XAER_RMFAIL and "outcome unknown" in str(info.value)


def test_fake_broker_codes_reach_the_caller(fake):
    replies = {"COMMIT_ONE_PHASE": xa_reply(wire.XA_HEURHAZ, "hazard")}
    broker = fake(lambda e: replies.get(getattr(e, "tx_type", None)))
    with _tx_producer(broker) as producer:
        with pytest.raises(XaError) as info:
            with producer.transaction():
                producer.send(Message("tf", b"x"))
        assert info.value.xa_code == wire.XA_HEURHAZ and "hazard" in str(info.value)
        assert str(info.value).startswith("XA_HEURHAZ: ")
        replies["COMMIT_ONE_PHASE"] = ev.Result(500, b"java.lang.NullPointerException", 0)
        with pytest.raises(XaError) as info:
            with producer.transaction():
                producer.send(Message("tf", b"x"))
        assert info.value.xa_code == wire.XAER_RMERR and "NullPointerException" in str(info.value)
        assert isinstance(info.value, errors.TransactionError) and info.value.code == 500


def test_fake_failed_put_rolls_back_at_commit(fake):
    broker = fake(lambda e: xa_reply(wire.XA_RBTIMEOUT, "expired") if isinstance(e, ev.Put) else None)
    with _tx_producer(broker) as producer:
        with pytest.raises(XaError) as info:
            with producer.transaction():
                result = producer.send(Message("tf", b"x"))
                assert not result.success and result.error.xa_code == wire.XA_RBTIMEOUT
        assert info.value.xa_code == wire.XA_RBTIMEOUT  # the put's own rollback code
    assert broker.types() == ["BEGIN", "ROLLBACK"]


def test_fake_begin_failure_fails_the_send(fake):
    broker = fake(lambda e: xa_reply(wire.XAER_DUPID) if getattr(e, "tx_type", None) == "BEGIN" else None)
    with _tx_producer(broker) as producer:
        tx = producer.transaction()
        first = producer.send(Message("tf", b"x"))
        assert not first.success and first.error.xa_code == wire.XAER_DUPID
        assert not producer.send(Message("tf", b"y")).success  # rollback-only: not sent at all
        with pytest.raises(XaError):
            tx.commit()
    assert not any(isinstance(e, ev.Put) for e in broker.requests)


def test_fake_exception_with_a_failing_rollback_keeps_the_exception(fake):
    broker = fake(lambda e: xa_reply(wire.XAER_RMERR) if getattr(e, "tx_type", None) == "ROLLBACK" else None)
    with _tx_producer(broker) as producer:
        with pytest.raises(KeyError):
            with producer.transaction():
                producer.send(Message("tf", b"x"))
                raise KeyError("mine")
    assert broker.types() == ["BEGIN", "ROLLBACK"]
