"""SQL92 filters (filters/sql.py): RocketMQ's selector grammar, its three-valued logic and conversions, every
compile error with its position, and the named limits at and one past."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.filters import limits as filters_limits
from metaq.errors import BadFilterExpression, ClientError, RemoteProtocolError
from metaq.filters.sql import compile_sql
from metaq.protocol import events
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize

MSG = {"TAGS": "TagA", "KEYS": "k1 k2", "a": "5", "b": "abc", "f": "2.5", "t": "TRUE", "big": "3000000000"}


def ev(expression, props=MSG):
    return compile_sql(expression).evaluate(props)


@pytest.mark.parametrize("expression, want", [
    ("a = 5", True), ("a = '5'", True), ("a = '05'", False), ("a = 05.0", True), ("a <> 5", False),
    ("a > 4", True), ("a >= 5", True), ("a < 5", False), ("a <= 5", True), ("a > 4.5", True),
    ("f < 3", False), ("f < 3.0", True),
    ("f > 2.25", True), ("a = 5L", True), ("a > -1", True), ("a > +4", True), ("a > - -4", True),
    ("b = 'abc'", True), ("b <> 'abd'", True), ("TAGS = 'TagA'", True), ("KEYS CONTAINS 'k2'", True),
    ("a BETWEEN 1 AND 5", True), ("a BETWEEN 6 AND 9", False), ("a NOT BETWEEN 6 AND 9", True),
    ("a NOT BETWEEN 1 AND 5", False), ("a BETWEEN 5 AND 5", True),
    ("TAGS IN ('TagA', 'TagB')", True), ("TAGS NOT IN ('TagA', 'TagB')", False), ("b IN ('x')", False),
    ("b CONTAINS 'bc'", True), ("b NOT CONTAINS 'bc'", False), ("b STARTSWITH 'ab'", True),
    ("b ENDSWITH 'ab'", False), ("b NOT ENDSWITH 'ab'", True), ("b NOT STARTSWITH 'ab'", False),
    ("b CONTAINS ''", False), ("b NOT CONTAINS ''", False),
    ("t = TRUE", True), ("t = FALSE", False), ("b = TRUE", False), ("TRUE", True), ("FALSE", False),
    ("a IS NOT NULL", True), ("a IS NULL", False), ("zz IS NULL", True), ("zz IS NOT NULL", False),
    ("a = 5 AND b = 'abc'", True), ("a = 6 OR b = 'abc'", True), ("NOT (a = 6)", True),
    ("(a = 6 OR b = 'x') OR (a = 5 AND (b = 'abc'))", True), ("a = 5 AND NOT b = 'abc'", False),
    ("big > 5L", False), ("big > 2147483648", True), ("a = b", False), ("a > f", True),
    ("(a > 1) = TRUE", True), ("a IS NULL IS NULL", False), ("(a = 5) = (b = 'abc')", True),
])
def test_grammar_and_values(expression, want):
    assert ev(expression) is want


@pytest.mark.parametrize("expression", [
    "zz = 1", "zz <> 1", "zz > 1", "zz BETWEEN 1 AND 2", "zz NOT BETWEEN 1 AND 2", "zz IN ('a')",
    "zz NOT IN ('a')", "NOT zz = 1", "NOT (zz = 1)", "zz = 1 AND a = 5", "zz = 1 OR a = 6", "NULL", "zz",
    "NOT zz", "-zz = a", "-zz > 1",
])
def test_unknown(expression):
    """A missing property is NULL: comparisons are unknown, and unknown never matches."""
    assert ev(expression) is None
    assert compile_sql(expression).matches(MSG) is False


def test_three_valued_and_or():
    t, f, u = "a = 5", "a = 6", "zz = 1"
    assert ev("%s AND %s" % (u, f)) is False and ev("%s AND %s" % (f, u)) is False
    assert ev("%s OR %s" % (u, t)) is True and ev("%s OR %s" % (t, u)) is True
    assert ev("%s AND %s" % (u, t)) is None and ev("%s OR %s" % (u, f)) is None
    assert ev("NOT (%s OR %s)" % (u, f)) is None


def test_string_family_on_null_is_false_not_unknown():
    """As RocketMQ: CONTAINS and its NOT form are FALSE on a missing property, so NOT (...) of them is TRUE."""
    assert ev("zz CONTAINS 'x'") is False and ev("zz NOT CONTAINS 'x'") is False
    assert ev("NOT (zz STARTSWITH 'x')") is True


@pytest.mark.parametrize("expression", ["b > 1", "b = 1", "b BETWEEN 1 AND 2",
                                        "a = 6 OR b = 1", "f = 2", "f > 2"])
def test_failed_conversion_never_matches(expression):
    """A property that does not convert to the literal's type is RocketMQ's evaluation error: no match, even
    under OR (the error ends the evaluation), and NOT does not turn it into a match."""
    c = compile_sql(expression)
    assert c.matches(MSG) is False
    assert compile_sql("NOT (%s)" % expression).matches(MSG) is False


def test_short_circuit_spares_a_failed_conversion():
    assert ev("a = 5 OR b = 1") is True and ev("a = 6 AND b = 1") is False


def test_java_number_conversions():
    assert ev("n = 7", {"n": "+7"}) is True and ev("n = 7", {"n": " 7"}) is False  # Integer.valueOf: no spaces
    assert ev("n = 7.0", {"n": " 7 "}) is True  # Double.valueOf trims
    assert ev("n = 7.0", {"n": "7d"}) is True and ev("n > 1.0", {"n": "Infinity"}) is True
    assert ev("n > 1.0", {"n": "NaN"}) is True  # NaN above everything, as Java's compareTo
    assert ev("n > 1", {"n": "1.5"}) is False  # not an int: evaluation error
    assert ev("n > 1", {"n": "99999999999"}) is False and ev("n > 1L", {"n": "99999999999"}) is False
    assert ev("n > 2147483648", {"n": "99999999999"}) is True
    assert ev("x < y", {"x": "1.5", "y": "10"}) is True  # two strings ordered as doubles, not as text
    assert ev("x = y", {"x": "10", "y": "10.0"}) is False  # but = between strings is exact


def test_case_comments_and_escapes():
    assert ev("a = 5 and b is not null or FALSE") is True
    assert ev("/* c */ a = 5 -- the end\n AND b = 'abc' -- trailing") is True
    assert ev("q = 'it''s'", {"q": "it's"}) is True
    assert ev("$x_1 = 'v'", {"$x_1": "v"}) is True
    assert ev("A = 5") is None  # names are case-sensitive


def test_not_binds_tighter_than_comparison():
    """RocketMQ's grammar: ``NOT a = 1`` is ``(NOT a) = 1``; ``NOT (a = 1)`` is the negation."""
    assert ev("NOT a = 5") is False and ev("NOT (a = 5)") is False and ev("NOT (a = 6)") is True


