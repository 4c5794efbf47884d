"""The ``stats`` reply codec, sans-IO: every item's lines formatted and parsed in one place.

A ``stats [item]`` reply body is ``STATS\\r\\n`` + one line per fact, each ended by
``\\r\\n`` + ``END\\r\\n`` (MetaQ's StatsManager; ``config`` alone answers the raw
configuration file, unframed). The items (reference §8.3, docs/text-protocol.md "stats"):

* *(blank)* summary, ``realtime``, ``reset``: ``<key> <value>`` lines (``encode_summary`` /
  ``parse_summary``: a dict of key → value text; a line without a space is a key with an
  empty value). A summary ``replication_slave<N>`` value is one slave's row (``parse_replica``).
* ``topics``: ``TopicRow`` per topic (``<topic> *Empty*`` when it holds no data).
* ``offsets``: ``OffsetRow`` per partition.
* ``groups``: ``GroupRow`` per position a consumer group of any protocol holds in the broker (committed offsets,
  POP groups, MQTT shared groups and persistent sessions; ``kind`` says which; the name percent-encoded where it
  holds a space, ``%``, a control or a byte past ASCII: ``quote_name``), at most ``limits.MAX_GROUP_LAG_ROWS`` of
  them in ``limits.MAX_GROUP_LAG_BYTES``, the most behind; a last ``left_out <n>`` line says how many more there
  were (``parse_groups_page``).
* ``transactions``: ``TransactionRow`` per transaction the broker holds.
* ``quotas``: ``QuotaRow`` per user and quota: what the user holds, its quota (admins only).
* ``delay``: ``DelayLevelRow`` per level, then ``<key> <n>`` totals.
* ``<topic>``: ``TopicFigures`` (the topic's name alone on the first line, then pairs).
* ``help``: free text lines.

Tables are written and read through one template per row (``{field}`` a token,
``{field:d}`` an integer, ``{field:d-}`` an integer or ``-`` for None, other words
literal), so the two directions cannot drift. A malformed body or line raises
``RemoteProtocolError`` naming the item and the line, never an IndexError.
"""

import re
from typing import NamedTuple, Optional
from urllib.parse import quote, unquote

from metaq.errors import RemoteProtocolError
from metaq.protocol.integers import is_integer

__all__ = [
    "HEAD", "TAIL", "REALTIME", "encode", "lines", "parse", "parse_pairs",
    "format_value", "format_pairs", "encode_summary", "parse_summary", "parse_replica", "format_replica",
    "format_realtime", "parse_realtime_value", "parse_realtime", "encode_realtime",
    "TopicRow", "OffsetRow", "GroupRow", "TransactionRow", "QuotaRow", "encode_quotas", "parse_quotas",
    "DelayLevelRow", "ReplicaRow", "Realtime",
    "TopicFigures", "encode_topics", "parse_topics", "encode_offsets", "parse_offsets", "encode_groups",
    "parse_groups", "parse_groups_page", "group_line", "quote_name",
    "encode_transactions", "parse_transactions", "encode_delay", "parse_delay",
    "encode_topic", "parse_topic",
]

HEAD = "STATS"
TAIL = "END"
#: The realtime counters, in their order on the wire (``realtime_<name>``, ``topic_realtime_<name>``).
REALTIME = ("put", "get", "offset", "get_miss", "put_failed", "message_size")
#: Decimals of the float summary values; any other float is written with 3.
DECIMALS = {"disk_usage": 4}
_SHOWN_CHARS = 120


def _bad(what, line):
    text = line if len(line) <= _SHOWN_CHARS else line[:_SHOWN_CHARS] + "..."
    return RemoteProtocolError("malformed stats reply: %s: %r" % (what, text))


def _integer(text, what, line):
    """``text`` as an int (``integers.is_integer``), else the reply's RemoteProtocolError naming ``what``."""
    if not is_integer(text):
        raise _bad("%s is not an integer" % what, line)
    return int(text)


# -- the frame ---------------------------------------------------------------------------------


def encode(body_lines):
    """``STATS\\r\\n`` + each line + ``\\r\\n`` + ``END\\r\\n``, UTF-8."""
    out = [HEAD + "\r\n"]
    out.extend(line + "\r\n" for line in body_lines)
    out.append(TAIL + "\r\n")
    return "".join(out).encode("utf-8")


def lines(body):
    """The lines of a ``stats`` reply body without the frame; RemoteProtocolError when the frame is missing."""
    text = bytes(body).decode("utf-8", "replace")
    if not text.startswith(HEAD + "\r\n") or not text.endswith(TAIL + "\r\n"):
        raise _bad("not framed by %s and %s" % (HEAD, TAIL), text)
    return [line for line in text[len(HEAD) + 2: -len(TAIL) - 2].split("\r\n") if line]


