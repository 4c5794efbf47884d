"""MQTT topic names and filters (metaq.mqtt.topics): the specification's examples (MQTT 5.0 §4.7, §4.8.2; the same
in 3.1.1 §4.7) and the limits at and one past."""

import pytest

from metaq.mqtt.limits import MQTT_MAX_TOPIC_BYTES, MQTT_MAX_TOPIC_LEVELS
from metaq.mqtt.topics import OutboundAliases, TopicError, matches, split_shared, validate_filter, validate_name


@pytest.mark.parametrize("topic_filter, name, expected", [
    # §4.7.1.2 the multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    # §4.7.1.3 the single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("sport/+/player1", "sport/tennis/player1", True),
    ("+/tennis/#", "sport/tennis", True),
    ("+/tennis/#", "sport/tennis/player1", True),
    # §4.7.2 topics beginning with $
    ("#", "$SYS/monitor/Clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS", True),
    # §4.7.3 case-sensitive, spaces are characters, empty levels are levels
    ("ACCOUNTS", "Accounts", False),
    ("Accounts payable", "Accounts payable", True),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("a/b", "a/b/", False),
    ("/", "/", True),
    ("+/+", "/", True),
])
def test_matches_as_the_specification_says(topic_filter, name, expected):
    validate_filter(topic_filter)
    validate_name(name)
    assert matches(topic_filter, name) is expected


@pytest.mark.parametrize("topic_filter", ["#", "sport/tennis/#", "+", "+/tennis/#", "sport/+/player1", "/", "//",
                                          "a/+/+/#", "$SYS/#", "caf\u00e9/+", "a b/c"])
def test_valid_filters(topic_filter):
    assert validate_filter(topic_filter) == (None, topic_filter)


@pytest.mark.parametrize("topic_filter", ["", "sport/tennis#", "sport/tennis/#/ranking", "sport+", "#/a", "a/#/",
                                          "a/b+", "+a", "a\x00b", "##", "++"])
def test_invalid_filters(topic_filter):
    with pytest.raises(TopicError):
        validate_filter(topic_filter)


@pytest.mark.parametrize("name", ["", "a/+", "a/#", "#", "+", "sport+", "a\x00"])
def test_invalid_names(name):
    with pytest.raises(TopicError):
        validate_name(name)


@pytest.mark.parametrize("name", ["/", "a//b", "/finance", "$SYS/x", "Accounts payable", "\u00e9t\u00e9"])
def test_valid_names(name):
    validate_name(name)


@pytest.mark.parametrize("topic_filter, group, inner", [
    ("$share/consumer1/sport/tennis/+", "consumer1", "sport/tennis/+"),
    ("$share/consumer2/sport/tennis/+", "consumer2", "sport/tennis/+"),
    ("$share/consumer1//finance", "consumer1", "/finance"),
    ("$share/g/#", "g", "#"),
    ("$share/g/$SYS/#", "g", "$SYS/#"),
])
def test_shared_subscriptions(topic_filter, group, inner):
    assert split_shared(topic_filter) == (group, inner)
    assert validate_filter(topic_filter) == (group, inner)


@pytest.mark.parametrize("topic_filter", ["$share", "$share/g", "$share//a", "$share/g+/a", "$share/g#/a",
                                          "$share/g/", "$share/g/a/#/b", "$share/+/a"])
def test_invalid_shared_subscriptions(topic_filter):
    with pytest.raises(TopicError):
        validate_filter(topic_filter)


def test_shared_filters_are_ordinary_filters_without_shared_subscriptions():
    """MQTT 3.1.1 has no shared subscriptions: $share is a level like any other there."""
    assert validate_filter("$share/g", shared=False) == (None, "$share/g")
    assert validate_filter("$share", shared=False) == (None, "$share")
    assert split_shared("$shared/g/a") == (None, "$shared/g/a")


