"""The one decision of a consumer group's lag, of every kind, and the bound on the rows a broker answers."""

import pytest

from metaq.groups.lag import Position, lag, rows


def test_lag_per_kind_counts_what_is_left_to_consume():
    assert lag("offsets", 3, 10) == 7
    assert lag("pop", 3, 10, done_ahead=2) == 5  # acknowledged out of order above its lowest
    assert lag("mqtt_shared", 10, 10) == 0
    assert lag("mqtt_session", 12, 10) == 0  # past a cut end: nothing owed
    with pytest.raises(ValueError, match="unknown group kind 'kafka'"):
        lag("kafka", 0, 1)


def test_rows_keep_the_most_behind_up_to_the_limit_and_say_how_many_were_left_out():
    positions = [Position("g%d" % i, "offsets", "t", 0, i) for i in range(5)]
    positions.append(Position("gone", "pop", "old", 0, 0))
    ends = {("t", 0): 10}
    got, left_out = rows(positions, lambda t, p: ends.get((t, p)), 5)
    assert (len(got), left_out) == (5, 0)  # the position of a gone topic is no row
    got, left_out = rows(positions, lambda t, p: ends.get((t, p)), 4)
    assert left_out == 1 and [r.group for r in got] == ["g0", "g1", "g2", "g3"]  # g4, the least behind, left out
    assert got[0].lag == 10 and got[0].kind == "offsets"


def test_a_sessions_messages_in_flight_are_counted_per_partition():
    from metaq.mqtt.port import session_positions

    got = session_positions("dev", {("a", 0): 5, ("a", 1): 7}, [("a", 1), ["a", 1], ("b", 0)], 1234)
    assert got == [Position("dev", "mqtt_session", "a", 0, 5, 1234, 0),
                   Position("dev", "mqtt_session", "a", 1, 7, 1234, 2)]


def test_rows_fit_in_the_byte_bound_the_most_behind_kept():
    from metaq.protocol.stats import group_line

    long_name = "$share/g/" + "x" * 1000
    positions = [Position(long_name, "mqtt_shared", "t", 0, 0), Position("small", "offsets", "t", 0, 5)]
    first = len(group_line(rows(positions[:1], lambda t, p: 10, None)[0][0]).encode()) + 2
    got, left_out = rows(positions, lambda t, p: 10, 10, first)  # room for the most behind only
    assert [r.group for r in got] == [long_name] and left_out == 1
    got, left_out = rows(positions, lambda t, p: 10, 10, first - 1)  # one byte short of it: nothing fits
    assert (got, left_out) == ([], 2)


def test_a_name_with_spaces_line_ends_or_percent_signs_is_one_word_and_reads_back_as_it_was():
    from metaq.protocol import stats as codec

    names = ["dev 1", "a\r\nEND", "100%", "caf\u00e9", "billing"]
    body = codec.encode_groups([codec.GroupRow(n, "t", 0, 1, 2, 1, None, "mqtt_session", 0) for n in names])
    assert b"billing t 0 " in body and b"dev%201 t 0 " in body and body.count(b"\r\nEND\r\n") == 1
    assert [r.group for r in codec.parse("groups", body)] == names
