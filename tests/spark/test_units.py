"""metaq.spark without Spark: Burrow's rules, offsets options, range splitting, the range reader, progress."""

import io
import json

import pytest
from hypothesis import given, strategies as st

from metaq.spark.burrow import Commit, burrow_group_status, group_status, partition_status
from metaq.spark.ranges import (EARLIEST, LATEST, DataLoss, OffsetRange, msg_timestamp_ms, parse_offsets,
                                plan_ranges, read_range, split_ranges)
from metaq.spark.report import Progress, main
from metaq.protocol.msgid import id_timestamp_ms
from metaq.store.msgid import IdGenerator
from tests.harness.broker import url_of


def window(*entries, step=60):
    """Commits one ``step`` apart: ``entries`` are (offset, lag)."""
    return [Commit(i * step, off, lag) for i, (off, lag) in enumerate(entries)]


# -- Burrow's rules, one by one ---------------------------------------------------------------


def test_rule1_no_current_lag_or_a_zero_in_the_window_is_ok():
    assert partition_status(window((10, 5), (10, 5)), current_lag=0, now=120) == "OK"
    assert partition_status(window((10, 5), (20, 0), (20, 9)), current_lag=9, now=120) == "OK"


def test_rule2_offset_going_back_is_rewind_even_when_it_also_stopped():
    assert partition_status(window((10, 5), (30, 4), (12, 20)), current_lag=20, now=10_000) == "REWIND"


def test_rule3_no_commit_for_longer_than_the_window_spans_is_stop():
    w = window((10, 5), (12, 6), (14, 7))  # commits at 0, 60, 120
    assert partition_status(w, current_lag=9, now=241) == "STOP"  # 121 s since the last > 120 s span
    assert partition_status(w, current_lag=9, now=240) == "WARN"


def test_rule4_same_offset_committed_again_and_again_is_stall():
    assert partition_status(window((10, 5), (10, 8), (10, 9)), current_lag=9, now=120) == "STALL"


def test_rule5_advancing_offsets_with_never_decreasing_lag_is_warn_else_ok():
    assert partition_status(window((10, 5), (12, 5), (15, 7)), current_lag=7, now=120) == "WARN"
    assert partition_status(window((10, 5), (12, 8), (20, 3)), current_lag=3, now=120) == "OK"


def test_one_commit_shows_no_trend_ok_with_its_lag_until_time_passes_without_another_then_stop():
    assert partition_status(window((10, 5)), current_lag=5, now=0) == "OK"  # not STALL, nor WARN
    assert partition_status(window((10, 5)), current_lag=5, now=60) == "STOP"  # rule 3: no commit since


def test_no_offset_is_notfound_and_empty_window_is_ok():
    assert partition_status([], current_lag=None, now=0) == "NOTFOUND"
    assert partition_status([], current_lag=4, now=0) == "OK"


def test_group_takes_the_worst_partition_status():
    assert group_status(["OK", "WARN", "OK"]) == "WARN"
    assert group_status(["OK", "STOP", "STALL", "WARN"]) == "STALL"
    assert group_status(["STALL", "REWIND"]) == "REWIND"
    assert group_status(["OK", "BROKER_DOWN"]) == "BROKER_DOWN"
    assert group_status([]) == "NOTFOUND"
    assert burrow_group_status(["OK", "STALL"]) == "ERR"
    assert burrow_group_status(["OK", "WARN"]) == "WARN"


# -- options and ranges -------------------------------------------------------------------------


