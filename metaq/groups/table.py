"""The group settings table: per consumer group, what the broker allows it (``<data_dir>/groups.json``), as
RocketMQ's subscription group table. docs/concepts.md "Per-group settings".

A group with no entry behaves as every group did before the table: nothing here changes it. An entry holds:

``max_retries``               redeliveries after the first before a message goes to ``%DLQ%<group>`` (RocketMQ's
                              ``retryMaxTimes``); None: the front-end's default (POP's
                              ``limits.POP_MAX_ATTEMPTS`` deliveries, a remoting request's own maxReconsumeTimes or
                              ``remoting.max_reconsume_times``, a gRPC client's Settings)
``consumption_enabled``       false: every read as this group is refused (``consumeEnable``)
``broadcast_allowed``         false: a remoting consumer of this group in BROADCASTING mode is refused
                              (``consumeBroadcastEnable``)
``read_from_slave_when_slow`` a slave id: a remoting pull whose backlog is larger than the log kept in memory is told
                              to pull from that slave (``whichBrokerWhenConsumeSlowly``); None: never
``fifo``                      true: the group receives in order, one message of a message group at a time, whatever
                              its clients' Settings say (``consumeMessageOrderly``: RocketMQ 5's clients leave it to
                              the broker's group table)

The decision front-ends ask is ``groups/policy.py``'s; the service (one change at a time, the fsync off the loop,
the replication master told) is ``groups/service.py``. The file is JSON written through a temp file, fsynced and
renamed (``files.write_atomically``), then the directory fsynced; a slave's table is its master's (it travels in the
replication stream's TOPICS frame, ``protocol/replication_topics.py``) so a promoted slave keeps it. At most
``limits.MAX_GROUP_SETTINGS`` entries.
"""

import json
import os
from dataclasses import dataclass

from metaq import limits
from metaq.groups import limits as groups_limits
from metaq.topics import limits as topics_limits
from metaq.errors import ClientError, InvalidTopic, NotFound, StoreError
from metaq.store.files import fsync_dir, write_atomically

GROUPS_FILE = "groups.json"
TABLE_FORMAT = 1
SETTING_NAMES = ("max_retries", "consumption_enabled", "broadcast_allowed", "read_from_slave_when_slow", "fifo")
#: Largest group table file: its entries at their longest names fit well within it.
MAX_GROUP_TABLE_BYTES = topics_limits.MAX_TOPIC_TABLE_BYTES // 2


@dataclass(frozen=True)
class GroupSettings:
    name: str
    max_retries: int = None
    consumption_enabled: bool = True
    broadcast_allowed: bool = True
    read_from_slave_when_slow: int = None
    fifo: bool = False

    def to_json(self):
        return {"max_retries": self.max_retries, "consumption_enabled": self.consumption_enabled,
                "broadcast_allowed": self.broadcast_allowed,
                "read_from_slave_when_slow": self.read_from_slave_when_slow, "fifo": self.fifo}

    def describe(self):
        """What an operator sees (``metaq-admin group-settings``, the HTTP API)."""
        return dict(self.to_json(), group=self.name)


def check_group(name):
    """``name`` if a group may have settings; ClientError naming why not."""
    try:
        limits.validate_group(name)
    except InvalidTopic as exc:
        raise ClientError("group %r: %s" % (name, exc)) from None
    return name


def parse_settings(name, values, base=None):
    """The GroupSettings of ``name`` with ``values`` (``{setting: value}``, text from a wire or typed) applied to
    ``base`` (None: the defaults). ClientError naming the bad setting; nothing is changed."""
    unknown = sorted(set(values) - set(SETTING_NAMES))
    if unknown:
        raise ClientError("unknown group setting %s (known: %s)" % (", ".join(unknown), ", ".join(SETTING_NAMES)))
    s = base.to_json() if base is not None else GroupSettings(name).to_json()
    if "max_retries" in values:
        s["max_retries"] = _optional_int(values["max_retries"], "max_retries", 0, groups_limits.MAX_GROUP_RETRIES,
                                         "limits.MAX_GROUP_RETRIES")
    if "read_from_slave_when_slow" in values:
        s["read_from_slave_when_slow"] = _optional_int(values["read_from_slave_when_slow"],
                                                       "read_from_slave_when_slow", 1, limits.MAX_BROKER_ID,
                                                       "a slave id; limits.MAX_BROKER_ID")
    for flag in ("consumption_enabled", "broadcast_allowed", "fifo"):
        if flag in values:
            s[flag] = _flag(values[flag], flag)
    return GroupSettings(name, **s)


def _optional_int(value, name, low, high, why):
    if value is None or (isinstance(value, str) and value.lower() in ("", "none", "-")):
        return None
    if isinstance(value, bool) or isinstance(value, float):
        raise ClientError("%s must be a whole number %d..%d (%s) or none, got %r" % (name, low, high, why, value))
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ClientError("%s must be a whole number %d..%d (%s) or none, got %r" % (name, low, high, why, value)
                          ) from None
    if not low <= number <= high:
        raise ClientError("%s must be %d..%d (%s), got %d" % (name, low, high, why, number))
    return number