def parse_pairs(body_lines):
    """``{key: value}`` of ``key value`` lines, split at each line's first space (no space: an empty value)."""
    return dict(line.split(" ", 1) if " " in line else (line, "") for line in body_lines)


# -- key value lines (summary, realtime, reset) ----------------------------------------------------


def format_value(key, value):
    """A summary value as text: booleans ``true``/``false``, integers, floats with ``DECIMALS``, text as is."""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return "%d" % value
    if isinstance(value, float):
        return "%.*f" % (DECIMALS.get(key, 3), value)
    return str(value)


def format_pairs(pairs):
    """``<key> <value>`` lines of ``(key, value)`` pairs, in their order."""
    return ["%s %s" % (key, format_value(key, value)) for key, value in pairs]


def encode_summary(pairs):
    return encode(format_pairs(pairs))


def parse_summary(body):
    """``{key: value text}`` of the summary (or any ``key value`` item)."""
    return parse_pairs(lines(body))


# -- table rows --------------------------------------------------------------------------------


#: Bytes a name keeps as they are in a ``{field:q}`` word: printable ASCII but ``%`` (the others percent-encoded).
_NAME_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def quote_name(name):
    """``name`` as one word of a line: its UTF-8 bytes that are a space, ``%``, a control or not ASCII
    percent-encoded (an MQTT client id or shared filter may hold any of them; a group name of the legal alphabet is
    unchanged)."""
    return quote(name, safe=_NAME_SAFE)


class _Template:
    """One row's line: fields and literal words separated by single spaces."""

    def __init__(self, item, row_type, text):
        self.item, self.row_type, self.text = item, row_type, text
        self.parts = []
        for word in text.split(" "):
            m = re.fullmatch(r"\{(\w+)(?::(d-?|q))?\}", word)
            self.parts.append((m.group(1), m.group(2) or "s") if m else (None, word))
        assert [name for name, _ in self.parts if name] == list(row_type._fields), text

    def format(self, row):
        words = []
        for name, kind in self.parts:
            if name is None:
                words.append(kind)
                continue
            value = getattr(row, name)
            if kind == "s":
                words.append(str(value))
            elif kind == "q":
                words.append(quote_name(value))
            elif kind == "d-" and value is None:
                words.append("-")
            else:
                words.append("%d" % value)
        return " ".join(words)

    def parse(self, line):
        words = line.split(" ")
        if len(words) != len(self.parts):
            raise _bad("a %s line has %d words, not %d (%s)" % (self.item, len(words), len(self.parts), self.text),
                       line)
        values = []
        for word, (name, kind) in zip(words, self.parts, strict=True):
            if name is None:
                if word != kind:
                    raise _bad("a %s line has %r where %r belongs" % (self.item, word, kind), line)
            elif kind == "s":
                values.append(word)
            elif kind == "q":
                values.append(unquote(word, errors="replace"))
            elif kind == "d-" and word == "-":
                values.append(None)
            else:
                values.append(_integer(word, "%s %s" % (self.item, name), line))
        return self.row_type(*values)


class TopicRow(NamedTuple):
    """``stats topics``: partitions None = the topic holds no data yet (``<topic> *Empty*``)."""

    topic: str
    partitions: Optional[int]
    message_count: int = 0
    message_bytes: int = 0


class OffsetRow(NamedTuple):
    topic: str
    partition: int
    min_offset: int
    max_offset: int


class GroupRow(NamedTuple):
    """``stats groups``: where a consumer group of ``kind`` (``metaq.groups.lag.KINDS``) is in a partition:
    ``offset`` its position (the first offset it has not consumed), ``max_offset`` the partition's end, ``lag`` the
    messages it has still to consume (``metaq.groups.lag.lag``), ``committed_ms`` when it last moved (None: not
    kept), ``in_flight`` the messages handed out and not yet acknowledged (None: the kind has none). A line of a
    broker before kinds (seven fields) is a committed offset's."""

    group: str
    topic: str
    partition: int
    offset: int
    max_offset: int
    lag: int
    committed_ms: Optional[int]
    kind: str = "offsets"
    in_flight: Optional[int] = None


class PopRow(NamedTuple):
    """``stats pop``: per group and topic, messages handed out and not acknowledged, redeliveries, dead letters
    (docs/messaging.md "Per-message acknowledgement (POP)")."""

    group: str
    topic: str
    in_flight: int
    redelivered: int
    dead_lettered: int


class TransactionRow(NamedTuple):
    """``stats transactions``: prepared_ms None until prepared; begun_ms None for a decision by hand (a
    heuristic outcome outlives its branch); timeout_s 0 = none."""

    key: str
    state: str
    puts: int
    bytes: int
    begun_ms: int
    prepared_ms: Optional[int]
    timeout_s: int


