"""Persistent MQTT sessions in the commit log: their records are messages of the internal topic ``%MQTT%`` (one
partition), ``SessionTable`` is the state they build, and the store's log follower follows them through
``store/journals.py``'s ``JournalFollow`` (``MQTT_JOURNAL``), as it does the transaction journal
(docs/architecture.md "Derived indexes: the log follower"; docs/mqtt.md "Sessions").

Why the log: it is what a slave copies, what a sync master waits for and what a rejoining master cuts back. A
session kept in the log survives a restart, a kill -9 (the page cache holds what was written) and a failover to a
slave, by the code that keeps messages.

* **Records** (``encode`` / ``decode``): each is one JSON object. ``{"k": "s", ...}`` is a session's **whole state**
  (client id, user, protocol version, expiry interval, when it was written, whether its client was connected, its
  subscriptions, read positions, QoS 2 packet ids received and not released, messages in flight with where they
  are in the log, the shared subscriptions it rejoins); ``{"k": "d", "c": id}`` ends a session. Whole states make
  the last record of a client id its session: replay is "last record wins", and no snapshot is needed.
* **Shared groups** (``encode_group`` / ``encode_group_end``): ``{"k": "g", "n": name, "f": filter, ...}`` is a
  shared subscription group's read positions (and the topics it reads), kept while some session that holds one
  of its subscriptions exists, so the group goes on from there when a member comes back; ``{"k": "gd", ...}``
  ends it. The last record of a (name, filter) is its group.
* **Shared groups' assignment** (``encode_share_history`` / ``encode_share_history_end``): ``{"k": "b", "n": name,
  "f": filter, "h": [[since, [broker ids]], ...]}`` is the history by which this log's master assigns its messages
  of a ``$share`` group to the brokers of an MQTT cluster (``metaq.mqttcluster.sharing.share``): from log position
  ``since`` on, among those brokers; ``{"k": "bd", ...}`` ends it. The last record of a (name, filter) is its history.
* **Wills** (``encode_will`` / ``encode_will_end``): ``{"k": "w", ...}`` is the will of a connection the master
  holds (or one waiting for its delay): its client id, user and address, topic, payload, QoS, retain, MQTT 5
  properties and Will Delay; ``{"k": "wd", "c": id}`` says it was published or dropped (a DISCONNECT 0x00, a
  resume). A master that takes over (a promotion, a restart after a kill -9) publishes the wills still there: their
  connections ended with the broker that held them. The last record of a client id is its will.
* **Retained messages** (``encode_retained`` / ``encode_unretained``): ``R`` then a JSON line (the MQTT topic name,
  the metaq topic, the record's flag, when it was retained) then the stored record's data, as the message's own
  record holds it; ``U`` then ``{"t": name}`` clears one. The last record of a topic name is its retained message.
* **Carried messages** (``encode_carried`` / ``decode_carried``): ``Q`` then a JSON line (the metaq topic and the
  record's flag) then the stored record's data: a message a session brought along when it was taken over from
  another broker of the cluster (``metaq.mqttcluster``), which that session's ``carried`` list and messages in
  flight name by their place in ``%MQTT%``. The table passes over them: they are messages, not state.
* **Retention**: the log must keep each live session's, shared group's, assignment history's, will's and retained
  message's last record (``floor``:
  the lowest of them); the port writes one again at the end when its record falls ``MQTT_SESSION_REWRITE_BYTES``
  (or a segment) behind, so retention is never held back by more than that.
* **Following** (a slave): ``learn`` applies every ``%MQTT%`` record replicated, at most ``MQTT_LEARN_BATCH`` a
  call; a **cut** replays the log up to the cut. A master learns nothing from its own records: it applied them as
  it wrote them.

No sockets, gevent or clock (times are passed in).
"""

import base64
import heapq
import itertools
import logging

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.protocol.journalrecord import decode_record, encode_record
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.store.journals import JournalTopic, read_journal

log = logging.getLogger(__name__)

#: Records one ``learn`` takes at most (the follower's next step takes the rest).
MQTT_LEARN_BATCH = 1024