def _flag(value, name):
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ClientError("%s must be true or false, got %r" % (name, value))


def _call(fn):
    return fn()


class GroupTable:
    """The table in memory and on disk. ``get(group)``: the group's GroupSettings or None; ``set``/``delete``
    change it (checked first, the file written, then the table in memory: a failed write changes nothing);
    ``version`` grows with every change (replication sends the table when it moves)."""

    def __init__(self, root):
        self.root = root
        self.path = os.path.join(root, GROUPS_FILE)
        self.entries = {}
        self.version = 0
        #: runs a BLOCKING step (the file's fsync); the server gives one running it in a worker thread.
        self.run_blocking = _call

    def get(self, group):
        return self.entries.get(group)

    def load(self):
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_GROUP_TABLE_BYTES + 1)
        except FileNotFoundError:
            return self
        try:
            if len(data) > MAX_GROUP_TABLE_BYTES:
                raise ValueError("larger than %d bytes" % MAX_GROUP_TABLE_BYTES)
            self.apply_json(json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, KeyError, AttributeError, ClientError) as exc:
            raise StoreError("%s cannot be read: %s; fix or remove it (it holds the group settings set with "
                             "metaq-admin group-settings)" % (self.path, exc)) from None
        return self

    def apply_json(self, state):
        """Replace the table with ``state`` (the file's JSON, or a master's copy); ValueError/ClientError if bad."""
        self.entries, self.version = _parse_state(state)

    def to_json(self):
        return _state(self.entries, self.version)

    def encode(self):
        return _encode(self.entries, self.version)

    def save(self):
        """BLOCKING (an fsync): write the table as it is, atomically."""
        self._write(self.encode())

    def _write(self, data):
        os.makedirs(self.root, exist_ok=True)
        write_atomically(self.path, data)
        fsync_dir(self.root)

    # -- changes ----------------------------------------------------------------------------------------------

    def set(self, group, values):
        """Set ``values`` (``{setting: value}``) on ``group``'s entry (made from the defaults if it has none);
        returns its GroupSettings. ClientError for a bad value, the table full or nothing given; nothing changed."""
        check_group(group)
        if not values:
            raise ClientError("group-settings set %s: give at least one setting (%s)"
                              % (group, ", ".join(SETTING_NAMES)))
        old = self.entries.get(group)
        if old is None and len(self.entries) >= groups_limits.MAX_GROUP_SETTINGS:
            raise ClientError("group %s gets no settings: the table holds %d groups, its limit "
                              "(limits.MAX_GROUP_SETTINGS); delete another group's settings first"
                              % (group, len(self.entries)))
        s = parse_settings(group, values, old)
        self._change(group, s)
        return s

    def delete(self, group):
        """Remove ``group``'s entry: it behaves as a group with no settings. NotFound (404) if it has none."""
        check_group(group)
        old = self.entries.get(group)
        if old is None:
            raise NotFound("group %s has no settings to delete" % group)
        self._change(group, None)
        return old

    def replace(self, state):
        """A slave: the master's table (its JSON; None: an empty one) becomes ours, written as the master's
        version; ValueError/ClientError (nothing changed) if it is not a table this broker reads."""
        if state is None:
            state = _state({}, 0)
        entries, version = _parse_state(state)
        if (entries, version) == (self.entries, self.version):
            return
        data = _encode(entries, version)
        self.run_blocking(lambda: self._write(data))
        self.entries, self.version = entries, version

    def _change(self, group, new):
        """Write the table with ``group``'s entry ``new`` (None: removed), then hold it: readers see the change once
        it is durable, and a failed write leaves everything as it was."""
        entries = dict(self.entries)
        if new is None:
            entries.pop(group, None)
        else:
            entries[group] = new
        data = _encode(entries, self.version + 1)
        self.run_blocking(lambda: self._write(data))
        self.entries, self.version = entries, self.version + 1


def _state(entries, version):
    return {"format": TABLE_FORMAT, "version": version,
            "groups": {n: s.to_json() for n, s in sorted(entries.items())}}


def _encode(entries, version):
    return json.dumps(_state(entries, version), indent=1, sort_keys=True).encode("utf-8") + b"\n"


def _parse_state(state):
    """``(entries, version)`` of a table's JSON; ValueError/ClientError if it is not one this broker reads."""
    if not isinstance(state, dict) or state.get("format") != TABLE_FORMAT:
        raise ValueError("unknown group table format %r (this broker reads %d)"
                         % (state.get("format") if isinstance(state, dict) else state, TABLE_FORMAT))
    groups = state["groups"]
    if len(groups) > groups_limits.MAX_GROUP_SETTINGS:
        raise ValueError("%d groups: at most %d (limits.MAX_GROUP_SETTINGS)"
                         % (len(groups), groups_limits.MAX_GROUP_SETTINGS))
    entries = {}
    for name, raw in groups.items():
        entries[name] = parse_settings(check_group(name), {k: raw[k] for k in SETTING_NAMES if k in raw})
    return entries, int(state.get("version", 0))
