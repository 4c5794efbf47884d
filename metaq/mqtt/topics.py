"""MQTT topic names and topic filters: their validation and the match of a filter against a name (MQTT 3.1.1 §4.7,
MQTT 5.0 §4.7, §4.8.2), pure.

A topic name is what a PUBLISH carries: at least one character, levels separated by ``/`` (empty levels are
levels: ``/a`` and ``a//b`` are valid names), no wildcard (``+``, ``#``) and no U+0000 anywhere. A topic filter is
what a SUBSCRIBE carries: the same, plus ``+`` (exactly one level, empty ones included) standing alone as a level and
``#`` (this level and every one below, the parent level itself included: ``a/#`` matches ``a``) standing alone as
the last level. A filter that starts with a wildcard never matches a name that starts with ``$`` (``$SYS/x`` is
matched by ``$SYS/#``, not by ``#`` nor ``+/x``). Matching is byte-for-byte on the characters: no case folding, no
normalisation.

A shared subscription (MQTT 5.0 §4.8.2) is ``$share/<ShareName>/<filter>``: the share name is at least one
character with no ``/``, ``+`` or ``#``, and the filter after it is a valid filter (at least one character).
``split_shared`` reads one; matching is done on the filter it returns.

Bounds (``metaq.mqtt.limits``): ``MQTT_MAX_TOPIC_BYTES`` (UTF-8 bytes) and ``MQTT_MAX_TOPIC_LEVELS`` apply to names and
to whole filters (a shared filter's ``$share/<group>/`` prefix included). Each refusal raises ``TopicError`` with
the reason; the codec (``metaq.mqtt.wire``) turns it into the MQTT 5 reason code a server answers with.
"""

from metaq.mqtt.limits import MQTT_MAX_TOPIC_BYTES, MQTT_MAX_TOPIC_LEVELS

__all__ = ["SHARE_PREFIX", "TopicError", "validate_name", "validate_filter", "split_shared", "matches",
           "has_wildcard"]

#: The first level of a shared subscription's filter (MQTT 5.0 §4.8.2).
SHARE_PREFIX = "$share/"


class TopicError(ValueError):
    """A topic name or filter that breaks the specification's rules or our limits; the text says which."""


def _check_size(text, what, max_bytes, max_levels):
    if not text:
        raise TopicError("a %s must be at least one character long" % what)
    if "\x00" in text:
        raise TopicError("a %s must not contain U+0000" % what)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TopicError("a %s of %d bytes is past the limit of %d bytes" % (what, size, max_bytes))
    levels = text.count("/") + 1
    if levels > max_levels:
        raise TopicError("a %s of %d levels is past the limit of %d levels" % (what, levels, max_levels))


def has_wildcard(text):
    """True if ``text`` holds ``+`` or ``#`` (what a topic name may not)."""
    return "+" in text or "#" in text


def validate_name(name, max_bytes=MQTT_MAX_TOPIC_BYTES, max_levels=MQTT_MAX_TOPIC_LEVELS):
    """Raise ``TopicError`` unless ``name`` is a valid topic name (a PUBLISH's, a will's, a Response Topic)."""
    _check_size(name, "topic name", max_bytes, max_levels)
    if has_wildcard(name):
        raise TopicError("a topic name must not contain the wildcards '+' or '#': %r" % name)


def _check_filter_levels(levels):
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise TopicError("'#' must be a whole level and the last one")
        if "+" in level and level != "+":
            raise TopicError("'+' must be a whole level")


