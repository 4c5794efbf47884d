"""The topic table: topics created, altered and deleted by an operator, kept in ``<data_dir>/topics.json``.

Pure logic and the file; ``state.TopicOps`` (``MessageStore.topics``) applies it to the store and
``service.TopicAdmin`` is the protocol-neutral entry point. docs/concepts.md "Topics: the table, create, alter, delete".

Which partition count a topic has, first match wins:

1. the table's entry for the exact name (``metaq-admin topics create|alter``); a deleted name (a tombstone in
   the table) is no topic at all until it is created again: puts and gets answer "no such topic";
2. the configuration file's entry for the exact name;
3. the partitions the data directory holds (``index/<topic>/<n>``), when more than the pattern below gives:
   a broker started without its configuration file keeps serving what it stored, and says so;
4. the first configuration pattern (``*`` wildcards) that matches: it creates the topic on its first put.

Per topic (table entries only): ``perm`` (``rw``, ``r``: puts refused, ``w``: reads refused, ``-``: both),
``ordered`` (reported to RocketMQ clients as an orderly topic; a keyed producer keeps a key on one partition),
``retention_hours`` and ``retention_bytes`` (retention.py), ``priorities`` (0: none; 2..
``limits.MAX_PRIORITY_LEVELS`` levels, docs/messaging.md "Priorities") and ``priority_max_wait_ms`` (its starvation
bound). A level k >= 1 of a priority topic is the internal topic ``<topic>%P<k>`` (``priorities/wire.py``): the catalog
answers for it with its topic's partitions and permissions. ``base_offsets``: where a re-created
topic's partitions start (the offsets of the deleted incarnation are never used again).

File: JSON written through a temp file, fsynced and renamed (``files.write_atomically``), then the directory
fsynced. Every change writes the table before it changes the store, so a crash between the two leaves a table
that says more than the store did; ``MessageStore.open`` finishes the change (creates the partitions a table
entry names, removes the index files of a tombstoned topic).
"""

import json
import math
import os
from dataclasses import dataclass, field

from metaq import limits
from metaq.priorities import limits as priorities_limits
from metaq.topics import limits as topics_limits
from metaq.errors import ClientError, InvalidTopic, StoreError, TopicForbidden, UnknownTopic
from metaq.protocol.journaltopic import SCHEDULE_TOPIC
from metaq.priorities.wire import is_level_topic, level_topic, split_level
from metaq.store.files import fsync_dir, write_atomically

TOPICS_FILE = "topics.json"
TABLE_VERSION = 1
#: perm -> (readable, writable); MetaQ/RocketMQ's read/write permission bits.
PERMS = {"rw": (True, True), "r": (True, False), "w": (False, True), "-": (False, False)}
#: Names no operator may create, alter or delete: the broker's own and RocketMQ's system topics.
SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "RMQ_SYS_")
SETTING_NAMES = ("partitions", "perm", "ordered", "retention_hours", "retention_bytes", "priorities",
                 "priority_max_wait_ms")
#: The largest retention by age, in hours (100 years); the smallest is any positive number (fractions allowed).
MAX_RETENTION_HOURS = 876000.0


@dataclass
class TopicSettings:
    name: str
    partitions: int
    perm: str = "rw"
    ordered: bool = False
    retention_hours: float = None  # None: the broker's store.retention_hours alone
    retention_bytes: int = None  # None: no bound by size
    base_offsets: dict = field(default_factory=dict)  # partition -> first offset (a re-created topic)
    priorities: int = 0  # 0: no priorities; else the number of levels (docs/messaging.md "Priorities")
    priority_max_wait_ms: int = None  # None: limits.DEFAULT_PRIORITY_MAX_WAIT_MS

    @property
    def max_wait_ms(self):
        """The starvation bound a priority topic's gets apply."""
        return self.priority_max_wait_ms or priorities_limits.DEFAULT_PRIORITY_MAX_WAIT_MS

    @property
    def readable(self):
        return PERMS[self.perm][0]

    @property
    def writable(self):
        return PERMS[self.perm][1]

    def to_json(self):
        return {"partitions": self.partitions, "perm": self.perm, "ordered": self.ordered,
                "retention_hours": self.retention_hours, "retention_bytes": self.retention_bytes,
                "priorities": self.priorities, "priority_max_wait_ms": self.priority_max_wait_ms,
                "base_offsets": {str(k): v for k, v in sorted(self.base_offsets.items())}}

    def describe(self):
        """The settings an operator sees (``topics list``, the JSON API)."""
        out = self.to_json()
        del out["base_offsets"]
        out["name"] = self.name
        return out