class QuotaRow(NamedTuple):
    """``stats quotas``: user ``-`` is no user (authentication off, or records from before quotas)."""

    user: str
    quota: str
    used: int
    limit: int


class DelayLevelRow(NamedTuple):
    """``stats delay``: delay is the level's text (``5s``, ``removed``); next_due_ms None when nothing is pending."""

    level: int
    delay: str
    pending: int
    next_due_ms: Optional[int]
    delivered: int


class ReplicaRow(NamedTuple):
    """The value of a master's ``replication_slave<N>`` summary line."""

    address: str
    acked: int
    durable: int
    lag_bytes: int


_TOPIC = _Template("topics", TopicRow, "{topic} partitions {partitions:d} message_count {message_count:d} "
                                       "message_bytes {message_bytes:d} accept_publish true accept_subscribe true")
_EMPTY = "*Empty*"
_OFFSET = _Template("offsets", OffsetRow, "{topic} part {partition:d} min_offset {min_offset:d} "
                                          "max_offset {max_offset:d}")
_GROUP = _Template("groups", GroupRow, "{group:q} {topic} {partition:d} offset {offset:d} max_offset {max_offset:d} "
                                       "lag {lag:d} committed_ms {committed_ms:d-} kind {kind} "
                                       "in_flight {in_flight:d-}")
#: Words of a committed offset's line as brokers before kinds wrote it (``_GROUP``'s first eleven).
_OLD_GROUP_WORDS = 11
#: The last line of a ``stats groups`` reply that left rows out (``limits.MAX_GROUP_LAG_ROWS``).
LEFT_OUT = "left_out"
_POP = _Template("pop", PopRow, "{group} {topic} in_flight {in_flight:d} redelivered {redelivered:d} "
                                "dead_lettered {dead_lettered:d}")
_TRANSACTION = _Template("transactions", TransactionRow,
                         "{key} {state} puts {puts:d} bytes {bytes:d} begun_ms {begun_ms:d-} "
                         "prepared_ms {prepared_ms:d-} timeout_s {timeout_s:d}")
_QUOTA = _Template("quotas", QuotaRow, "{user} {quota} used {used:d} limit {limit:d}")
_DELAY_LEVEL = _Template("delay", DelayLevelRow, "level {level:d} delay {delay} pending {pending:d} "
                                                 "next_due_ms {next_due_ms:d-} delivered {delivered:d}")
_REPLICA = _Template("replication_slave", ReplicaRow, "{address} acked {acked:d} durable {durable:d} "
                                                      "lag_bytes {lag_bytes:d}")


def format_replica(row):
    return _REPLICA.format(row)


def parse_replica(value):
    """A ``replication_slave<N>`` summary value as a ``ReplicaRow``."""
    return _REPLICA.parse(value)


def encode_topics(rows):
    return encode(["%s %s" % (r.topic, _EMPTY) if r.partitions is None else _TOPIC.format(r) for r in rows])


def parse_topics(body):
    rows = []
    for line in lines(body):
        words = line.split(" ")
        rows.append(TopicRow(words[0], None) if len(words) == 2 and words[1] == _EMPTY else _TOPIC.parse(line))
    return rows


def encode_offsets(rows):
    return encode([_OFFSET.format(r) for r in rows])


def parse_offsets(body):
    return [_OFFSET.parse(line) for line in lines(body)]


def group_line(row):
    """A ``stats groups`` line of ``row`` (its size bounds a reply: ``metaq.groups.lag.rows``)."""
    return _GROUP.format(row)


def encode_groups(rows, left_out=0):
    """The reply of ``rows``; ``left_out``: rows past the limit not sent (a last ``left_out <n>`` line)."""
    return encode([_GROUP.format(r) for r in rows] + (["%s %d" % (LEFT_OUT, left_out)] if left_out else []))


def parse_groups_page(body):
    """``(rows, left_out)`` of a ``stats groups`` reply: ``left_out`` the rows the broker did not send (0: none)."""
    rows, left_out = [], 0
    for line in lines(body):
        words = line.split(" ")
        if len(words) == 2 and words[0] == LEFT_OUT:
            left_out = _integer(words[1], "groups left_out", line)
        elif len(words) == _OLD_GROUP_WORDS:
            rows.append(_GROUP.parse(line + " kind offsets in_flight -"))
        else:
            rows.append(_GROUP.parse(line))
    return rows, left_out


def parse_groups(body):
    return parse_groups_page(body)[0]


def encode_pop(rows):
    return encode([_POP.format(r) for r in rows])


def parse_pop(body):
    return [_POP.parse(line) for line in lines(body)]


def encode_transactions(rows):
    return encode([_TRANSACTION.format(r) for r in rows])


def parse_transactions(body):
    return [_TRANSACTION.parse(line) for line in lines(body)]


def encode_quotas(rows):
    return encode([_QUOTA.format(r) for r in rows])


