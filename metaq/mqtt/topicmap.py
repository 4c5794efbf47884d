"""Which metaq topic holds the messages of an MQTT topic name, and which metaq topics a filter reads (docs/mqtt.md
"Topics"), decided here and nowhere else; pure.

**A name's topic** (``TopicMap.topic_of``): the first rule of ``mqtt.topic_map`` whose filter matches the whole name
gives it; with none, the name's first level when that is a legal metaq topic name (``sensors`` for
``sensors/room1/temp``: the rule of earlier releases, so a data directory written before keeps its topics), else
``mqtt.fallback_topic``. So every legal MQTT name (any UTF-8 without wildcards or U+0000, empty
levels included) has a topic, except those beginning with ``$``, which are the broker's (MQTT 5.0 §4.7.2): a client
may not publish to one. The whole name stays in the record (``records.TOPIC``) and every match is on the whole name,
so names that differ only in bytes a metaq topic cannot hold are never mixed up.

**A filter's topics** (``TopicMap.topics_for``): each rule whose filter can match a name the subscription's filter
matches (``overlaps``), in order; then the default rule's: the first level when it is a literal legal metaq topic
name, the fallback when it is a literal that is not, every topic the user may read when it is a wildcard (the
caller's list, bounded by ``mqtt.max_wildcard_topics``). The default's topic is read even where a rule takes every
name the filter matches: what was stored before the rule (a data directory of an earlier release) is found there. A
filter beginning with ``$`` reads no topic.

**Which records a topic holds** (``TopicMap.holds``): a record of a metaq topic is read as the MQTT message its
``MQTT_TOPIC`` names only when the map (or the default rule, for records written under other rules) puts that name
in that topic: a producer of another topic cannot make a message appear under a name it may not publish to.
"""

import functools
import zlib
from typing import NamedTuple

from metaq.errors import InvalidTopic
from metaq.limits import validate_topic
from metaq.mqtt.limits import MQTT_FALLBACK_TOPIC, MQTT_KEPT_NAME, MQTT_MAX_TOPIC_RULES, MQTT_PLACED_NAMES
from metaq.mqtt.topics import TopicError, has_wildcard, matches, validate_filter
from metaq.topics.names import is_internal

__all__ = ["DEFAULT_FALLBACK", "TopicRule", "TopicMapError", "TopicMap", "overlaps", "default_topic",
           "broker_name", "DEFAULT_MAP"]

#: The metaq topic of names whose first level is no legal metaq topic name (``mqtt.fallback_topic``'s default).
DEFAULT_FALLBACK = MQTT_FALLBACK_TOPIC


class TopicMapError(ValueError):
    """A ``mqtt.topic_map`` rule or ``mqtt.fallback_topic`` that cannot be used; the text says which and why."""


class TopicRule(NamedTuple):
    """One rule: MQTT names ``topic_filter`` matches are stored in metaq topic ``topic``."""

    topic_filter: str
    topic: str


def broker_name(text):
    """True for a name or filter beginning with ``$``: the broker's (``$SYS/...``), never a client's to publish."""
    return text.startswith("$")


def _legal_topic(name):
    """``name`` if it is a legal metaq topic name, else None."""
    try:
        return validate_topic(name)
    except InvalidTopic:
        return None


def default_topic(name, fallback=DEFAULT_FALLBACK):
    """The default rule's topic for MQTT name ``name`` (no ``mqtt.topic_map`` rule matched): its first level when that
    is a legal metaq topic name, else ``fallback``. A first level that names one of the broker's own topics
    (``%TIMER%/x``) is that topic, as before: the write decision refuses it with its words, as on every port."""
    return _legal_topic(name.split("/", 1)[0]) or fallback


def _levels(text):
    return text.split("/")


def overlaps(a, b):
    """True when some topic name is matched by both (valid, non-shared) filters ``a`` and ``b`` (MQTT §4.7)."""
    if a[:1] in ("+", "#") and broker_name(b) or b[:1] in ("+", "#") and broker_name(a):
        return False  # a filter starting with a wildcard never matches a '$' name
    la, lb = _levels(a), _levels(b)
    for i in range(max(len(la), len(lb))):
        x = la[i] if i < len(la) else None
        y = lb[i] if i < len(lb) else None
        if x == "#" or y == "#":
            return True  # '#' takes this level, everything below and the parent itself
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


