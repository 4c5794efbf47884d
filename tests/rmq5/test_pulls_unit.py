"""PullService over a real store in this process, for the bounds a broker process would need a huge backlog or
many parked calls to reach: ``PULL_FILTER_ROUNDS`` reads of unwanted records a call, and the broker's parked long
polls (``max_parked_gets``)."""

from types import SimpleNamespace

import pytest

from metaq.protocol.message import encode_payload
from metaq.serving.longpoll import PartitionWaiters
from tests.harness.store import NOW, open_store

pb = pytest.importorskip("metaq.rmq5.messages_pb2")
pulls = pytest.importorskip("metaq.rmq5.pulls")
from metaq.rmq5.records import Refusal  # noqa: E402

SCAN = 4  # index units one filtered read passes over at most (the store's MAX_FILTER_SCAN_UNITS, made small)


def service(store, waiters=None):
    return pulls.PullService(store, None, PartitionWaiters() if waiters is None else waiters, None, lambda: None,
                             lambda: ("127.0.0.1", 1), 1 << 20)


def request(topic, offset, expression=None, poll_ms=0):
    r = pb.PullMessageRequest(group=pb.Resource(name="g"), offset=offset, batch_size=8,
                              message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0))
    r.long_polling_timeout.FromMilliseconds(poll_ms)
    if expression is not None:
        r.filter_expression.CopyFrom(pb.FilterExpression(type=pb.TAG, expression=expression))
    return r


CALL = SimpleNamespace(timeout_s=5.0, session=None)


def shape(responses):
    """``(status code name, [body], next_offset)`` of a pull's responses (a message's comes as its bytes)."""
    responses = [pb.PullMessageResponse.FromString(r) if isinstance(r, bytes) else r for r in responses]
    return (pb.Code.Name(responses[0].status.code), [r.message.body for r in responses if r.HasField("message")],
            responses[-1].next_offset)


def test_a_pull_reads_on_past_unwanted_records_for_pull_filter_rounds_reads_and_no_more(tmp_path, monkeypatch):
    import metaq.store.store as store_module
    monkeypatch.setattr(store_module, "MAX_FILTER_SCAN_UNITS", SCAN)
    s = open_store(tmp_path / "s")
    rounds = pulls.PULL_FILTER_ROUNDS
    for topic, unwanted in (("test", SCAN * (rounds - 1)), ("tpast", SCAN * rounds)):
        for i in range(unwanted):
            s.put(topic, 0, *encode_payload(b"no%d" % i, "Other"), NOW)
        s.put(topic, 0, *encode_payload(b"yes", "Wanted"), NOW)
    p = service(s)
    assert shape(p.pull_message(request("test", 0, "Wanted"), CALL)) == ("OK", [b"yes"], SCAN * (rounds - 1) + 1)
    past = SCAN * rounds
    assert shape(p.pull_message(request("tpast", 0, "Wanted"), CALL)) == ("MESSAGE_NOT_FOUND", [], past)
    assert shape(p.pull_message(request("tpast", past, "Wanted"), CALL)) == ("OK", [b"yes"], past + 1)
    s.close(NOW)


def test_a_long_poll_past_the_brokers_parked_long_polls_is_too_many_requests(tmp_path):
    s = open_store(tmp_path / "s")
    waiters = PartitionWaiters(max_parked=1)
    p = service(s, waiters)
    assert shape(p.pull_message(request("test", 0, poll_ms=50), CALL)) == ("MESSAGE_NOT_FOUND", [], 0)  # at it
    assert waiters.admit()  # another pull parked: the one more is refused
    with pytest.raises(Refusal) as refused:
        p.pull_message(request("test", 0, poll_ms=50), CALL)
    assert refused.value.code == "TOO_MANY_REQUESTS"
    waiters.leave()
    assert waiters.parked == 0  # the refused pull took no place
    s.close(NOW)