def test_a_shared_subscription_matches_with_its_inner_filter():
    _, inner = validate_filter("$share/g/sport/+")
    assert matches(inner, "sport/tennis")
    assert not matches(inner, "$share/g/sport/tennis")


def test_byte_limit_at_and_one_past():
    at = "a" * MQTT_MAX_TOPIC_BYTES
    validate_name(at)
    validate_filter(at)
    with pytest.raises(TopicError, match="bytes"):
        validate_name(at + "b")
    with pytest.raises(TopicError, match="bytes"):
        validate_filter(at + "b")
    # bytes, not characters: U+00E9 is two bytes in UTF-8
    validate_name("\u00e9" * (MQTT_MAX_TOPIC_BYTES // 2) + "a" * (MQTT_MAX_TOPIC_BYTES % 2))
    with pytest.raises(TopicError, match="bytes"):
        validate_name("\u00e9" * (MQTT_MAX_TOPIC_BYTES // 2 + 1))


def test_level_limit_at_and_one_past():
    at = "/".join(["x"] * MQTT_MAX_TOPIC_LEVELS)
    validate_name(at)
    validate_filter(at)
    validate_filter("/".join(["+"] * (MQTT_MAX_TOPIC_LEVELS - 1) + ["#"]))
    assert matches(at, at)
    with pytest.raises(TopicError, match="levels"):
        validate_name(at + "/x")
    with pytest.raises(TopicError, match="levels"):
        validate_filter("/" * MQTT_MAX_TOPIC_LEVELS)


def test_limits_may_be_tightened_by_the_caller():
    validate_name("a/b", max_bytes=3, max_levels=2)
    with pytest.raises(TopicError):
        validate_name("a/bc", max_bytes=3)
    with pytest.raises(TopicError):
        validate_filter("a/b/c", max_levels=2)


def test_outbound_aliases_policy_bound_and_undo():
    """The policy of the aliases the broker sends (docs/mqtt.md "Topic aliases"): a name's first delivery sets one
    while one is free, at most ``most``; past them the least recently used goes to a name delivered again only when
    unused since that name's previous delivery; at most ``remember`` names delivered once are remembered; a decision
    undone, a free alias's too."""
    t = OutboundAliases(2, 3)
    assert [t.choose("a"), t.choose("a"), t.choose("a")] == [(1, True), (1, False), (1, False)]
    assert [t.choose("b"), t.choose("b")] == [(2, True), (2, False)]  # at the maximum
    assert [t.choose("c"), t.choose("a"), t.choose("c")] == [None, (1, False), (2, True)]  # b unused since: c's
    assert t.choose("b") is None and len(t) == 2  # one past the maximum: b starts over
    for _ in range(2):  # names in turn, more of them than aliases: a and c keep theirs
        assert [t.choose("a"), t.choose("c"), t.choose("b")] == [(1, False), (2, False), None]
    for name in ("x", "y", "z"):  # three more names delivered once: b, seen longest ago, is forgotten
        assert t.choose(name) is None
    assert t.choose("b") is None  # a first delivery again
    assert t.choose("b") == (1, True)  # a, unused since b's previous delivery, is the least recently used
    t.settle()
    mark = t.mark()
    assert [t.choose("d"), t.choose("d")] == [None, (2, True)]  # c's
    t.undo(mark)  # its PUBLISH was not written
    t.settle()
    assert (t.alias_of("c"), t.alias_of("d"), t.alias_of("b")) == (2, None, 1)
    free = OutboundAliases(3, 3)
    assert free.choose("e") == (1, True)
    mark = free.mark()
    assert [free.choose("f"), free.choose("g")] == [(2, True), (3, True)]
    free.undo(mark)  # not written: both free again, the next names take them in order
    assert (free.alias_of("f"), free.alias_of("g"), free.choose("g"), free.choose("f")) == (None, None, (2, True),
                                                                                           (3, True))
    with pytest.raises(ValueError):
        OutboundAliases(0, 3)
    with pytest.raises(ValueError):
        OutboundAliases(4, 3)