def check_name(name, what="create"):
    """Raise ClientError/InvalidTopic unless an operator may ``what`` topic ``name``."""
    if isinstance(name, str) and "*" in name:
        raise InvalidTopic("topic %r: patterns belong in the configuration file, not the table" % name)
    limits.validate_topic(name)
    if is_level_topic(name):
        raise ClientError("topic %s is a priority level's internal name (<topic>%%P<level>): it cannot be %sd by "
                          "an operator" % (name, what.rstrip("e")))
    if name == SCHEDULE_TOPIC or name.startswith(SYSTEM_PREFIXES):
        raise ClientError("topic %s is a system topic (delayed delivery, RocketMQ retry/dead-letter or system "
                          "queues): it cannot be %sd by an operator" % (name, what.rstrip("e")))
    return name


def parse_settings(values, base=None):
    """``values``: ``{setting: value}`` (strings from the wire or typed); ``base``: the TopicSettings altered.
    Returns the new TopicSettings; raises ClientError naming the bad setting. Nothing is changed."""
    unknown = sorted(set(values) - set(SETTING_NAMES))
    if unknown:
        raise ClientError("unknown topic setting %s (known: %s)" % (", ".join(unknown), ", ".join(SETTING_NAMES)))
    s = TopicSettings(base.name, base.partitions, base.perm, base.ordered, base.retention_hours,
                      base.retention_bytes, dict(base.base_offsets), base.priorities,
                      base.priority_max_wait_ms) if base else TopicSettings("", 0)
    if "partitions" in values:
        s.partitions = _number(values["partitions"], "partitions", int)
    if "perm" in values:
        s.perm = str(values["perm"])
        if s.perm not in PERMS:
            raise ClientError("perm must be one of rw, r, w, - (read and write, read only, write only, neither); "
                              "got %r" % s.perm)
    if "ordered" in values:
        s.ordered = _flag(values["ordered"])
    _set_retention(s, values)
    _set_priorities(s, values, base)
    if not 1 <= s.partitions <= limits.MAX_PARTITIONS:
        raise ClientError("partitions must be 1..%d (limits.MAX_PARTITIONS), got %r"
                          % (limits.MAX_PARTITIONS, s.partitions))
    return s


def _set_retention(s, values):
    """Sets ``retention_hours`` (above 0, at most ``MAX_RETENTION_HOURS``) and ``retention_bytes`` (at least 1) of
    settings ``s`` from ``values`` where given (``none`` or ``-``: unset)."""
    if "retention_hours" in values:
        s.retention_hours = _optional(values["retention_hours"], "retention_hours", float)
        if s.retention_hours is not None and not (0 < s.retention_hours <= MAX_RETENTION_HOURS):
            raise ClientError("retention_hours must be above 0 and at most %g, got %r"
                              % (MAX_RETENTION_HOURS, s.retention_hours))
    if "retention_bytes" in values:
        s.retention_bytes = _optional(values["retention_bytes"], "retention_bytes", int)
        if s.retention_bytes is not None and s.retention_bytes < 1:
            raise ClientError("retention_bytes must be at least 1, got %r" % s.retention_bytes)


