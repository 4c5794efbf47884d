"""MetaQStreamReader driven as Spark's MicroBatchExecution drives it, brokers replaced by a dict (no network).

The call sequences are Spark's (sql/execution/streaming/runtime/MicroBatchExecution.scala):

* Spark >= 4.2 (admission control): ``latestOffset(start, limit)`` with ``start`` = the last finished batch's
  end, or ``initialOffset()`` in a new query; batch 0 is then planned from ``initialOffset()`` asked AGAIN.
* Spark 4.0 / 4.1: ``latestOffset()`` without arguments; after writing batch N's offsets Spark commits batch
  N-1 (``commit(end of N-1)``), then plans batch N (``partitions(end of N-1, end of N)``). On a restart the
  last offsets in the checkpoint are announced as ``partitions(E, E)`` (AcceptsLatestSeenOffset).
"""

import pytest

pytest.importorskip("pyspark")

from metaq import errors  # noqa: E402
from metaq.errors import ConnectionLost  # noqa: E402
from metaq.spark import stream  # noqa: E402

URLS = {1: "meta://h1:1"}


class FakeBrokers:
    """``discover`` of a dict ``{(topic, key): (low, high)}`` that a test changes between calls."""

    def __init__(self, monkeypatch, bounds):
        self.bounds = dict(bounds)
        monkeypatch.setattr(stream, "discover", lambda opts, strict=False: (dict(URLS), dict(self.bounds)))


def reader(**options):
    if stream.MetaQStreamReader is None:
        pytest.skip("Spark < 4.0")
    return stream.MetaQStreamReader(dict({"brokers": "meta://h1:1", "subscribe": "t"}, **options))


def covered(ranges):
    return {(r.key, o) for r in ranges for o in range(r.start, r.end)}


def parts(r, start, end):
    return [p.range for p in r.partitions(start, end)]


def never_behind(end, start):
    return all(end["t"].get(k, -1) >= v for k, v in start["t"].items())


def test_spark_40_offsets_never_go_back_when_batch_n_minus_1_is_committed_after_batch_n_is_asked(monkeypatch):
    brokers = FakeBrokers(monkeypatch, {("t", "1-0"): (0, 1000), ("t", "1-1"): (0, 0)})
    r = reader(startingOffsets="earliest", maxOffsetsPerTrigger="100")
    e0 = r.latestOffset()
    parts(r, r.initialOffset(), e0)  # batch 0 runs
    e1 = r.latestOffset()
    r.commit(e0)  # Spark commits batch 0 once batch 1's offsets are in its log
    parts(r, e0, e1)  # batch 1 runs
    brokers.bounds[("t", "1-1")] = (0, 1000)  # the other partition fills up meanwhile
    e2 = r.latestOffset()
    assert never_behind(e2, e1), (e1, e2)  # else Spark reads the difference again: duplicates


def test_spark_40_a_restarted_query_goes_on_from_its_checkpoint_not_from_starting_offsets(monkeypatch):
    FakeBrokers(monkeypatch, {("t", "1-0"): (0, 1000)})
    r = reader(startingOffsets="earliest", maxOffsetsPerTrigger="100")
    checkpoint = {"t": {"1-0": 600}}
    r.partitions(checkpoint, checkpoint)  # Spark: setLatestSeenOffset(last offsets in the offset log)
    end = r.latestOffset()
    assert end == {"t": {"1-0": 700}}


def test_spark_40_a_restart_does_not_resolve_starting_offsets_again(monkeypatch):
    """startingOffsets naming an offset retention deleted since: only a new query may fail on it."""
    brokers = FakeBrokers(monkeypatch, {("t", "1-0"): (0, 1000)})
    r = reader(startingOffsets='{"t": {"1-0": 5}}')
    brokers.bounds[("t", "1-0")] = (500, 1000)
    checkpoint = {"t": {"1-0": 900}}
    r.partitions(checkpoint, checkpoint)
    assert r.latestOffset() == {"t": {"1-0": 1000}}