@pytest.mark.parametrize("expression, position, expected", [
    ("", 0, "an expression"),
    ("   ", 3, "an expression"),
    ("a >", 3, "a property name, a literal or '('"),
    ("a = 1 b", 6, "AND, OR, a comparison or the end"),
    ("a = NULL", 4, "a value beside = (use IS NULL / IS NOT NULL for NULL)"),
    ("NULL <> a", 0, "a value beside <> (use IS NULL / IS NOT NULL for NULL)"),
    ("TRUE = 1", 7, "a boolean to compare with True"),
    ("a > 'x'", 4, "a number or a property beside >"),
    ("a < TRUE", 4, "a number or a property beside <"),
    ("(a = 1) > 2", 0, "a number or a property beside >"),
    ("a BETWEEN 5 AND 1", 10, "BETWEEN's low bound (5) at most its high bound (1)"),
    ("a BETWEEN NULL AND 1", 10, "a bound of BETWEEN that is not NULL"),
    ("a BETWEEN 1 OR 2", 12, "AND between BETWEEN's bounds"),
    ("'x' IN ('a')", 0, "a property name before IN"),
    ("a IN 'x'", 5, "'(' after IN"),
    ("a IN (1)", 6, "a string literal in IN's list"),
    ("a IN ('x' 'y')", 10, "',' or ')' in IN's list"),
    ("a CONTAINS 1", 11, "a string literal after CONTAINS"),
    ("a IS 1", 5, "NULL or NOT NULL after IS"),
    ("(a = 1", 6, "')' closing the '(' at character 0"),
    ("a = 'x", 6, "a quote closing the string opened at character 4"),
    ("a = 1 /* x", 10, "'*/' closing the comment opened at character 6"),
    ("a ! 1", 2, "an operator, a name, a literal or '('"),
    ("a = 0.0", 4, "a float literal at least 4.9E-324 (RocketMQ refuses 0.0)"),
    ("a = 1e999", 4, "a float literal at most 1.7976931348623157E308"),
    ("a = 9223372036854775808", 4, "an integer literal at most 9223372036854775807"),
    ("5", 0, "a condition (a comparison, IN, IS NULL, TRUE...), not a value"),
    ("a AND 'x'", 6, "a condition (a comparison, IN, IS NULL, TRUE...), not a value"),
    ("NOT -a", 4, "a condition (a comparison, IN, IS NULL, TRUE...), not a value"),
    ("a = 1 AND", 9, "a property name, a literal or '('"),
    ("a LIKE 'x'", 2, "AND, OR, a comparison or the end"),
])
def test_errors_name_position_and_expectation(expression, position, expected):
    with pytest.raises(BadFilterExpression) as info:
        compile_sql(expression)
    exc = info.value
    assert isinstance(exc, ClientError)
    assert (exc.position, exc.expected) == (position, expected)
    assert "at character %d" % position in str(exc) and expected in str(exc)