def _set_priorities(s, values, base):
    """Sets ``priorities`` (0, or 2..``MAX_PRIORITY_LEVELS``, never fewer than ``base``'s) and
    ``priority_max_wait_ms`` (1..``MAX_PRIORITY_MAX_WAIT_MS``) of settings ``s`` from ``values`` where given."""
    if "priorities" in values:
        s.priorities = _number(values["priorities"], "priorities", int)
        if base is not None and base.priorities and s.priorities < base.priorities:
            raise ClientError("priorities can only grow (%d now, %d asked): the messages of the levels dropped would "
                              "be stranded" % (base.priorities, s.priorities))
        if s.priorities != 0 and not 2 <= s.priorities <= priorities_limits.MAX_PRIORITY_LEVELS:
            raise ClientError("priorities must be 0 (none) or 2..%d levels (limits.MAX_PRIORITY_LEVELS), got %r"
                              % (priorities_limits.MAX_PRIORITY_LEVELS, s.priorities))
    if "priority_max_wait_ms" in values:
        s.priority_max_wait_ms = _optional(values["priority_max_wait_ms"], "priority_max_wait_ms", int)
        if (s.priority_max_wait_ms is not None
            and not 1 <= s.priority_max_wait_ms <= priorities_limits.MAX_PRIORITY_MAX_WAIT_MS):
            raise ClientError("priority_max_wait_ms must be 1..%d (limits.MAX_PRIORITY_MAX_WAIT_MS), got %r"
                              % (priorities_limits.MAX_PRIORITY_MAX_WAIT_MS, s.priority_max_wait_ms))


def _number(value, name, kind):
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ClientError("%s must be a number, got %r" % (name, value)) from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ClientError("%s must be a finite number, got %r" % (name, value))
    return number


def _optional(value, name, kind):
    return None if value in (None, "", "none", "-") else _number(value, name, kind)


def _flag(value):
    text = str(value).lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ClientError("ordered must be 0 or 1, got %r" % (value,))


class TopicTableFile:
    """The table as it is on disk: ``entries`` (name -> TopicSettings), ``deleted`` (name -> {partition: next
    offset}) and a ``version`` that grows with every change (replication copies the table when it moves)."""

    def __init__(self, root):
        self.root = root
        self.path = os.path.join(root, TOPICS_FILE)
        self.entries = {}
        self.deleted = {}
        self.version = 0

    def load(self):
        try:
            with open(self.path, "rb") as f:
                data = f.read(topics_limits.MAX_TOPIC_TABLE_BYTES + 1)
        except FileNotFoundError:
            return self
        if len(data) > topics_limits.MAX_TOPIC_TABLE_BYTES:
            raise StoreError("%s is larger than %d bytes (limits.MAX_TOPIC_TABLE_BYTES)"
                             % (self.path, topics_limits.MAX_TOPIC_TABLE_BYTES))
        try:
            self.apply_json(json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, KeyError, AttributeError, ClientError) as exc:
            raise StoreError("%s cannot be read: %s; fix or remove it (it holds the topics created with "
                             "metaq-admin topics create)" % (self.path, exc)) from None
        return self

    def apply_json(self, state):
        """Replace the table with ``state`` (the file's JSON, or a master's copy); ClientError/ValueError if bad."""
        if state.get("format") != TABLE_VERSION:
            raise ValueError("unknown table format %r (this broker reads %d)" % (state.get("format"), TABLE_VERSION))
        entries = {}
        for name, raw in state["topics"].items():
            limits.validate_topic(name)
            s = parse_settings({k: raw[k] for k in SETTING_NAMES if k in raw}, TopicSettings(name, 0))
            s.base_offsets = {int(k): int(v) for k, v in raw.get("base_offsets", {}).items()}
            entries[name] = s
        deleted = {}
        for name, offsets in state["deleted"].items():
            limits.validate_topic(name)
            deleted[name] = {int(k): int(v) for k, v in offsets.items()}
        self.entries, self.deleted, self.version = entries, deleted, int(state.get("version", 0))

    def to_json(self):
        return {"format": TABLE_VERSION, "version": self.version,
                "topics": {n: s.to_json() for n, s in sorted(self.entries.items())},
                "deleted": {n: {str(k): v for k, v in sorted(o.items())} for n, o in sorted(self.deleted.items())}}

    def encode(self):
        return json.dumps(self.to_json(), indent=1, sort_keys=True).encode("utf-8") + b"\n"

    def save(self):
        """BLOCKING (an fsync): write the table atomically; the version grows first."""
        self.version += 1
        data = self.encode()
        if len(data) > topics_limits.MAX_TOPIC_TABLE_BYTES:
            self.version -= 1
            raise ClientError("the topic table would pass %d bytes (limits.MAX_TOPIC_TABLE_BYTES)"
                              % topics_limits.MAX_TOPIC_TABLE_BYTES)
        write_atomically(self.path, data)
        fsync_dir(self.root)


