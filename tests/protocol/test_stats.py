"""The stats codec (metaq.protocol.stats): every item formats and parses back, malformed replies fail clearly."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol import stats as codec


def test_stats_body_helpers():
    from metaq.protocol.stats import lines as stats_lines
    from metaq.protocol.stats import parse_summary as stats_dict

    body = b"STATS\r\npid 12\r\nversion 0.1.0\r\norders *Empty*\r\nflag\r\nEND\r\n"
    assert stats_lines(body) == ["pid 12", "version 0.1.0", "orders *Empty*", "flag"]
    assert stats_dict(body) == {"pid": "12", "version": "0.1.0", "orders": "*Empty*", "flag": ""}
    assert stats_lines(b"STATS\r\nEND\r\n") == []


def test_summary_values_are_written_as_before():
    body = codec.encode_summary([("pid", 12), ("slave", False), ("writes_refused", True), ("crc32", "isa-l"),
                                 ("flush_time_p50_ms", 1.5), ("disk_usage", 0.25), ("zookeeper", "standalone")])
    assert body == (b"STATS\r\npid 12\r\nslave false\r\nwrites_refused true\r\ncrc32 isa-l\r\n"
                    b"flush_time_p50_ms 1.500\r\ndisk_usage 0.2500\r\nzookeeper standalone\r\nEND\r\n")
    assert codec.parse(None, body)["disk_usage"] == "0.2500"


def test_table_items_round_trip_with_their_wire_lines():
    topics = [codec.TopicRow("a", None), codec.TopicRow("b", 4, 10, 300)]
    body = codec.encode_topics(topics)
    assert body == (b"STATS\r\na *Empty*\r\nb partitions 4 message_count 10 message_bytes 300 "
                    b"accept_publish true accept_subscribe true\r\nEND\r\n")
    assert codec.parse("topics", body) == topics

    offsets = [codec.OffsetRow("test", 3, 0, 1)]
    body = codec.encode_offsets(offsets)
    assert body == b"STATS\r\ntest part 3 min_offset 0 max_offset 1\r\nEND\r\n"
    assert codec.parse("offsets", body) == offsets

    groups = [codec.GroupRow("billing", "t1", 0, 1, 5, 4, 1700000000000),
              codec.GroupRow("sc", "t1", 1, 2, 9, 6, None, "pop", 3)]
    body = codec.encode_groups(groups)
    assert b"billing t1 0 offset 1 max_offset 5 lag 4 committed_ms 1700000000000 kind offsets in_flight -\r\n" in body
    assert b"sc t1 1 offset 2 max_offset 9 lag 6 committed_ms - kind pop in_flight 3\r\n" in body
    assert codec.parse("groups", body) == groups
    assert codec.parse_groups_page(codec.encode_groups(groups, left_out=7)) == (groups, 7)
    old = b"STATS\r\nbilling t1 0 offset 1 max_offset 5 lag 4 committed_ms 1700000000000\r\nEND\r\n"
    assert codec.parse("groups", old) == groups[:1]  # a broker before kinds: committed offsets

    txs = [codec.TransactionRow("XID:1:aa:bb:q", "prepared", 3, 30, 5, None, 0),
           codec.TransactionRow("TX:s:1", "open", 1, 2, 5, 7, 60)]
    body = codec.encode_transactions(txs)
    assert b"XID:1:aa:bb:q prepared puts 3 bytes 30 begun_ms 5 prepared_ms - timeout_s 0\r\n" in body
    assert codec.parse("transactions", body) == txs


def test_delay_realtime_topic_and_replica_round_trip():
    levels = [codec.DelayLevelRow(1, "1s", 0, None, 3), codec.DelayLevelRow(2, "5s", 3, 1732281620000, 17)]
    totals = [("redeliveries_skipped", 0), ("dropped", 1), ("refused_rounds", 2)]
    body = codec.encode_delay(levels, totals)
    assert b"\r\nlevel 2 delay 5s pending 3 next_due_ms 1732281620000 delivered 17\r\n" in body
    assert codec.parse("delay", body) == (levels, dict(totals))

    values = {name: "null" for name in codec.REALTIME}
    values["put"] = codec.format_realtime(4, 4, 2.0)
    assert values["put"] == "Count=4,Value=4,Value/Count=1.00,Count/Duration=2.00,Duration=2"
    parsed = codec.parse("realtime", codec.encode_realtime(values))
    assert parsed["put"] == codec.Realtime(4, 4, "1.00", "2.00", 2) and parsed["get"] is None
    assert codec.format_realtime(1, 9, 0) == "Count=1,Value=9,Value/Count=9.00,Count/Duration=invalid,Duration=0"

    figures = codec.TopicFigures("test", 0, 4, 4, 120, values)
    body = codec.encode_topic(figures)
    assert body.split(b"\r\n")[1:6] == [b"test", b"resultCode 0", b"partitions 4", b"message_count 4", b"bytes 120"]
    back = codec.parse("test", body)
    assert back[:5] == figures[:5] and back.realtime["put"].count == 4 and back.realtime["offset"] is None

    row = codec.ReplicaRow("127.0.0.1:4000", 10, 8, 2)
    assert codec.format_replica(row) == "127.0.0.1:4000 acked 10 durable 8 lag_bytes 2"
    assert codec.parse_replica(codec.format_replica(row)) == row
    assert codec.parse("config", b"a: 1\n") == b"a: 1\n"
    assert codec.parse("help", codec.encode(["one line", "two"])) == ["one line", "two"]


@pytest.mark.parametrize("item, body, says", [
    ("", b"pid 12\r\n", "not framed"),
    ("offsets", b"STATS\r\ntest part 3 min_offset 0\r\nEND\r\n", "has 5 words, not 7"),
    ("offsets", b"STATS\r\ntest prt 3 min_offset 0 max_offset 1\r\nEND\r\n", "'prt' where 'part'"),
    ("groups", b"STATS\r\ng t x offset 1 max_offset 5 lag 4 committed_ms 1\r\nEND\r\n", "partition is not an integer"),
    ("delay", b"STATS\r\ndropped many\r\nEND\r\n", "delay dropped is not an integer"),
    ("realtime", b"STATS\r\nrealtime_put null\r\nEND\r\n", "realtime has no realtime_get line"),
    ("realtime", codec.encode(["realtime_%s Count=x" % n for n in codec.REALTIME]), "a realtime value"),
    ("orders", b"STATS\r\norders\r\nresultCode 0\r\nEND\r\n", "stats orders has no partitions line"),
    ("orders", b"STATS\r\nEND\r\n", "topic's name alone"),
])
def test_a_malformed_reply_is_a_protocol_error_not_an_index_error(item, body, says):
    with pytest.raises(RemoteProtocolError, match="malformed stats reply") as info:
        codec.parse(item, body)
    assert says in str(info.value)
