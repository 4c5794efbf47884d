"""The broker's mapping of MQTT topic names to metaq topics (metaq/mqtt/topicmap.py; docs/mqtt.md "Topics")."""

import itertools

import pytest

from metaq.mqtt.limits import MQTT_MAX_TOPIC_RULES
from metaq.mqtt.topicmap import DEFAULT_FALLBACK, DEFAULT_MAP, TopicMap, TopicMapError, overlaps
from metaq.mqtt.topics import matches

DEVICES = TopicMap([{"filter": "/devices/#", "topic": "devices"},
                    {"filter": "+/alarm/#", "topic": "alarms"},
                    {"filter": "sensors/secret/#", "topic": "secret"}], fallback="other")


@pytest.mark.parametrize("name, default, ruled", [
    ("sensors/room1/temp", "sensors", "sensors"),      # the first level, as before: old data dirs keep their topics
    ("plain", "plain", "plain"),
    ("/devices/1/up", "mqtt", "devices"),              # an empty first level
    ("/devices", "mqtt", "devices"),                   # '#' takes the parent level
    ("/other/x", "mqtt", "other"),
    ("x y/z", "mqtt", "other"),                        # a first level no metaq topic can be
    ("caf\u00e9/x", "mqtt", "other"),
    ("a//b", "a", "a"),                                # empty levels below the first
    ("%MQTT%/x", "%MQTT%", "%MQTT%"),                 # the broker's own: the write decision refuses it
    ("sensors/alarm/x", "sensors", "alarms"),          # the first rule that matches wins
    ("sensors/secret/x", "sensors", "secret"),
    ("/", "mqtt", "other"),
    ("a" * 250 + "/x", "mqtt", "other"),               # longer than a metaq topic name
])
def test_a_names_topic_is_the_first_matching_rule_else_its_first_level_else_the_fallback(name, default, ruled):
    assert DEFAULT_MAP.topic_of(name) == default
    assert DEVICES.topic_of(name) == ruled
    assert DEVICES.place(name)[0] == ruled


def test_names_beginning_with_dollar_are_the_brokers():
    for m in (DEFAULT_MAP, DEVICES):
        with pytest.raises(ValueError, match="broker's"):
            m.topic_of("$SYS/uptime")
        assert m.topics_for("$SYS/#") == ((), False)


# a small universe of names: every overlap and cover is checked against the definition (some name matched by both)
_LEVELS = ("", "a", "b", "$x")
_NAMES = ["/".join(p) for n in (1, 2, 3) for p in itertools.product(_LEVELS, repeat=n)]
_FILTERS = ["/".join(p) for n in (1, 2, 3) for p in itertools.product(("", "a", "+", "#", "$x"), repeat=n)
            if "#" not in p[:-1]]


def test_overlaps_agrees_with_matching_on_every_name():
    assert len(_FILTERS) > 100
    for a in _FILTERS:
        ma = {n for n in _NAMES if matches(a, n)}
        for b in _FILTERS:
            mb = {n for n in _NAMES if matches(b, n)}
            assert overlaps(a, b) == bool(ma & mb), (a, b)


@pytest.mark.parametrize("topic_filter, topics, every", [
    ("sensors/#", ("alarms", "secret", "sensors"), False),   # overlapping rules, then the first level
    ("sensors/room1/temp", ("sensors",), False),
    ("sensors/secret/#", ("secret", "sensors"), False),      # the first level too: what was stored before the rule
    ("/devices/+/up", ("devices", "other"), False),          # the fallback: an empty first level is no topic name
    ("/+/1/up", ("devices", "alarms", "other"), False),
    ("x y/#", ("alarms", "other"), False),
    ("+/+/up", ("devices", "alarms", "secret"), True),       # a wildcard first level: every readable topic too
    ("#", ("devices", "alarms", "secret"), True),
    ("$SYS/#", (), False),
])
def test_a_filters_topics_are_the_overlapping_rules_then_the_default(topic_filter, topics, every):
    assert DEVICES.topics_for(topic_filter) == (topics, every)