class TopicCatalog:
    """Resolves names (the precedence in the module's text) and answers the per-topic checks of the store."""

    def __init__(self, config_table, table_file):
        self.config = config_table  # store.config.TopicTable: the configuration file's names and patterns
        self.table = table_file
        self.from_data_dir = {}  # topic -> partitions found in the data dir past what the config gives

    def partitions_of(self, topic):
        """Partition count of ``topic``; raises InvalidTopic or UnknownTopic."""
        s = self.table.entries.get(topic) or self.level_owner(topic)
        if s is not None:
            return s.partitions
        if topic in self.table.deleted:
            raise UnknownTopic("no such topic %s: it was deleted (metaq-admin topics create makes it again)" % topic)
        count = self.from_data_dir.get(topic)
        if count is not None:
            return count
        return self.config.partitions_of(topic)

    def adopt_data_dir(self, counts):
        """``counts``: topic -> partitions the data dir holds. Keep those the config would drop; returns log lines."""
        lines = []
        for topic, held in sorted(counts.items()):
            if (topic in self.table.entries or topic in self.table.deleted or topic in self.config.exact_names
                    or self.level_owner(topic) is not None):
                continue
            try:
                configured = self.config.partitions_of(topic)
            except UnknownTopic:
                configured = 0
            if held > configured:
                self.from_data_dir[topic] = held
                lines.append("topic %s: %d partitions from the data directory (the configuration gives %s)"
                             % (topic, held, configured or "none: it matches no topics entry"))
        return lines

    def level_owner(self, topic):
        """The settings of the priority topic whose level ``topic`` is (``<t>%P<k>``, k < its levels), or None."""
        if "%P" not in topic:
            return None
        split = split_level(topic)
        if split is None:
            return None
        s = self.table.entries.get(split[0])
        return s if s is not None and split[1] < s.priorities else None

    def with_levels(self):
        """The table's entries plus each priority level's name with its topic's settings (per-topic retention
        applies to every level: each level's partitions are bounded as the topic's are)."""
        out = dict(self.table.entries)
        for name, s in self.table.entries.items():
            out.update((level_topic(name, k), s) for k in range(1, s.priorities))
        return out

    def priority_settings(self, topic):
        """``topic``'s TopicSettings if it has priorities, else None."""
        s = self.table.entries.get(topic)
        return s if s is not None and s.priorities else None

    def check_writable(self, topic):
        s = self.table.entries.get(topic) or self.level_owner(topic)
        if s is not None and not s.writable:
            raise TopicForbidden("topic %s is not writable (perm %s): puts are refused" % (topic, s.perm))
        if topic in self.table.deleted and s is None:
            raise UnknownTopic("no such topic %s: it was deleted" % topic)

    def check_readable(self, topic):
        s = self.table.entries.get(topic) or self.level_owner(topic)
        if s is None:
            if topic in self.table.deleted:
                raise UnknownTopic("no such topic %s: it was deleted" % topic)
            return
        if not s.readable:
            raise TopicForbidden("topic %s is not readable (perm %s): gets and pulls are refused" % (topic, s.perm))

    def ordered(self, topic):
        s = self.table.entries.get(topic)
        return bool(s and s.ordered)

    def settings(self):
        """Every table entry's settings plus, for the other known names, where their count comes from."""
        return dict(self.table.entries)
