"""The Spark source's and sink's planning logic, without Spark or a network (the unit tier; tests/spark starts
servers)."""

import subprocess
import sys
from itertools import pairwise

import pytest

from metaq.spark import limits as spark_limits
from metaq.client.message import Partition
from metaq.spark.ranges import OffsetRange
from metaq.spark.rows import DataLoss
from metaq.spark.sink import SinkError, SinkOptions, check_columns, choose, producer_id_of
from metaq.spark.stream import (StreamOptions, next_end, offsets_json, plan_stream_ranges, split_to_at_least,
                                starting_offsets)

BROKERS = {"brokers": "meta://127.0.0.1:1"}


def opts(**kw):
    return StreamOptions(dict(BROKERS, subscribe="orders", **kw))


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize("options, problem", [
    ({"subscribe": "orders"}, "'brokers'"),
    (dict(BROKERS), "exactly one of the options 'subscribe'"),
    (dict(BROKERS, subscribe="a", subscribePattern="a.*"), "exactly one"),
    (dict(BROKERS, subscribe=" , "), "names no topic"),
    (dict(BROKERS, subscribePattern="(unclosed"), "not a regular expression"),
    (dict(BROKERS, subscribe="a", maxOffsetsPerTrigger="0"), "maxoffsetspertrigger must be >= 1"),
    (dict(BROKERS, subscribe="a", maxOffsetsPerTrigger="ten"), "must be an integer"),
    (dict(BROKERS, subscribe="a", minPartitions=str(spark_limits.MAX_STREAM_TASKS + 1)), "minPartitions must be <="),
    (dict(BROKERS, subscribe="bad topic"), "topic"),
])
def test_bad_options_are_refused_with_the_reason(options, problem):
    with pytest.raises(Exception, match=problem):
        StreamOptions(options)


def test_min_partitions_at_the_limit_is_accepted():
    assert opts(minPartitions=str(spark_limits.MAX_STREAM_TASKS)).min_partitions == spark_limits.MAX_STREAM_TASKS


def test_pattern_matches_whole_names_and_never_the_internal_topic():
    o = StreamOptions(dict(BROKERS, subscribePattern="orders.*|SCHEDULE.*"))
    assert o.subscribed("orders") and o.subscribed("orders-eu")
    assert not o.subscribed("old-orders")  # a whole-name match, as Spark's Kafka source
    assert not o.subscribed("SCHEDULE_TOPIC_XXXX")
    listed = StreamOptions(dict(BROKERS, subscribe="a, b"))
    assert listed.topics == ["a", "b"] and listed.subscribed("b") and not listed.subscribed("c")


# -- where a new query starts ----------------------------------------------------------------

BOUNDS = {("orders", "7-0"): (10, 50), ("orders", "7-1"): (0, 5), ("orders", "8-0"): (0, 0)}


def test_starting_offsets_latest_by_default_earliest_and_json():
    assert starting_offsets(opts(), BOUNDS) == {"orders": {"7-0": 50, "7-1": 5, "8-0": 0}}
    assert starting_offsets(opts(startingOffsets="earliest"), BOUNDS) == {"orders": {"7-0": 10, "7-1": 0, "8-0": 0}}
    spec = '{"orders": {"7-0": 20, "7-1": -2}}'
    assert starting_offsets(opts(startingOffsets=spec), BOUNDS) == {"orders": {"7-0": 20, "7-1": 0, "8-0": 0}}


def test_starting_timestamp_wins_and_partitions_it_misses_start_at_their_end():
    at = {("orders", "7-0"): 30, ("orders", "7-1"): 2}
    got = starting_offsets(opts(startingOffsets="earliest", startingTimestamp="1700000000000"), BOUNDS, at)
    assert got == {"orders": {"7-0": 30, "7-1": 2, "8-0": 0}}


@pytest.mark.parametrize("spec, problem", [
    ('{"orders": {"9-0": 1}}', "partition 9-0 of orders, which is not on any broker"),
    ('{"other": {"7-0": 1}}', "does not subscribe"),
    ('{"orders": {"7-0": "x"}}', "must be an integer"),
    ('{"orders": {"7-0": -3}}', "must be an integer >= 0"),
    ("soon", "must be 'earliest', 'latest' or JSON"),
    ('["orders"]', "JSON like"),
])
def test_bad_starting_offsets(spec, problem):
    with pytest.raises(ValueError, match=problem):
        starting_offsets(opts(startingOffsets=spec), BOUNDS)


