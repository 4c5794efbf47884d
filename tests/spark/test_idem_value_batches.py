"""The idempotent sink's Arrow path (``write_any`` of ``value`` batches: the idempotent producer's ``send_many``)
against a real broker: every row stored once, a task run again answered as duplicates whichever path (Arrow
batches or rows) either run took, since both give each partition's rows the same sequences."""

import collections

import pytest

from metaq.client.local import BrokerProcess, small_config
from metaq.idempotence.records import identity_in_attribute
from metaq.protocol.message import decode_payload
from metaq.spark.sink import SinkOptions, write_any, write_rows
from tests.harness.broker import consume_all, url_of

pa = pytest.importorskip("pyarrow")

PARTITIONS = 4


@pytest.fixture
def broker4(tmp_path):
    b = BrokerProcess(tmp_path, small_config(str(tmp_path / "data"),
                                            topics=[{"name": "t*", "partitions": PARTITIONS}])).start()
    with b.client() as c:  # the topic exists with its 4 partitions
        for p in range(PARTITIONS):
            c.put_ok("tidemsink", b"seed", p)
    yield b
    b.kill()


def stored(broker):
    """``{partition: [(payload, (pid, seq))]}`` of the sink's rows (the seeds left out)."""
    out = {}
    with broker.client() as c:
        for p in range(PARTITIONS):
            rows = []
            for rec in consume_all(c, "tidemsink", p)[1:]:
                attribute, payload = decode_payload(rec.flag, rec.data)
                rows.append((payload, identity_in_attribute(attribute)))
            out[p] = rows
    return out


def batches(values, size):
    return [pa.record_batch([pa.array(values[i:i + size], pa.binary())], names=["value"])
            for i in range(0, len(values), size)]


def test_a_task_run_again_by_either_path_is_answered_as_duplicates(broker4):
    opts = SinkOptions({"brokers": url_of(broker4), "topic": "tidemsink"})
    values = [b"v%d" % i for i in range(5000)]
    first = write_any(batches(values, 700), opts, 31)
    assert first == {"rows": 5000, "duplicates": 0, "producer_id": 31}
    got = stored(broker4)
    for p in range(PARTITIONS):  # round-robin by the row's index; each partition's rows numbered from 0
        mine = [values[i] for i in range(p, 5000, PARTITIONS)]
        assert got[p] == [(v, (31, k)) for k, v in enumerate(mine)]
    again = write_any(batches(values, 333), opts, 31)  # a retried task: other Arrow batch sizes, same rows
    assert again == {"rows": 5000, "duplicates": 5000, "producer_id": 31}
    rows = write_rows(({"value": v} for v in values), opts, 31)  # the row path: the same sequences
    assert rows["duplicates"] == 5000
    assert stored(broker4) == got
    fresh = write_rows(({"value": v} for v in values[:40]), opts, 32)  # rows first, then the Arrow path
    assert fresh["duplicates"] == 0
    assert write_any(batches(values[:40], 7), opts, 32)["duplicates"] == 40
    counts = collections.Counter(v for rows in stored(broker4).values() for v, _ident in rows)
    assert counts == collections.Counter(values) + collections.Counter(values[:40])


def test_a_refused_call_runs_the_task_again_row_by_row_naming_the_bad_row(tmp_path):
    """A broker whose body limit (4 KiB) is below a frame's: the calls are refused, the row writer takes the task
    again with the same producer id and names the row over the limit; the rows before it are stored once."""
    from metaq.spark.sink import SinkError

    b = BrokerProcess(tmp_path, small_config(str(tmp_path / "data"), topics=[{"name": "t*", "partitions": 1}],
                                             limits={"max_body_bytes": 4096})).start()
    try:
        with b.client() as c:
            c.put_ok("tidemsink", b"seed", 0)
        opts = SinkOptions({"brokers": url_of(b), "topic": "tidemsink"})
        values = [b"w%d" % i + b"." * 100 for i in range(60)] + [b"x" * 5000] + [b"after"]
        with pytest.raises(SinkError, match="row 60 of this task was not stored"):
            write_any(batches(values, 25), opts, 51)
        with b.client() as c:
            got = [decode_payload(r.flag, r.data)[1] for r in consume_all(c, "tidemsink", 0)[1:]]
        assert got[:60] == values[:60] and len(set(got)) == len(got)  # each once (the row writer's pipeline
        # may have stored the row after the bad one, as it always did)
    finally:
        b.kill()