def test_batch_0_of_a_new_query_from_latest_reads_what_came_in_while_spark_planned_it(monkeypatch):
    brokers = FakeBrokers(monkeypatch, {("t", "1-0"): (0, 10)})
    r = reader()  # startingOffsets latest
    first = r.initialOffset()  # Spark: getStartOffset() for the first latestOffset
    brokers.bounds[("t", "1-0")] = (0, 20)
    end = r.latestOffset(first, None)
    brokers.bounds[("t", "1-0")] = (0, 30)
    batch0 = parts(r, r.initialOffset(), end)  # Spark: runBatch asks initialOffset() again
    assert covered(batch0) == {("1-0", o) for o in range(10, 20)}


def test_available_now_target_deleted_by_retention_does_not_break_the_limit(monkeypatch):
    if stream.ReadMaxRows is None:
        pytest.skip("Spark < 4.2")
    brokers = FakeBrokers(monkeypatch, {("t", "1-0"): (0, 30), ("t", "1-1"): (0, 1000)})
    r = reader(failOnDataLoss="false", maxOffsetsPerTrigger="100")
    r.prepareForTriggerAvailableNow()
    brokers.bounds[("t", "1-0")] = (50, 100)  # retention passed the target of 1-0
    start = {"t": {"1-0": 10, "1-1": 0}}
    end = r.latestOffset(start, stream.ReadMaxRows(100))
    assert end["t"]["1-1"] <= 100 and never_behind(end, start)
    read = covered(parts(r, start, end))
    assert len(read) <= 100 and all(k == "1-1" for k, _ in read)


class Refused:
    """A BrokerConnection to a broker that is down."""

    def __init__(self, url, *args, **kwargs):
        raise ConnectionLost("cannot connect to %s: [Errno 111] Connection refused" % url)


def test_a_new_query_with_a_listed_broker_down_fails_instead_of_reading_its_history_later(monkeypatch, caplog):
    """Started at 'latest' while broker 2 was down, the query read ALL of broker 2's log once it was back."""
    from metaq.spark import brokers

    monkeypatch.setattr(brokers, "BrokerConnection", Refused)
    r = reader(brokers="meta://h1:1,meta://h2:1")
    with pytest.raises(errors.Unavailable, match="broker meta://h1:1 cannot be reached.*a new query needs"):
        r.initialOffset()
    assert stream.discover(brokers.BrokerView(r.opts)) == ({}, {})  # a running query waits for it (a WARNING line)
    assert "meta://h2:1 cannot be reached" in caplog.text and "its partitions wait" in caplog.text


def test_a_log_cut_below_the_streams_position_is_data_loss_not_a_silent_wait(monkeypatch, caplog):
    """After a failover to a slave that lacked the tail, new messages take offsets 80..99 again: never read."""
    FakeBrokers(monkeypatch, {("t", "1-0"): (0, 80)})
    start = {"t": {"1-0": 100}}
    with pytest.raises(stream.DataLoss, match=r"t 1-0: the partition ends at offset 80, below the stream's "
                                              r"position 100.*messages stored at 80\.\.99"):
        reader().latestOffset(start, None)
    r = reader(failOnDataLoss="false")
    assert r.latestOffset(start, None) == start and r.latestOffset(start, None) == start
    assert caplog.text.count("below the stream's position 100") == 1  # told once, not at every poll


def test_the_group_is_committed_once_per_finished_batch_without_asking_the_brokers_again(monkeypatch):
    brokers = FakeBrokers(monkeypatch, {("t", "1-0"): (0, 10)})
    calls, written = [], []
    monkeypatch.setattr(stream, "discover", lambda opts, strict=False: calls.append(1) or (dict(URLS), brokers.bounds))
    monkeypatch.setattr(stream, "commit_group", lambda opts, urls, end: written.append(end))
    r = reader(group="g", startingOffsets="earliest")
    e0 = r.latestOffset(r.initialOffset(), None)
    brokers.bounds = {("t", "1-0"): (0, 20)}
    e1 = r.latestOffset(e0, None)  # batch 0 finished: its end is the group's
    asked = len(calls)
    r.commit(e0)  # Spark's (late) commit of batch 0
    assert len(calls) == asked and written == [{"t": {"1-0": 0}}, e0] and e1 == {"t": {"1-0": 20}}