def test_length_limit_at_and_past():
    at = "a = '%s'" % ("x" * (filters_limits.MAX_SQL_FILTER_CHARS - 6))
    assert len(at) == filters_limits.MAX_SQL_FILTER_CHARS
    assert compile_sql(at).matches({"a": "x" * (filters_limits.MAX_SQL_FILTER_CHARS - 6)})
    with pytest.raises(BadFilterExpression,
                       match="at most %d characters" % filters_limits.MAX_SQL_FILTER_CHARS) as info:
        compile_sql(at + " ")
    assert info.value.position == filters_limits.MAX_SQL_FILTER_CHARS


def _nested(levels):
    return "(" * levels + "a = 5" + ")" * levels


def test_depth_limit_at_and_past():
    n = filters_limits.MAX_SQL_FILTER_DEPTH
    assert compile_sql(_nested(n)).matches(MSG)
    with pytest.raises(BadFilterExpression, match="nesting at most %d levels" % n) as info:
        compile_sql(_nested(n + 1))
    assert info.value.position == n  # the '(' one level too deep
    assert compile_sql("NOT " * n + "TRUE").evaluate(MSG) is (n % 2 == 0)
    with pytest.raises(BadFilterExpression, match="nesting"):
        compile_sql("NOT " * (n + 1) + "TRUE")
    chain = "a = 5" + " = TRUE" * n  # n comparisons chained after the first
    assert compile_sql(chain).matches(MSG)
    with pytest.raises(BadFilterExpression, match="nesting"):
        compile_sql(chain + " = TRUE")


def test_long_flat_conditions_are_no_nesting():
    """AND/OR chains are flat: only the length limit bounds them."""
    text = " OR ".join("a = %d" % i for i in range(300))
    assert compile_sql(text).matches(MSG)


def test_in_items_limit_at_and_past():
    n = filters_limits.MAX_SQL_FILTER_IN_ITEMS
    items = ", ".join("'v%d'" % i for i in range(n))
    assert compile_sql("p IN (%s)" % items).matches({"p": "v%d" % (n - 1)})
    text = "p IN (%s, 'past')" % items
    with pytest.raises(BadFilterExpression, match="at most %d items" % n) as info:
        compile_sql(text)
    assert info.value.position == text.index("'past'")


_NAMES = st.sampled_from(["a", "b", "c"])
_LEAF = st.one_of(
    st.builds("{} = {}".format, _NAMES, st.integers(-3, 3)),
    st.builds("{} > {}".format, _NAMES, st.integers(-3, 3)),
    st.builds("{} BETWEEN {} AND {}".format, _NAMES, st.integers(-3, 0), st.integers(0, 3)),
    st.builds("{} IN ('{}', '{}')".format, _NAMES, st.integers(-3, 3), st.integers(-3, 3)),
    st.builds("{} STARTSWITH '{}'".format, _NAMES, st.integers(-3, 3)),
    st.sampled_from(["TRUE", "FALSE", "a IS NULL", "b IS NOT NULL"]),
)
_EXPR = st.recursive(_LEAF, lambda inner: st.one_of(
    st.builds("({}) AND ({})".format, inner, inner), st.builds("({}) OR ({})".format, inner, inner),
    st.builds("NOT ({})".format, inner)), max_leaves=8)