__all__ = ["SavedSession", "SavedGroup", "SavedWill", "Retained", "SessionTable", "MQTT_JOURNAL", "MQTT_LEARN_BATCH",
           "encode", "decode", "encode_retained", "encode_unretained", "is_retained_record", "RetainedMark",
           "encode_group", "encode_group_end", "encode_will", "encode_will_end", "encode_carried", "decode_carried",
           "RecordError", "ShareHistory", "encode_share_history", "encode_share_history_end"]


class RecordError(ValueError):
    """A ``%MQTT%`` record that does not decode."""


#: The log's topic; its records are handed on as bytes (``SessionTable.apply`` decodes them, the two kinds apart, and
#: passes over one that does not decode).
MQTT_JOURNAL = JournalTopic(MQTT_SESSIONS_TOPIC, bytes, RecordError, "mqtt")


class SavedSession:
    """One session as its last record says (see the module doc); ``position``: where that record is in the log."""

    __slots__ = ("client_id", "user", "version", "expiry_s", "at_ms", "connected", "subscriptions", "cursors",
                 "qos2", "inflight", "shared", "position", "carried")

    def __init__(self, client_id, user, version, expiry_s, at_ms, connected, subscriptions, cursors, qos2, inflight,
                 shared=(), position=None, carried=()):
        self.client_id = client_id
        self.user = user
        self.version = version
        self.expiry_s = expiry_s  # MQTT 5's Session Expiry Interval; None: MQTT 3.1.1 (kept until the age bound)
        self.at_ms = at_ms
        self.connected = connected
        self.subscriptions = subscriptions  # [(filter, qos, no_local, [topics], retain_as_published, sub id)]
        self.cursors = cursors  # {(topic, partition): next offset}
        self.qos2 = qos2  # [packet id]
        self.inflight = inflight  # [(packet id, state, qos, topic, partition, offset)]
        self.shared = list(shared)  # [($share/<name>/<filter>, granted QoS, sub id)]: groups it rejoins
        self.position = position
        self.carried = list(carried)  # [(QoS, offset in %MQTT%)]: messages brought from another broker, to send

    def expired(self, now_ms, max_age_s):
        """True when the session, offline since ``at_ms``, is past its expiry interval or the age bound."""
        if self.connected:
            return False
        age = now_ms - self.at_ms
        if self.expiry_s is not None and self.expiry_s != 0xFFFFFFFF and age >= self.expiry_s * 1000:
            return True
        return age >= max_age_s * 1000


def encode(saved):
    """A session's record (bytes)."""
    return encode_record({"k": "s", "c": saved.client_id, "u": saved.user, "v": saved.version, "e": saved.expiry_s,
                          "at": saved.at_ms, "on": saved.connected,
                          "subs": [list(s) for s in saved.subscriptions],
                          "cur": [[t, p, o] for (t, p), o in saved.cursors.items()],
                          "q2": list(saved.qos2), "inf": [list(i) for i in saved.inflight],
                          "sh": [list(x) for x in saved.shared], "cq": [list(x) for x in saved.carried]})


def encode_end(client_id):
    """The record that ends ``client_id``'s session."""
    return encode_record({"k": "d", "c": client_id})


class SavedGroup:
    """A shared group's read positions as its last record says: ``(name, filter)`` is its key, ``topics`` the metaq
    topics it reads, ``cursors`` {(topic, partition): next offset}; ``position``: where that record is in the log."""

    __slots__ = ("name", "topic_filter", "topics", "cursors", "at_ms", "position")

    def __init__(self, name, topic_filter, topics, cursors, at_ms, position=None):
        self.name, self.topic_filter, self.topics, self.cursors = name, topic_filter, list(topics), dict(cursors)
        self.at_ms, self.position = at_ms, position

    @property
    def key(self):
        return (self.name, self.topic_filter)