def test_offsets_options_earliest_latest_and_kafka_style_json():
    assert parse_offsets(None, "t", "start") == EARLIEST
    assert parse_offsets("latest", "t", "end") == LATEST
    doc = json.dumps({"t": {"7-0": 23, "7-1": -2}})
    assert parse_offsets(doc, "t", "start") == {"7-0": 23, "7-1": EARLIEST}
    with pytest.raises(ValueError, match="cannot be 'latest'"):
        parse_offsets("latest", "t", "start")
    with pytest.raises(ValueError, match="cannot be 'earliest'"):
        parse_offsets("earliest", "t", "end")
    with pytest.raises(ValueError, match="must be"):
        parse_offsets('{"other": {"0-0": 1}}', "t", "start")
    with pytest.raises(ValueError, match="brokerId"):
        parse_offsets('{"t": {"zero": 1}}', "t", "start")
    with pytest.raises(ValueError, match="cannot be -1"):
        parse_offsets('{"t": {"0-0": -1}}', "t", "start")


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=5), st.integers(1, 120))
def test_split_ranges_covers_exactly_the_same_offsets(bounds, step):
    ranges = [OffsetRange("t", 0, i, min(a, b), max(a, b), "meta://x:1") for i, (a, b) in enumerate(bounds)]
    pieces = split_ranges(ranges, step)
    assert all(0 < p.count <= step for p in pieces)
    want = sorted((r.partition, o) for r in ranges for o in range(r.start, r.end))
    got = sorted((p.partition, o) for p in pieces for o in range(p.start, p.end))
    assert got == want


def test_message_timestamp_is_the_brokers_id_timestamp():
    gen = IdGenerator(5)
    for now_ms in (1303895660503, 1700000000123, 1800000000999):
        msg_id = gen.next_id(now_ms)
        assert msg_timestamp_ms(msg_id) == id_timestamp_ms(msg_id) == now_ms


def test_read_range_reads_exactly_the_range_across_get_batches(broker):
    with broker.client() as c:
        sent = [c.put_ok("tr", b"body-%03d" % i, 1, attribute="a" if i % 3 == 0 else None) for i in range(60)]
    url = url_of(broker)
    rows = list(read_range(OffsetRange("tr", 7, 1, 13, 47, url), fetch_bytes=100))  # ~3 records per get
    assert [r[2] for r in rows] == list(range(13, 47))
    for topic, part, offset, msg_id, attribute, value, ts, key, properties in rows:
        assert (topic, part, value, key, properties) == ("tr", "7-1", b"body-%03d" % offset, None, {})
        assert msg_id == sent[offset][0]
        assert attribute == ("a" if offset % 3 == 0 else None)
        assert ts.timestamp() * 1000 == pytest.approx(id_timestamp_ms(msg_id), abs=1)
    with pytest.raises(DataLoss, match="ends before offset 60"):
        list(read_range(OffsetRange("tr", 7, 1, 55, 61, url)))
    plan = plan_ranges({"brokers": url, "topic": "tr", "startingOffsets": '{"tr": {"7-1": 50}}',
                        "maxOffsetsPerPartition": "4"})
    assert [(r.key, r.start, r.end) for r in plan] == [("7-1", 50, 54), ("7-1", 54, 58), ("7-1", 58, 60)]
    with pytest.raises(DataLoss, match="past the log end"):
        plan_ranges({"brokers": url, "topic": "tr", "endingOffsets": '{"tr": {"7-1": 61}}'})
    with pytest.raises(ValueError, match="not on any broker"):
        plan_ranges({"brokers": url, "topic": "tr", "partitions": "7-3"})


# -- progress -----------------------------------------------------------------------------------


class FakeTty(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_a_bar_only_on_a_terminal():
    plain = io.StringIO()
    p = Progress(2, stream=plain)
    p.step("collecting")
    p.note("asking broker meta://x:1")  # details are for terminals only
    p.step("done")
    p.finish()
    assert plain.getvalue() == "metaq-spark-report: [1/2] collecting\nmetaq-spark-report: [2/2] done\n"
    tty = FakeTty()
    p = Progress(2, stream=tty, width=4)
    p.step("collecting")
    p.step("done")
    p.finish()
    assert tty.getvalue().startswith("\r[##..] 1/2 collecting") and "\r[####] 2/2 done" in tty.getvalue()
    assert tty.getvalue().endswith("\n")
    quiet = FakeTty()
    Progress(1, stream=quiet, quiet=True).step("x")
    assert quiet.getvalue() == ""


def test_command_line_usage_errors_exit_2(capsys):
    assert main(["--out", "/tmp/never-written"]) == 2
    assert "give --zk" in capsys.readouterr().err
    assert main(["--zk", "127.0.0.1:1", "--out", "/tmp/never-written", "--intervals", "1"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["--zk", "127.0.0.1:1"])  # --out is required
    assert exc.value.code == 2