def test_every_name_a_filter_matches_lives_in_one_of_its_topics():
    for f in _FILTERS:
        topics, every = DEVICES.topics_for(f)
        for name in _NAMES:
            if matches(f, name) and not name.startswith("$"):
                assert every or DEVICES.topic_of(name) in topics, (f, name)


def test_a_record_holds_its_name_in_the_maps_topic_or_the_default_rules():
    assert DEVICES.holds("devices", "/devices/1")
    assert DEVICES.holds("other", "/devices/1")  # where the default rule put it
    assert DEVICES.holds("sensors", "sensors/secret/x") and DEVICES.holds("secret", "sensors/secret/x")
    assert not DEVICES.holds("alarms", "/devices/1")
    assert not DEVICES.holds("sensors", "$SYS/x") and not DEVICES.holds("sensors", "sensors/+")


@pytest.mark.parametrize("rules, fallback, why", [
    ([{"filter": "a/#/b", "topic": "x"}], "mqtt", "'#' must be a whole level"),
    ([{"filter": "", "topic": "x"}], "mqtt", "at least one character"),
    ([{"filter": "$SYS/#", "topic": "x"}], "mqtt", "the broker's"),
    ([{"filter": "a/#", "topic": "a b"}], "mqtt", "illegal topic name"),
    ([{"filter": "a/#", "topic": "%MQTT%"}], "mqtt", "the broker's own topics"),
    ([{"filter": "a/#"}], "mqtt", "is not {filter"),
    ([], "no way", "mqtt.fallback_topic"),
    ([], "%TIMER%", "the broker's own topics"),
])
def test_a_rule_or_fallback_that_cannot_be_used_is_refused_at_the_start(rules, fallback, why):
    with pytest.raises(TopicMapError, match=why):
        TopicMap(rules, fallback)


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_mqtt_topic_map_holds_at_most_mqtt_max_topic_rules(extra):
    rules = [{"filter": "r%d/#" % k, "topic": "t%d" % k} for k in range(MQTT_MAX_TOPIC_RULES + extra)]
    if extra:
        with pytest.raises(TopicMapError, match="past the limit of %d" % MQTT_MAX_TOPIC_RULES):
            TopicMap(rules)
    else:
        assert TopicMap(rules).topic_of("r%d/x" % (MQTT_MAX_TOPIC_RULES - 1)) == "t%d" % (MQTT_MAX_TOPIC_RULES - 1)


def test_the_broker_refuses_a_bad_rule_in_its_settings_with_the_rule_named():
    from metaq.server.config import MqttSection
    with pytest.raises(ValueError, match="mqtt.topic_map rule 2: filter 'a/#/b'"):
        MqttSection(topic_map=[{"filter": "ok/#", "topic": "ok"}, {"filter": "a/#/b", "topic": "x"}])
    assert MqttSection(topic_map=[{"filter": "/d/#", "topic": "d"}]).topics().topic_of("/d/1") == "d"


def test_a_bad_fallback_in_the_settings_is_refused_with_the_port_off_and_the_default_is_the_maps_own():
    from metaq.server.config import MqttSection
    with pytest.raises(ValueError, match="mqtt.fallback_topic"):
        MqttSection(fallback_topic="no way")
    with pytest.raises(ValueError, match="mqtt.topic_map rule 1"):
        MqttSection(fallback_topic="mqtt", topic_map=[{"filter": "a/#/b", "topic": "x"}])
    assert MqttSection().fallback_topic == DEFAULT_FALLBACK


def test_the_docs_example_maps_each_name_as_its_comment_says():
    """docs/mqtt.md "Topics": the example's rules, loaded as the broker loads them, give each name the topic its
    comment names (``# <name>, <name> -> <topic>``)."""
    import pathlib
    import re

    import yaml

    from metaq.server.config import MqttSection
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "mqtt.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "topic_map" in b]
    topics = MqttSection(**yaml.safe_load(block)["mqtt"]).topics()
    claims = re.findall(r"#\s+(.+?)\s+->\s+(\S+)", block)
    assert len(claims) == 5
    for names, topic in claims:
        for name in names.split(", "):
            assert topics.topic_of(name) == topic, name