def parse_quotas(body):
    return [_QUOTA.parse(line) for line in lines(body)]


def encode_delay(levels, totals):
    """``levels``: DelayLevelRow list; ``totals``: ``(key, n)`` pairs written after them."""
    return encode([_DELAY_LEVEL.format(r) for r in levels] + format_pairs(totals))


def parse_delay(body):
    """``([DelayLevelRow], {total key: n})``."""
    levels, totals = [], {}
    for line in lines(body):
        if line.startswith("level "):
            levels.append(_DELAY_LEVEL.parse(line))
            continue
        key, _, value = line.partition(" ")
        totals[key] = _integer(value, "delay %s" % key, line)
    return levels, totals


# -- realtime counters ----------------------------------------------------------------------------


class Realtime(NamedTuple):
    """One realtime counter (MetaQ's MetaStatLog): avg and rate as written (``invalid`` rate at duration 0)."""

    count: int
    value: int
    average: str
    rate: str
    duration_s: int


_REALTIME = re.compile(r"Count=(-?\d+),Value=(-?\d+),Value/Count=([^,]+),Count/Duration=([^,]+),Duration=(-?\d+)\Z")


def format_realtime(count, value, duration_s):
    """A realtime counter's value: ``null`` when nothing was counted."""
    if not count:
        return "null"
    avg = "%.2f" % (value / count)
    rate = "%.2f" % (count / duration_s) if duration_s > 0 else "invalid"
    return "Count=%d,Value=%d,Value/Count=%s,Count/Duration=%s,Duration=%d" % (count, value, avg, rate,
                                                                               int(duration_s))


def parse_realtime_value(text):
    """A ``Realtime``, or None for ``null``."""
    if text == "null":
        return None
    m = _REALTIME.match(text)
    if m is None:
        raise _bad("a realtime value is not Count=..,Value=..,Value/Count=..,Count/Duration=..,Duration=..", text)
    return Realtime(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), int(m.group(5)))


def encode_realtime(values):
    """``values``: ``{name: value text}`` (``format_realtime``) for each of ``REALTIME``."""
    return encode(["realtime_%s %s" % (name, values[name]) for name in REALTIME])


def parse_realtime(body):
    """``{name: Realtime or None}`` of ``stats realtime``."""
    pairs = parse_pairs(lines(body))
    return {name: parse_realtime_value(_need(pairs, "realtime_" + name, "realtime")) for name in REALTIME}


def _need(pairs, key, item):
    if key not in pairs:
        raise RemoteProtocolError("malformed stats reply: %s has no %s line" % (item, key))
    return pairs[key]


# -- one topic ---------------------------------------------------------------------------------


class TopicFigures(NamedTuple):
    """``stats <topic>``: result_code 0 = has data, 1 = unknown topic, 2 = configured but empty.

    ``realtime`` maps each of ``REALTIME`` to its value text (``format_realtime``) when
    encoding, to a ``Realtime`` or None when parsed.
    """

    topic: str
    result_code: int
    partitions: int
    message_count: int
    bytes: int
    realtime: dict


_TOPIC_KEYS = (("resultCode", "result_code"), ("partitions", "partitions"), ("message_count", "message_count"),
               ("bytes", "bytes"))


def encode_topic(figures):
    out = [figures.topic] + ["%s %d" % (key, getattr(figures, field)) for key, field in _TOPIC_KEYS]
    out += ["topic_realtime_%s %s" % (name, figures.realtime[name]) for name in REALTIME]
    return encode(out)


def parse_topic(body):
    body_lines = lines(body)
    if not body_lines or " " in body_lines[0]:
        raise _bad("a topic's figures start with the topic's name alone", body_lines[0] if body_lines else "")
    item = "stats " + body_lines[0]
    pairs = parse_pairs(body_lines[1:])
    values = {}
    for key, field in _TOPIC_KEYS:
        text = _need(pairs, key, item)
        values[field] = _integer(text, key, "%s %s" % (key, text))
    rt = {name: parse_realtime_value(_need(pairs, "topic_realtime_" + name, item)) for name in REALTIME}
    return TopicFigures(body_lines[0], realtime=rt, **values)


_PARSERS = {
    "": parse_summary, "topics": parse_topics, "offsets": parse_offsets, "groups": parse_groups, "pop": parse_pop,
    "transactions": parse_transactions, "quotas": parse_quotas, "delay": parse_delay, "realtime": parse_realtime,
    "reset": parse_summary, "help": lines,
}


def parse(item, body):
    """The typed result of ``stats <item>`` (None or "" = the summary; any other word = one topic).

    ``config`` answers the raw configuration file: its body is returned as it is.
    """
    item = (item or "").strip()
    if item == "config":
        return bytes(body)
    return _PARSERS.get(item, parse_topic)(body)