def test_a_starting_offset_already_deleted_follows_fail_on_data_loss():
    spec = '{"orders": {"7-0": 3}}'
    with pytest.raises(DataLoss, match="starting offset 3 was deleted"):
        starting_offsets(opts(startingOffsets=spec), BOUNDS)
    got = starting_offsets(opts(startingOffsets=spec, failOnDataLoss="false"), BOUNDS)
    assert got["orders"]["7-0"] == 10


# -- the next micro-batch's end ----------------------------------------------------------------


def test_next_end_reads_to_each_log_end_without_a_limit():
    start = {"orders": {"7-0": 20, "7-1": 5, "8-0": 0}}
    assert next_end(start, BOUNDS) == {"orders": {"7-0": 50, "7-1": 5, "8-0": 0}}


def test_max_per_trigger_is_shared_in_proportion_to_the_backlog_and_exact():
    start = {"t": {"1-0": 0, "1-1": 0, "1-2": 0}}
    bounds = {("t", "1-0"): (0, 900), ("t", "1-1"): (0, 90), ("t", "1-2"): (0, 10)}
    end = next_end(start, bounds, 100)
    assert end == {"t": {"1-0": 90, "1-1": 9, "1-2": 1}}
    total = 0
    for _ in range(50):  # batches of 100 until everything is read: no offset skipped, nothing read twice
        new = next_end(end, bounds, 100)
        total += sum(new["t"][k] - end["t"][k] for k in new["t"])
        assert sum(new["t"][k] - end["t"][k] for k in new["t"]) <= 100
        end = new
    assert end == {"t": {"1-0": 900, "1-1": 90, "1-2": 10}} and total == 900


def test_shares_are_the_same_for_the_same_inputs_even_on_ties():
    start = {"t": {"1-0": 0, "1-1": 0, "1-2": 0}}
    bounds = {("t", k): (0, 10) for k in ("1-0", "1-1", "1-2")}
    ends = {tuple(sorted(next_end(start, bounds, 10)["t"].items())) for _ in range(5)}
    assert len(ends) == 1 and sum(dict(next(iter(ends))).values()) == 10


def test_a_new_partition_enters_at_its_first_kept_offset_and_is_read_from_the_next_batch():
    start = {"orders": {"7-0": 50}}
    bounds = {("orders", "7-0"): (10, 50), ("orders", "7-3"): (4, 40), ("fresh", "8-0"): (0, 7)}
    end = next_end(start, bounds)
    assert end == {"orders": {"7-0": 50, "7-3": 4}, "fresh": {"8-0": 0}}
    assert next_end(end, bounds) == {"orders": {"7-0": 50, "7-3": 40}, "fresh": {"8-0": 7}}


def test_an_unreachable_brokers_partitions_stay_where_they_are():
    start = {"orders": {"7-0": 20, "8-0": 3}}
    assert next_end(start, {("orders", "7-0"): (0, 30)}) == {"orders": {"7-0": 30, "8-0": 3}}


def test_offsets_json_is_plain_and_sorted():
    assert list(offsets_json({"b": {"1-1": 2, "1-0": 1}, "a": {}})) == ["a", "b"]
    assert list(offsets_json({"b": {"1-1": 2, "1-0": 1}})["b"]) == ["1-0", "1-1"]


# -- the ranges of a batch ------------------------------------------------------------------------

URLS = {7: "meta://h7:1", 8: "meta://h8:1"}


def test_ranges_of_a_batch_are_sorted_and_skip_empty_partitions():
    start = {"orders": {"8-0": 0, "7-1": 5, "7-0": 20}}
    end = {"orders": {"8-0": 4, "7-1": 5, "7-0": 50}}
    ranges = plan_stream_ranges(start, end, BOUNDS, URLS, opts())
    assert ranges == [OffsetRange("orders", 7, 0, 20, 50, URLS[7]), OffsetRange("orders", 8, 0, 0, 4, URLS[8])]


def test_offsets_deleted_behind_the_stream_follow_fail_on_data_loss():
    start, end = {"orders": {"7-0": 2}}, {"orders": {"7-0": 50}}
    with pytest.raises(DataLoss, match=r"orders 7-0: offsets 2\.\.9 were deleted by retention"):
        plan_stream_ranges(start, end, BOUNDS, URLS, opts())
    ranges = plan_stream_ranges(start, end, BOUNDS, URLS, opts(failOnDataLoss="false"))
    assert ranges == [OffsetRange("orders", 7, 0, 10, 50, URLS[7])]


