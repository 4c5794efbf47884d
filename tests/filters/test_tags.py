"""Tag expressions (filters/wire.py), and the get_tags request and reply body."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.filters import limits as filters_limits
from metaq.errors import ClientError, RemoteProtocolError
from metaq.filters.wire import (OFFSET_FIELD, decode_tagged_body, decode_tagged_reply, parse_tag_expression,
                                tag_token)
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER
from metaq.protocol.tags import tag_code
from metaq.protocol.text import TextParser, serialize


def test_expressions():
    f = parse_tag_expression("A || B ||C")
    assert f.tags == {b"A", b"B", b"C"} and f.codes == {tag_code(t) for t in f.tags}
    assert f.matches(b"A") and not f.matches(b"AB") and not f.matches(b"")
    assert parse_tag_expression("*") is None and parse_tag_expression(" ") is None
    assert parse_tag_expression(None) is None and parse_tag_expression("A||*") is None
    with pytest.raises(ClientError, match="separator"):
        parse_tag_expression("A||B\x02C")


def test_expression_length_limit_at_and_past():
    at = "A" * filters_limits.MAX_TAG_EXPRESSION_BYTES
    assert parse_tag_expression(at).tags == {at.encode()}
    with pytest.raises(ClientError, match="too long"):
        parse_tag_expression(at + "B")


def test_expression_tag_count_limit_at_and_past():
    names = ["t%d" % i for i in range(filters_limits.MAX_FILTER_TAGS)]
    assert len(parse_tag_expression("||".join(names)).tags) == filters_limits.MAX_FILTER_TAGS
    with pytest.raises(ClientError, match="names %d tags" % (filters_limits.MAX_FILTER_TAGS + 1)):
        parse_tag_expression("||".join(names + ["one-more"]))


def test_tag_token_only_for_what_a_token_can_say():
    assert tag_token(["B", "A"]) == "A||B"
    for bad in ([""], ["a b"], ["a||b"], ["a|"], ["*"], ["x\ty"], []):
        assert tag_token(bad) is None, bad


@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=8),
                min_size=1, max_size=5))
def test_a_token_parses_back_to_its_tags(names):
    token = tag_token(names)
    if token is not None:
        assert parse_tag_expression(token).tags == {n.encode() for n in names}


def parse_one(line):
    p = TextParser()
    p.receive_data(line)
    return p.next_event()


def test_get_tags_line_round_trips_and_bad_tags_are_400_lines():
    e = ev.GetTags("t", "g", 1, 5, 1000, "A||B", 7, 200, parse_tag_expression("A||B"))
    assert serialize(e) == b"get_tags t g 1 5 1000 A||B 200 7\r\n" and parse_one(serialize(e)) == e
    assert parse_one(b"get_tags t g 1 5 1000 A 7\r\n").max_wait_ms is None
    for line, why in ((b"get_tags t g 1 5 1000 * 7\r\n", "name at least one tag"),
                      (b"get_tags t g 1 5 1000 %s 7\r\n" % (b"x" * 1025), "too long"),
                      (b"get_tags t g 1 5 1000 7\r\n", "8, 9 or 10 tokens")):
        with pytest.raises(RemoteProtocolError, match=why) as exc:
            parse_one(line)
        assert not exc.value.fatal  # the line is refused, the connection goes on


def form(data, msg_id=1, flag=0):
    return HEADER.pack(len(data), metaq_checksum(data), msg_id, flag) + data


def test_decode_tagged_body():
    body = OFFSET_FIELD.pack(9) + OFFSET_FIELD.pack(2) + form(b"x") + OFFSET_FIELD.pack(5) + form(b"yy", 2)
    nxt, records = decode_tagged_body(body)
    assert nxt == 9 and [(o, r.data) for o, r in records] == [(2, b"x"), (5, b"yy")]
    assert decode_tagged_body(OFFSET_FIELD.pack(4)) == (4, [])
    for bad in (b"", body[:-1], OFFSET_FIELD.pack(2) + OFFSET_FIELD.pack(2) + form(b"x"),
                OFFSET_FIELD.pack(9) + OFFSET_FIELD.pack(5) + form(b"x") + OFFSET_FIELD.pack(5) + form(b"x")):
        with pytest.raises(RemoteProtocolError):
            decode_tagged_body(bad)


def test_get_tags_passed_round_trips_with_and_without_an_expect_and_a_get_refuses_it():
    filt = parse_tag_expression("A")
    for expect, token in (((4, 99), b"4:99:passed"), (None, b":passed")):
        e = ev.GetTags("t", "g", 1, 5, 1000, "A", 7, 200, filt, expect, True)
        line = b"get_tags t g 1 5 1000 A 200 " + token + b" 7\r\n"
        assert serialize(e) == line and parse_one(line) == e
    plain = ev.GetTags("t", "g", 1, 5, 1000, "A", 7, 200, filt, (4, 99))
    assert serialize(plain) == b"get_tags t g 1 5 1000 A 200 4:99 7\r\n" and not parse_one(serialize(plain)).passed
    # a get passes nothing over: the suffix is an invalid expect there (and what an older broker says to it)
    for line in (b"get t g 1 5 1000 200 4:99:passed 7\r\n", b"get_tags t g 1 5 1000 A 200 4:99:passedx 7\r\n",
                 b"get_tags t g 1 5 1000 A 200 passed 7\r\n"):
        with pytest.raises(RemoteProtocolError, match="invalid expect") as exc:
            parse_one(line)
        assert not exc.value.fatal


def test_decode_tagged_reply_with_the_passed_id():
    body = OFFSET_FIELD.pack(9) + OFFSET_FIELD.pack(77) + OFFSET_FIELD.pack(2) + form(b"x")
    nxt, passed_id, records = decode_tagged_reply(body, True)
    assert (nxt, passed_id) == (9, 77) and [(o, r.data) for o, r in records] == [(2, b"x")]
    assert decode_tagged_reply(OFFSET_FIELD.pack(4) + OFFSET_FIELD.pack(-1), True) == (4, -1, [])
    assert decode_tagged_reply(OFFSET_FIELD.pack(4), False) == (4, None, [])
    with pytest.raises(RemoteProtocolError, match="id before it"):
        decode_tagged_reply(OFFSET_FIELD.pack(4), True)  # an older broker's reply read as a new one's


def test_an_expression_parses_the_same_however_often_it_is_given():
    too_long = "A" * (filters_limits.MAX_TAG_EXPRESSION_BYTES + 1)
    for _ in range(3):  # the later parses are answered as the first, and a refusal is refused again
        assert parse_tag_expression("A || B").tags == {b"A", b"B"}
        assert parse_tag_expression("*") is None and parse_tag_expression("") is None
        with pytest.raises(ClientError, match="too long"):
            parse_tag_expression(too_long)
        with pytest.raises(ClientError, match="names 3 tags"):
            parse_tag_expression("A||B||C", max_tags=2)
    assert parse_tag_expression("A||B||C").tags == {b"A", b"B", b"C"}  # the default limits, not those of the last call


def test_the_parsed_expressions_kept_stay_within_their_bound():
    parse_tag_expression.cache_clear()
    expressions = ["T%d || U%d" % (i, i) for i in range(filters_limits.TAG_FILTER_CACHE + 1)]  # one past the bound
    for e in expressions:
        assert parse_tag_expression(e).tags == {e.split(" || ")[0].encode(), e.split(" || ")[1].encode()}
    assert parse_tag_expression.cache_info().currsize == filters_limits.TAG_FILTER_CACHE
    assert parse_tag_expression(expressions[0]).tags == {b"T0", b"U0"}  # the oldest went, and is parsed again