def _rules(entries):
    """``mqtt.topic_map``'s entries (mappings with ``filter`` and ``topic``, or ``TopicRule``'s) as ``TopicRule``'s,
    each checked; TopicMapError names the first that cannot be used."""
    entries = list(entries or ())
    if len(entries) > MQTT_MAX_TOPIC_RULES:
        raise TopicMapError("mqtt.topic_map has %d rules, past the limit of %d" % (len(entries), MQTT_MAX_TOPIC_RULES))
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, TopicRule):
            topic_filter, topic = entry
        elif isinstance(entry, dict) and set(entry) == {"filter", "topic"}:
            topic_filter, topic = entry["filter"], entry["topic"]
        else:
            raise TopicMapError("mqtt.topic_map rule %d: %r is not {filter: <MQTT topic filter>, topic: <metaq topic>}"
                                % (i + 1, entry))
        if not isinstance(topic_filter, str) or not isinstance(topic, str):
            raise TopicMapError("mqtt.topic_map rule %d: filter and topic must be text" % (i + 1))
        try:
            validate_filter(topic_filter, shared=False)
        except TopicError as exc:
            raise TopicMapError("mqtt.topic_map rule %d: filter %r: %s" % (i + 1, topic_filter, exc)) from None
        if broker_name(topic_filter):
            raise TopicMapError("mqtt.topic_map rule %d: filter %r: names beginning with '$' are the broker's"
                                % (i + 1, topic_filter))
        out.append(TopicRule(topic_filter, _checked_topic(topic, "mqtt.topic_map rule %d: topic" % (i + 1))))
    return tuple(out)


def _checked_topic(topic, what):
    try:
        validate_topic(topic)
    except InvalidTopic as exc:
        raise TopicMapError("%s %r: %s" % (what, topic, exc)) from None
    if is_internal(topic):
        raise TopicMapError("%s %r: the name of one of the broker's own topics" % (what, topic))
    return topic


class TopicMap:
    """The broker's mapping (see the module doc): ``rules`` (``mqtt.topic_map``, first match wins) and ``fallback``
    (``mqtt.fallback_topic``). Raises TopicMapError for a rule or fallback that cannot be used."""

    def __init__(self, rules=(), fallback=DEFAULT_FALLBACK):
        self.rules = _rules(rules)
        self.fallback = _checked_topic(fallback, "mqtt.fallback_topic")
        self._placed = functools.lru_cache(maxsize=MQTT_PLACED_NAMES)(self._place)

    def topic_of(self, name):
        """The metaq topic of (valid) MQTT topic name ``name``; ValueError for a name beginning with ``$``."""
        if broker_name(name):
            raise ValueError("topic names beginning with '$' are the broker's: a client may not publish to %r" % name)
        for rule in self.rules:
            if matches(rule.topic_filter, name):
                return rule.topic
        return default_topic(name, self.fallback)

    def place(self, name):
        """``(metaq topic, CRC-32 of the name's UTF-8 bytes)`` (``records.placement``), remembered per name for the
        last ``MQTT_PLACED_NAMES`` names of at most ``MQTT_KEPT_NAME`` characters (a longer one is placed each time)."""
        return self._placed(name) if len(name) <= MQTT_KEPT_NAME else self._place(name)

    def _place(self, name):
        return self.topic_of(name), zlib.crc32(name.encode("utf-8", "surrogatepass"))

    def topics_for(self, topic_filter):
        """``(topics, every)``: the metaq topics that can hold names the (valid, non-shared) ``topic_filter`` matches,
        in order, and whether every topic the subscriber may read is to be added (a wildcard first level)."""
        if broker_name(topic_filter):
            return (), False
        out = []
        for rule in self.rules:
            if overlaps(rule.topic_filter, topic_filter):
                if rule.topic not in out:
                    out.append(rule.topic)
        first = topic_filter.split("/", 1)[0]
        if first in ("+", "#"):
            return tuple(out), True
        topic = default_topic(first, self.fallback)
        if topic not in out:
            out.append(topic)
        return tuple(out), False

    def holds(self, metaq_topic, name):
        """True when a record of ``metaq_topic`` whose ``MQTT_TOPIC`` is ``name`` is that name's message: this map or
        the default rule (a record written under other rules, or before them) puts the name there."""
        if broker_name(name) or not name or has_wildcard(name) or "\x00" in name:
            return False
        return self.place(name)[0] == metaq_topic or default_topic(name, self.fallback) == metaq_topic


#: The map of a broker with no ``mqtt.topic_map`` rules and the default fallback.
DEFAULT_MAP = TopicMap()
