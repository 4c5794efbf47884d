"""``startingTimestamp`` of the metaq batch source: ``offsets_at_time`` and ``plan_ranges`` against a real broker,
and a real local Spark reading from the start of the second of three bursts."""

import json
import time

import pytest

from metaq.spark.ranges import offsets_at_time, parse_timestamp, plan_ranges
from tests.harness.broker import url_of

TOPIC = "t-ts"  # t* topics have 4 partitions in small_config; the bursts use 0 and 1
GAP_S = 1.1
BURST = 6


def now_ms():
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def three_bursts(tmp_path_factory):
    """A broker holding three bursts of BURST messages (``b"<burst>-<i>"``, message i on partition i % 2),
    GAP_S apart; its url, the time just before each burst (ms) and ``{(burst, i): (partition, offset)}``."""
    from metaq.client.local import BrokerProcess, small_config

    wd = tmp_path_factory.mktemp("ts")
    b = BrokerProcess(wd, small_config(wd / "data")).start()
    try:
        starts, where = [], {}
        with b.client() as c:
            for n in range(3):
                if n:
                    time.sleep(GAP_S)
                starts.append(now_ms())
                for i in range(BURST):
                    _id, p, offset = c.put_ok(TOPIC, b"%d-%d" % (n, i), i % 2)
                    where[(n, i)] = ("7-%d" % p, offset)
        yield url_of(b), starts, where
    finally:
        b.kill()


def options(url, **more):
    return dict({"brokers": url, "topic": TOPIC}, **more)


def test_offsets_at_time_answer_each_partition(three_bursts):
    url, starts, where = three_bursts
    second = offsets_at_time({7: url}, TOPIC, starts[1])
    assert second == {(7, 0): 3, (7, 1): 3}  # burst 1 put offsets 0..2 on each partition
    assert offsets_at_time({7: url}, TOPIC, 0) == {(7, 0): 0, (7, 1): 0}
    assert offsets_at_time({7: url}, TOPIC, now_ms() + 60_000) == {(7, 0): 9, (7, 1): 9}
    assert where[(1, 0)] == ("7-0", 3) and where[(1, 1)] == ("7-1", 3)


def test_plan_ranges_starts_at_the_time_and_it_takes_precedence_over_starting_offsets(three_bursts):
    url, starts, _where = three_bursts
    ranges = plan_ranges(options(url, startingTimestamp=str(starts[2])))
    assert [(r.key, r.start, r.end) for r in ranges] == [("7-0", 6, 9), ("7-1", 6, 9)]
    both = plan_ranges(options(url, startingTimestamp=str(starts[1]),
                               startingOffsets=json.dumps({TOPIC: {"7-0": 8, "7-1": 0}})))
    assert [(r.key, r.start, r.end) for r in both] == [("7-0", 3, 9), ("7-1", 3, 9)]  # as Spark: the time wins


def test_a_time_after_every_message_fails_unless_the_strategy_is_latest(three_bursts):
    url, _starts, _where = three_bursts
    later = str(now_ms() + 60_000)
    with pytest.raises(ValueError) as info:
        plan_ranges(options(url, startingTimestamp=later))
    assert "no message of t-ts 7-0 was stored at or after it (the partition ends at offset 9); set " \
           "startingOffsetsByTimestampStrategy=latest" in str(info.value)
    ranges = plan_ranges(options(url, startingTimestamp=later, startingOffsetsByTimestampStrategy="latest"))
    assert ranges == []  # every partition starts at its end: nothing to read
    with pytest.raises(ValueError, match="must be 'error' or 'latest'"):
        plan_ranges(options(url, startingTimestamp=later, startingOffsetsByTimestampStrategy="earliest"))


@pytest.mark.parametrize("bad", ["yesterday", "-1", "1.7e12", "2026-11-23T09:00:00Z", ""])
def test_a_starting_timestamp_is_a_long_of_milliseconds(bad):
    with pytest.raises(ValueError) as info:
        parse_timestamp(bad)
    assert "startingTimestamp must be milliseconds since the Unix epoch" in str(info.value)


@pytest.mark.slow
def test_spark_reads_exactly_the_second_and_third_bursts_from_their_start(spark, three_bursts):
    url, starts, where = three_bursts
    df = (spark.read.format("metaq").option("brokers", url).option("topic", TOPIC)
          .option("startingTimestamp", starts[1]).load())
    rows = df.collect()
    got = sorted((r["partition"], r["offset"], bytes(r["value"])) for r in rows)
    expected = sorted(where[(n, i)] + (b"%d-%d" % (n, i),) for n in (1, 2) for i in range(BURST))
    assert got == expected  # bursts 2 and 3, each message once, nothing of burst 1
    assert min(r["timestamp"].timestamp() for r in rows) * 1000 >= starts[1] - 1