_PROPS = st.fixed_dictionaries({n: st.integers(-4, 4).map(str) for n in ("a", "b", "c")})


@given(_EXPR, _PROPS)
def test_not_is_the_complement_without_nulls(expression, props):
    """With every property present and numeric, a condition is TRUE or FALSE, and NOT p matches exactly the
    messages p does not."""
    p, q = compile_sql(expression), compile_sql("NOT (%s)" % expression)
    assert p.evaluate(props) in (True, False)
    assert p.matches(props) != q.matches(props)


@given(_EXPR, _PROPS)
def test_de_morgan(expression, props):
    left = compile_sql("NOT ((%s) AND a = 0)" % expression).evaluate(props)
    right = compile_sql("NOT (%s) OR NOT (a = 0)" % expression).evaluate(props)
    assert left is right


def test_compiled_once_evaluated_many():
    f = compile_sql("a > 3 AND TAGS IN ('TagA')")
    assert f.expression == "a > 3 AND TAGS IN ('TagA')"
    assert [f.matches({"a": str(i), "TAGS": "TagA"}) for i in range(6)] == [False] * 4 + [True] * 2


def parse_frames(data):
    """Every event of ``data`` fed to one TextParser, and each error in its place: what a connection sees."""
    p = TextParser()
    p.receive_data(data)
    out = []
    while True:
        try:
            e = p.next_event()
        except RemoteProtocolError as exc:
            out.append(exc)
            continue
        if e is NEED_DATA:
            return out
        out.append(e)


def test_get_sql_frame_round_trips_and_a_bad_expression_is_a_400_naming_the_position():
    e = events.GetSql("t", "g", 1, 5, 1000, "a > 1 AND b = 'x y'", 7, 200, compile_sql("a > 1 AND b = 'x y'"))
    frame = serialize(e)
    assert frame == b"get_sql t g 1 5 1000 19 200 7\r\na > 1 AND b = 'x y'"
    [got] = parse_frames(frame)
    assert got == e and got.filter.matches({"a": "2", "b": "x y"})
    bad = b"get_sql t g 1 5 1000 3 9\r\na >"
    [err, after] = parse_frames(bad + frame)  # the whole frame is read: the next one parses
    assert isinstance(err, RemoteProtocolError) and not err.fatal and err.opaque == 9
    assert "at character 3" in str(err) and after == e


def test_get_sql_expression_bytes_limit_at_and_past():
    n = filters_limits.MAX_SQL_FILTER_BYTES
    at = b"get_sql t g 0 0 1024 %d 1\r\n" % n + b" " * n
    [err] = parse_frames(at)  # taken, then refused by its characters
    assert "at most %d characters" % filters_limits.MAX_SQL_FILTER_CHARS in str(err) and not err.fatal
    past = b"get_sql t g 0 0 1024 %d 2\r\n" % (n + 1) + b" " * (n + 1)
    [err, after] = parse_frames(past + b"get_sql t g 0 0 1024 5 3\r\na > 1")
    assert "exprBytes" in str(err) and not err.fatal and err.opaque == 2  # its body skipped
    assert after.opaque == 3


@pytest.mark.parametrize("low, high", [(-3, 3), (0, 0), (2, 5), (-5, -1), (2147483647, 2147483648), (0, 2147483648)])
@pytest.mark.parametrize("value", ["-4", "-3", "0", "3", "4", "2147483647", "2147483648", "x", "1.5"])
def test_between_is_the_two_comparisons_it_stands_for(low, high, value):
    """BETWEEN / NOT BETWEEN (compiled in one step for integer bounds) decide as RocketMQ's AND / OR of two
    comparisons, conversions and their failures included."""
    props = {"v": value}
    for negate, spelled in ((False, "v >= %d AND v <= %d"), (True, "v < %d OR v > %d")):
        word = "NOT BETWEEN" if negate else "BETWEEN"
        assert ev("v %s %d AND %d" % (word, low, high), props) is ev(spelled % (low, high), props)