def encode_group(g):
    """A shared group's record (bytes)."""
    return encode_record({"k": "g", "n": g.name, "f": g.topic_filter, "t": sorted(g.topics), "at": g.at_ms,
                          "cur": [[t, p, o] for (t, p), o in g.cursors.items()]})


def encode_group_end(name, topic_filter):
    """The record that ends a shared group's kept positions."""
    return encode_record({"k": "gd", "n": name, "f": topic_filter})


def decode_group(data):
    """``((name, filter), SavedGroup or None)`` of a group's record (None: ended). Raises RecordError."""
    try:
        d = decode_record(data)
        key = (d["n"], d["f"])
        if d["k"] == "gd":
            return key, None
        return key, SavedGroup(d["n"], d["f"], d["t"], {(t, p): o for t, p, o in d["cur"]}, d["at"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("a shared group's record that does not decode: %s" % exc) from exc


class ShareHistory:
    """A ``$share`` group's assignment history as its last record says (``share.Shares``): ``key`` (name, filter),
    ``changes`` ((since log position, ((broker id, weight), ...) sorted), ...), oldest first; ``position``: where
    that record is (``placed``: the last change's since, when its record had none, is it)."""

    __slots__ = ("key", "changes", "position")

    def __init__(self, key, changes, position=None):
        self.key, self.changes, self.position = key, tuple(changes), position

    def placed(self, position):
        """This history's record is at ``position``: a last change that starts at its record starts there."""
        self.position = position
        if self.changes[-1][0] is None:
            self.changes = self.changes[:-1] + ((position, self.changes[-1][1]),)


def encode_share_history(key, changes):
    """A group's assignment history's record (bytes); the last change's since may be None (this record's place).
    Each change's brokers go as ids (``h``) and, when any weighs other than 1, their weights beside them (``w``, which
    a reader that does not know it leaves out: every weight 1)."""
    d = {"k": "b", "n": key[0], "f": key[1], "h": [[since, [b for b, _w in brokers]] for since, brokers in changes]}
    if any(w != 1 for _since, brokers in changes for _b, w in brokers):
        d["w"] = [[w for _b, w in brokers] for _since, brokers in changes]
    return encode_record(d)


def encode_share_history_end(key):
    """The record that ends a group's assignment history (no member anywhere)."""
    return encode_record({"k": "bd", "n": key[0], "f": key[1]})


def decode_share_history(data):
    """``((name, filter), ShareHistory or None)`` of a history's record (None: ended). Raises RecordError."""
    try:
        d = decode_record(data)
        key = (d["n"], d["f"])
        if d["k"] == "bd":
            return key, None
        weights = d.get("w") or [[1] * len(brokers) for _since, brokers in d["h"]]
        if len(weights) != len(d["h"]):
            raise RecordError("an assignment history whose weights are not one list per change")
        changes = [(None if since is None else int(since), _weighed(brokers, ws))
                   for (since, brokers), ws in zip(d["h"], weights, strict=True)]
        if not changes:
            raise RecordError("an assignment history with no change")
        if any(since is None for since, _brokers in changes[:-1]):
            raise RecordError("an assignment history whose change before the last has no start")
        return key, ShareHistory(key, changes)
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("a shared group's assignment history that does not decode: %s" % exc) from exc


def _weighed(brokers, weights):
    """A change's ``((broker, weight), ...)`` sorted, each weight 0..MQTT_CLUSTER_SHARE_WEIGHT_MAX (0: the group is
    kept there for persistent members away, none connected)."""
    if len(weights) != len(brokers) or \
            not all(type(w) is int and 0 <= w <= mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX for w in weights):
        raise RecordError("an assignment history's weights must be one per broker, each 0..%d "
                          "(MQTT_CLUSTER_SHARE_WEIGHT_MAX)" % mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX)
    return tuple(sorted((int(b), w) for b, w in zip(brokers, weights, strict=True)))


class SavedWill:
    """A will as its last record says (see the module doc): what its client's CONNECT gave (``properties``:
    ``wire``'s dict of the will's MQTT 5 properties), its user and address (its publish is asked as that user's),
    the delay it waits once its connection ended (min(Will Delay, Session Expiry); 0: MQTT 3.1.1);
    ``position``: where that record is in the log; ``origin``: the name its broker gave it when it was recorded,
    kept by the records that write it again (a record without one: its position): what tells this will from a
    later one of the same client id, on every member and after a restart."""

    __slots__ = ("client_id", "user", "host", "topic", "payload", "qos", "retain", "properties", "delay_s",
                 "position", "origin")

    def __init__(self, client_id, user, host, topic, payload, qos, retain, properties, delay_s, position=None,
                 origin=None):
        self.client_id, self.user, self.host, self.topic, self.payload = client_id, user, host, topic, payload
        self.qos, self.retain, self.properties, self.delay_s, self.position = qos, retain, properties, delay_s, position
        self.origin = origin


def _plain(value):
    """A will property as JSON holds it: bytes (Correlation Data) as ``{"b": base64}``, pairs as lists."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _unplain(value):
    if isinstance(value, dict):
        return base64.b64decode(value["b"])
    if isinstance(value, list):
        return tuple(_unplain(v) for v in value)
    return value


def encode_will(w):
    """A will's record (bytes), its ``origin`` with it."""
    d = {"k": "w", "c": w.client_id, "u": w.user, "h": w.host, "t": w.topic,
         "p": base64.b64encode(bytes(w.payload)).decode("ascii"), "q": w.qos, "r": bool(w.retain),
         "pr": {k: _plain(v) for k, v in w.properties.items()}, "d": w.delay_s}
    if w.origin is not None:
        d["o"] = w.origin
    return encode_record(d)


def encode_will_end(client_id):
    """The record that says ``client_id``'s will was published or dropped."""
    return encode_record({"k": "wd", "c": client_id})


def decode_will(data):
    """``(client id, SavedWill or None)`` of a will's record (None: published or dropped). Raises RecordError."""
    try:
        d = decode_record(data)
        if d["k"] == "wd":
            return d["c"], None
        props = {k: _unplain(v) for k, v in d["pr"].items()}
        if "user_property" in props:
            props["user_property"] = [tuple(pair) for pair in props["user_property"]]
        return d["c"], SavedWill(d["c"], d["u"], d["h"], d["t"], base64.b64decode(d["p"]), d["q"], d["r"], props,
                                 d["d"], origin=d.get("o"))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise RecordError("a will's record that does not decode: %s" % exc) from exc


class Retained:
    """A retained message: its MQTT topic name, the metaq topic, the flag and data of its stored record, when it was
    retained; ``position``: where its record is in the log."""

    __slots__ = ("name", "metaq_topic", "flag", "data", "at_ms", "position")

    def __init__(self, name, metaq_topic, flag, data, at_ms, position=None):
        self.name, self.metaq_topic, self.flag, self.data, self.at_ms = name, metaq_topic, flag, data, at_ms
        self.position = position


def encode_retained(r):
    head = encode_record({"t": r.name, "mt": r.metaq_topic, "f": r.flag, "at": r.at_ms})
    return b"R" + head + b"\n" + bytes(r.data)


def encode_unretained(name):
    return b"U" + encode_record({"t": name})


def is_retained_record(data):
    """True when ``%MQTT%`` record data ``data`` is a retained message's (``R``) or its clear (``U``)."""
    return bytes(data[:1]) in (b"R", b"U")


class RetainedMark:
    """How far into ``%MQTT%`` a retained message's record (``R``/``U``) may lie: the offset past the last that may
    be one, so that the peers' follows (``metaq.mqttcluster.serve.PeerFollow``) pass over the sessions' records from
    there on without reading them. Kept by the journal's one writer, the master's port: ``began`` when it begins
    writing the journal (its start, a promotion, a cut: any record before may be one), ``written`` for each retained
    record it appends, ``replicating`` while the journal grows by another master's records (a slave: any may be)."""

    __slots__ = ("_end",)

    def __init__(self):
        self._end = None  # the offset past the last record that may be a retained one; None: any may

    def began(self, end):
        """This broker writes the journal from ``end`` on (its written end: records not visible yet included)."""
        self._end = end

    def replicating(self):
        """The journal grows by another master's records now."""
        self._end = None

    def written(self, offset):
        """A retained record was appended at ``offset``."""
        if self._end is not None and offset >= self._end:
            self._end = offset + 1

    def end(self):
        """The offset from which on no record is a retained one (None: any may be)."""
        return self._end


def decode_retained(data):
    """``(name, Retained or None)`` of a retained message's record (None: cleared). Raises RecordError."""
    data = bytes(data)
    try:
        if data[:1] == b"U":
            return decode_record(data[1:])["t"], None
        end = data.index(b"\n")
        d = decode_record(data[1:end])
        return d["t"], Retained(d["t"], d["mt"], d["f"], data[end + 1:], d["at"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("a retained message's record that does not decode: %s" % exc) from exc


def encode_carried(metaq_topic, flag, data):
    """The record of a message a session carried from another broker: its metaq topic, flag and stored data."""
    head = encode_record({"mt": metaq_topic, "f": flag})
    return b"Q" + head + b"\n" + bytes(data)


def decode_carried(data):
    """``(metaq topic, flag, data)`` of a carried message's record. Raises RecordError."""
    data = bytes(data)
    try:
        if data[:1] != b"Q":
            raise RecordError("not a carried message's record")
        end = data.index(b"\n")
        d = decode_record(data[1:end])
        return d["mt"], d["f"], data[end + 1:]
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("a carried message's record that does not decode: %s" % exc) from exc


def decode(data):
    """``(client id, SavedSession or None)`` of one record (None: the session ended). Raises RecordError."""
    try:
        d = decode_record(data)
        if d["k"] == "d":
            return d["c"], None
        if d["k"] != "s":
            raise RecordError("unknown record kind %r" % (d["k"],))
        return d["c"], SavedSession(
            d["c"], d["u"], d["v"], d["e"], d["at"], d["on"],
            [(f, q, bool(nl), list(ts), bool(rap), _sub_id(rest)) for f, q, nl, ts, rap, *rest in d["subs"]],
            {(t, p): o for t, p, o in d["cur"]}, list(d["q2"]),
            [tuple(i) for i in d["inf"]], [(f, q, _sub_id(rest)) for f, q, *rest in d.get("sh", ())],
            carried=[(q, o) for q, o in d.get("cq", ())])
    except RecordError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError("an MQTT session record that does not decode: %s" % exc) from exc


def _sub_id(rest):
    """A record's subscription identifier (the element after the others; records written before there were
    identifiers have none)."""
    return rest[0] if rest and isinstance(rest[0], int) and rest[0] > 0 else None


class SessionTable:
    """The sessions the log holds: client id -> ``SavedSession`` (the last record of each).

    The offline ones are also kept apart, with a heap of them by when they went offline, so that a session going
    offline asks in O(log n) which are past ``mqtt.max_offline_sessions`` (``offline_past``): a storm of
    disconnects of n persistent sessions costs n log n, not n sorts of n."""

    def __init__(self):
        self.sessions = {}
        self._offline = {}  # client id -> its SavedSession, for those not connected
        self._by_age = []  # heap of (at_ms, seq, client id, SavedSession); stale once _offline holds another
        self._seq = itertools.count()
        self.retained = {}  # MQTT topic name -> Retained
        self.retained_bytes = 0  # the payload bytes of the retained messages' records
        self.groups = {}  # (share name, filter) -> SavedGroup
        self.wills = {}  # client id -> SavedWill: wills not yet published or dropped
        self.shares = {}  # (share name, filter) -> ShareHistory

    def apply(self, position, data):
        """One record at log ``position``; a record that does not decode is logged and passed over."""
        keyed = self._keyed(bytes(data[:7]))
        if keyed is not None:
            kept, decoder = keyed
            try:
                key, value = decoder(data)
            except RecordError as exc:
                log.error("mqtt: the sessions' record at log position %d is passed over: %s", position, exc)
                return
            if value is None:
                kept.pop(key, None)
            elif kept is self.shares:
                value.placed(position)
                kept[key] = value
            else:
                value.position = position
                if kept is self.wills and value.origin is None:  # a will's record written without a name
                    value.origin = position
                kept[key] = value
            return
        if bytes(data[:1]) == b"Q":
            return  # a carried message: named by the session that carries it, no state of its own
        if is_retained_record(data):
            try:
                name, r = decode_retained(data)
            except RecordError as exc:
                log.error("mqtt: the sessions' record at log position %d is passed over: %s", position, exc)
                return
            old = self.retained.pop(name, None)
            if old is not None:
                self.retained_bytes -= len(old.data)
            if r is not None:
                r.position = position
                self.retained[name] = r
                self.retained_bytes += len(r.data)
            return
        try:
            client_id, saved = decode(data)
        except RecordError as exc:
            log.error("mqtt: the sessions' record at log position %d is passed over: %s", position, exc)
            return
        if saved is None:
            self.sessions.pop(client_id, None)
            self._offline.pop(client_id, None)
        else:
            saved.position = position
            self.sessions[client_id] = saved
            if saved.connected:
                self._offline.pop(client_id, None)
            else:
                self._went_offline(client_id, saved)

    def _went_offline(self, client_id, saved):
        self._offline[client_id] = saved
        heapq.heappush(self._by_age, (saved.at_ms, next(self._seq), client_id, saved))
        if len(self._by_age) > 2 * len(self._offline) + 64:  # mostly stale (sessions back online, ended): rebuilt
            self._by_age = [e for e in self._by_age if self._offline.get(e[2]) is e[3]]
            heapq.heapify(self._by_age)

    def _keyed(self, head):
        """``(the table's dict, the decoder)`` of a record kind whose last record of a key is that key's state (a
        will, a shared group, an assignment history), by its first bytes ``head``; None: another kind."""
        if head == b'{"k":"w':
            return self.wills, decode_will
        if head == b'{"k":"g':
            return self.groups, decode_group
        if head == b'{"k":"b':
            return self.shares, decode_share_history
        return None

    def connections_ended(self, live=()):
        """A start or a promotion: each session's connection ended with the broker that wrote it, but those of the
        client ids of ``live`` (connected here)."""
        self._offline.clear()
        for client_id, saved in self.sessions.items():
            saved.connected = client_id in live
            if not saved.connected:
                self._offline[client_id] = saved
        self._by_age = [(s.at_ms, next(self._seq), cid, s) for cid, s in self._offline.items()]
        heapq.heapify(self._by_age)

    def offline(self):
        """The sessions whose client is not connected, offline longest first."""
        return sorted(self._offline.values(), key=lambda s: s.at_ms)

    def offline_count(self):
        """How many sessions' clients are not connected."""
        return len(self._offline)

    def offline_past(self, most):
        """The client ids of the offline sessions past the ``most`` kept, offline longest first (they stay in the
        table until their end is applied)."""
        heap, offline, taken = self._by_age, self._offline, []
        while heap and len(taken) < len(offline) - most:
            entry = heapq.heappop(heap)
            if offline.get(entry[2]) is entry[3]:
                taken.append(entry)
        for entry in taken:
            heapq.heappush(heap, entry)
        return [entry[2] for entry in taken]

    def floor(self):
        """The lowest log position a live session's last record is at (None: no session)."""
        return min([s.position for s in self.sessions.values() if s.position is not None]
                   + [r.position for r in self.retained.values() if r.position is not None]
                   + [g.position for g in self.groups.values() if g.position is not None]
                   + [w.position for w in self.wills.values() if w.position is not None]
                   + [h.position for h in self.shares.values() if h.position is not None], default=None)


def replay(store, upto=None):
    """A ``SessionTable`` of the ``%MQTT%`` records before ``upto`` (default: the written end), in log order."""
    table = SessionTable()
    for position, _flag, data in read_journal(store, MQTT_JOURNAL, upto):
        table.apply(position, data)
    return table