def split_shared(topic_filter):
    """``(share name, filter)`` for a ``$share/<ShareName>/<filter>``, ``(None, topic_filter)`` for any other filter.

    Raises ``TopicError`` for a ``$share`` filter without a valid share name or a filter after it (``$share/g``,
    ``$share//a``, ``$share/g+/a``, ``$share/g/``); the returned filter is not validated further here.
    """
    if topic_filter == "$share" or not topic_filter.startswith("$share/"):
        if topic_filter == "$share":
            raise TopicError("a shared subscription needs a share name and a filter: $share/<ShareName>/<filter>")
        return None, topic_filter
    rest = topic_filter[len(SHARE_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not sep:
        raise TopicError("a shared subscription needs a filter after its share name: $share/<ShareName>/<filter>")
    if not group:
        raise TopicError("a shared subscription's share name must be at least one character long")
    if has_wildcard(group):
        raise TopicError("a share name must not contain '+' or '#'")
    if not inner:
        raise TopicError("a shared subscription's filter must be at least one character long")
    return group, inner


def validate_filter(topic_filter, shared=True, max_bytes=MQTT_MAX_TOPIC_BYTES, max_levels=MQTT_MAX_TOPIC_LEVELS):
    """Raise ``TopicError`` unless ``topic_filter`` is a valid topic filter; return ``(share name or None,
    filter)``. With ``shared`` (MQTT 5), ``$share/<ShareName>/<filter>`` is read as a shared subscription and its
    parts checked; without it (MQTT 3.1.1, which has none) ``$share`` is an ordinary level."""
    _check_size(topic_filter, "topic filter", max_bytes, max_levels)
    group, inner = split_shared(topic_filter) if shared else (None, topic_filter)
    _check_filter_levels(inner.split("/"))
    return group, inner


def matches(topic_filter, name):
    """True if the (valid, non-shared) ``topic_filter`` matches the (valid) topic ``name``, as MQTT §4.7 says.

    Pass a shared subscription's inner filter (``split_shared``). Names starting with ``$`` are not matched by a
    filter that starts with a wildcard.
    """
    if name.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    flevels = topic_filter.split("/")
    nlevels = name.split("/")
    for i, level in enumerate(flevels):
        if level == "#":
            return True  # this level and everything below, the parent itself included (a/# matches a)
        if i >= len(nlevels):
            return False
        if level != "+" and level != nlevels[i]:
            return False
    return len(flevels) == len(nlevels)


class OutboundAliases:
    """The Topic Aliases (MQTT 5.0 §3.3.2.3.4) the broker sends one connection, pure: ``most`` of them at most (the
    client's Topic Alias Maximum and ``mqtt.max_outbound_aliases``, the smaller; 0 is never made: no table at all).

    The policy, one decision (``choose``): while an alias is free, a topic name is given one at its first delivery on
    the connection (a free alias costs nothing; clients and Paho's interoperability suite expect it); the PUBLISH
    that sets it carries the name and the alias, those after it the alias and an empty name. When every alias is
    taken, a name gets one at its second delivery at the soonest: the least recently used alias goes to the name,
    its PUBLISH carrying the name again, only if that alias was not used since the name's previous delivery: a name
    busier than the least busy alias takes it, while names delivered in turn, more of them than aliases, leave the
    aliases where they are (instead of moving each one on before it is used). Names delivered without an alias are
    remembered, ``remember`` at most (the one seen longest ago forgotten first: the broker's
    ``mqtt.max_outbound_aliases``, so that a client allowing few aliases still has its busiest names found among
    many), so what one connection remembers is bounded, whatever it is sent.

    A decision is undone when its PUBLISH is not written after all (``mark``, ``undo``: a write that never waits
    found the socket full): the client's aliases and this table must never differ, so each decision is taken in the
    order its PUBLISH is written and undone when that PUBLISH is not."""

    __slots__ = ("most", "remember", "_names", "_seen", "_clock", "_undo")

    def __init__(self, most, remember):
        if not 1 <= most <= remember:
            raise ValueError("a table of %r topic aliases remembering %r names" % (most, remember))
        self.most = most
        self.remember = remember
        self._names = {}  # topic name -> (its alias, the delivery that last used it), least recently used first
        self._seen = {}  # topic names delivered without an alias -> that delivery, oldest first
        self._clock = 0  # deliveries decided
        self._undo = []  # (name, alias, the name it had before or None, that name's entry) since the last settle

    def __len__(self):
        return len(self._names)

    def alias_of(self, name):
        """The alias ``name`` has now, or None."""
        held = self._names.get(name)
        return None if held is None else held[0]

    def choose(self, name):
        """How the next PUBLISH of topic ``name`` goes: ``(alias, True)`` sets the alias (the name goes with it),
        ``(alias, False)`` uses it (an empty name), None sends the name alone."""
        self._clock += 1
        now = self._clock
        names = self._names
        held = names.pop(name, None)
        if held is not None:
            names[name] = (held[0], now)  # the most recently used now
            return held[0], False
        seen = self._seen
        before = seen.pop(name, None)
        old = None
        if len(names) >= self.most:
            if before is not None:
                old = next(iter(names))
                if names[old][1] > before:
                    before = None  # the least recently used alias was used since: it stays
            if before is None:
                seen[name] = now
                if len(seen) > self.remember:
                    del seen[next(iter(seen))]
                return None
        if old is None:
            alias, entry = len(names) + 1, None  # a free one: aliases are only ever reassigned, 1..len are taken
        else:
            entry = names.pop(old)
            alias = entry[0]
        names[name] = (alias, now)
        self._undo.append((name, alias, old, entry))
        return alias, True

    def mark(self):
        """Where ``undo`` goes back to: the decisions taken from now on."""
        return len(self._undo)

    def undo(self, mark):
        """Take back the assignments made since ``mark``, the last first: their PUBLISHes were not written."""
        undo = self._undo
        while len(undo) > mark:
            name, _alias, old, entry = undo.pop()
            del self._names[name]
            if old is not None:
                self._names[old] = entry

    def settle(self):
        """The PUBLISHes decided so far were written (or begun): nothing of them is undone any more."""
        self._undo.clear()