def test_a_batch_on_a_broker_gone_since_planning_is_an_error_naming_it():
    with pytest.raises(Exception, match="broker 8 is not reachable"):
        plan_stream_ranges({"orders": {"8-0": 0}}, {"orders": {"8-0": 4}}, BOUNDS, {7: URLS[7]}, opts())


def test_min_partitions_cuts_the_largest_ranges_without_gap_or_overlap():
    ranges = [OffsetRange("t", 1, 0, 0, 1000, "u"), OffsetRange("t", 1, 1, 0, 10, "u")]
    cut = split_to_at_least(ranges, 8)
    assert len(cut) >= 8
    for p in (0, 1):
        mine = sorted((r.start, r.end) for r in cut if r.partition == p)
        assert mine[0][0] == 0 and all(a[1] == b[0] for a, b in pairwise(mine))
        assert mine[-1][1] == (1000 if p == 0 else 10)
    assert split_to_at_least(ranges, 2) == ranges


def test_too_many_tasks_in_one_batch_is_refused():
    start, end = {"orders": {"7-0": 10}}, {"orders": {"7-0": 10 + spark_limits.MAX_STREAM_TASKS + 1}}
    bounds = {("orders", "7-0"): (0, 10 + spark_limits.MAX_STREAM_TASKS + 1)}
    with pytest.raises(ValueError, match="cuts this micro-batch into 10001 tasks"):
        plan_stream_ranges(start, end, bounds, URLS, opts(maxOffsetsPerPartition="1"))
    end = {"orders": {"7-0": 10 + spark_limits.MAX_STREAM_TASKS}}
    assert len(plan_stream_ranges(start, end, bounds, URLS, opts(maxOffsetsPerPartition="1"))) == \
        spark_limits.MAX_STREAM_TASKS


# -- the sink -------------------------------------------------------------------------------------


def test_sink_columns_and_options():
    o = SinkOptions(dict(BROKERS, topic="orders"))
    check_columns(["value", "key", "partition", "attribute", "properties"], o)
    with pytest.raises(ValueError, match="not among them: values"):
        check_columns(["values"], o)
    with pytest.raises(ValueError, match="needs a 'value' column"):
        check_columns(["key"], o)
    with pytest.raises(ValueError, match="'topic' column or the 'topic' option"):
        check_columns(["value"], SinkOptions(BROKERS))
    with pytest.raises(ValueError, match="maxInFlight must be"):
        SinkOptions(dict(BROKERS, maxInFlight=str(spark_limits.MAX_SINK_IN_FLIGHT + 1)))
    assert (SinkOptions(dict(BROKERS, maxInFlight=str(spark_limits.MAX_SINK_IN_FLIGHT))).in_flight
            == spark_limits.MAX_SINK_IN_FLIGHT)
    with pytest.raises(ValueError, match="'brokers'"):
        SinkOptions({"topic": "t"})


def test_sink_partition_choice():
    parts = [Partition(7, 0), Partition(7, 1), Partition(8, 0)]
    assert choose(parts, 5, "ignored", "8-0") == Partition(8, 0)
    assert choose(parts, 5, None, 1) == Partition(7, 1)
    assert [choose(parts, i, None, None) for i in range(4)] == parts + parts[:1]
    assert choose(parts, 0, "k1", None) == choose(parts, 99, "k1", None)  # the same key, the same partition
    with pytest.raises(SinkError, match="9-9 is not one of the topic's"):
        choose(parts, 0, None, "9-9")
    with pytest.raises(SinkError, match="not an index"):
        choose(parts, 0, None, 3)
    with pytest.raises(SinkError):
        choose(parts, 0, None, "seven")


def test_producer_ids_are_stable_and_distinct():
    a = producer_id_of("stream", "q1", 4, 0)
    assert a == producer_id_of("stream", "q1", 4, 0) and 1 <= a < 2 ** 63
    assert len({producer_id_of("stream", "q1", b, p) for b in range(50) for p in range(8)}) == 400


@pytest.mark.integration  # spawns a Python (a fresh interpreter is the only honest sys.modules)
def test_importing_metaq_spark_alone_imports_no_spark_dependency():
    """README "Spark": importing ``metaq.spark`` alone imports none of PySpark, pyarrow, pandas, matplotlib."""
    code = ("import sys, metaq.spark\n"
            "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
