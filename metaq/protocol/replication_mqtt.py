"""The replication stream's two MQTT-cluster frames (types 11 and 12, ``metaq.protocol.replication``): a peer
broker follows this broker's log for what its MQTT sessions subscribe (``metaq.mqttcluster``). Sans-IO.

A peer connects to the replication port as a slave does, proves the replication secret as peers do (CHALLENGE,
PROOF: ``serving.replication.handshake.peer_proof``, as a PEER_CALL's caller), then sends ROUTES where a slave
sends HELLO; the master answers its PROOF and then RECORDS frames, and the peer may send ROUTES again whenever its
filters change.

ROUTES (peer to master): UTF-8 JSON, 2..MQTT_CLUSTER_ROUTES_BYTES bytes::

    {"broker": <the peer's broker id>,
     "filters": [MQTT topic filter, ...],            at most MQTT_CLUSTER_MAX_FILTERS, each non-empty text
     "positions": [[topic, partition, offset], ...], where the peer's copy of each followed partition resumes
     "retained": offset,                             the offset of the master's ``%MQTT%`` journal to send the retained
                                                     messages' records from (-1: send none)
     "retained_check": check,                        (optional, 0: none) the ``record_check`` of the retained record
                                                     before that offset as the peer copied it, proved as a position's
     "retained_epoch": [epoch, origin],              (optional, [0, 0]: none) that record's epoch, as a position's
     "retained_epoch_path": [[epoch, origin, from], ...],  (optional) the epochs the retained copies went
                                                     through, as a position's "epoch_paths" entry
     "groups": [[share name, filter], ...],          its ``$share`` groups with members, at most MQTT_CLUSTER_MAX_GROUPS
                                                     (optional)
     "weights": [members, ...],                      one per group, each 0..MQTT_CLUSTER_SHARE_WEIGHT_MAX (optional;
                                                     absent: each 1): the group's members on the peer (0: kept there
                                                     for persistent members away, none connected)
     "checks": [check, ...],                         one per position (optional; 0: none): the ``record_check`` of
                                                     the record before it as the peer copied it (or passed it)
     "epochs": [[epoch, origin], ...],               one per position (optional; [0, 0]: none known): the epoch
                                                     (``store.epochs``: its number and origin) of the record before
                                                     it as the peer copied it; present (an empty list too) when the
                                                     peer takes EPOCH entries
     "epoch_paths": [[[epoch, origin, from], ...], ...],  one per position (optional; [] for a position: none
                                                     known): the epochs the peer's copy went through, oldest first,
                                                     the last the position's own, at most MQTT_CLUSTER_EPOCHS_KEPT,
                                                     each with the position its copy entered it at (its copies from
                                                     there on may differ from this log's when this log does not hold
                                                     that epoch)
     "version": n,                                   (optional, 0: none) the route's version: the master acks it
     "more": true}                                   (optional) more of this route follows in the next ROUTES

A route too large for one frame (its filters, positions and groups may together be far past
MQTT_CLUSTER_ROUTES_BYTES) goes in parts (``split_routes``): each part a ROUTES of its own within the bound, the
same broker and retained offset, a share of the filters, positions (with their checks) and groups, all but the last
with "more". The receiver takes the route as the union of its parts (``join_routes``), and acts on it only once the
last part came; the parts of one route hold at most MQTT_CLUSTER_MAX_FILTERS filters, MQTT_CLUSTER_MAX_POSITIONS
positions and MQTT_CLUSTER_MAX_GROUPS groups in all.

The master proves each position with its check before it resumes there (``serve.PeerFollow.proved``): when its own
record before the position is another one (its log took another way since: an ``async`` master's failover cut what
the peer had copied and gave those offsets to other messages), it resumes from the first record of the epoch that
record belongs to, and says so with a POSITION entry flagged RESUMED. With the position's epoch (KIP-101's
OffsetForLeaderEpoch) it first finds where that epoch ended in its own history: a position past that end resumes
there, the first offset the master's log holds of a later epoch (after two failovers in a row too: what a middle
master wrote that the peer never copied is sent); an epoch it does not hold ends where its latest earlier one does,
and no later than where the peer's copy entered it ("epoch_paths": a master deposed mid-epoch may have begun its
epoch before the end of the earlier one here, when it lagged as a slave), and so on back through the peer's path to
the latest epoch it holds (KIP-279 asks again, epoch by epoch, for the same reason).

RECORDS (master to peer), ``>I`` count then count entries, at most MQTT_CLUSTER_FRAME_BYTES::

    ENTRY  >BHiiqqI  kind uint8, topic length uint16, partition int32, flag int32, offset int64, store time int64
                     (epoch ms), data length uint32; then the topic (UTF-8), then the data
      kind 1 MESSAGE   a record of ``topic``-``partition`` at ``offset`` whose MQTT topic name a filter matches (its
                       flag and data as stored)
      kind 2 POSITION  the master read ``topic``-``partition`` up to ``offset`` (the next offset; no data); its store
                       time field holds the ``record_check`` of the record before ``offset`` (0: none), its flag
                       RESUMED (1) when the master resumes the peer's copy here, before the position the peer sent
                       (the peer's copies from here on are not of this master's records: it copies these again)
                       A partition's last record read that goes as a MESSAGE or SHARED needs none: the peer's position
                       moves past each record it copies (with the record's own check)
      kind 3 RETAINED  a retained message's record (``R``/``U``) of the master's ``%MQTT%`` journal at ``offset``
      kind 4 SHARED    a MESSAGE the master assigned to the peer's ``$share`` groups
                       (``metaq.mqttcluster.sharing.share``): its data is ``>H`` length, the groups as UTF-8 JSON
                       ``[[share name, filter], ...]``, then the record's data
      kind 5 ROUTED    the peer's route of version ``offset`` (its ROUTES "version") is the master's from here on:
                       every entry after it was chosen by that route or a later one, every POSITION the master had
                       to send before it was sent (no topic, no data; sent only for a route that names a version)
      kind 6 EPOCH     the records of ``topic``-``partition`` from ``offset`` on (until its next EPOCH) were written
                       in the epoch whose number is the store time field, its origin the data (``>q``, 8 bytes);
                       sent before the first record or POSITION of a partition a follow sends, and before a record
                       of another epoch (only to a peer whose ROUTES has "epochs")

An empty RECORDS (count 0) is the master's heartbeat. Anything else (a bad kind, lengths that do not fill the
frame, JSON that is not this object) is a fatal ``RemoteProtocolError``: a RECORDS entry's when its reader reaches
it (``RecordEntries``: the entries are decoded one at a time as they are copied, so that one frame of
MQTT_CLUSTER_FRAME_BYTES of tiny entries lets the other connections run between them; what a sender may put in a
frame is not bounded further, as brokers of every version send it).

A broker of the version before ROUTED ignores a route's "version" and sends none; one that sends no version gets none.
A broker of the version before the epochs sends no "epochs" and gets no EPOCH entry (its positions are proved by their
checks alone); one that ignores "epochs" sends none.
Brokers of the version before the checks interoperate: one ignores "checks" and a POSITION's check and flag (its
copies resume unchecked, as before), and a ROUTES without "checks" is resumed unchecked.
"""

import json
import struct
import zlib
from typing import NamedTuple

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.recordwalk import COUNT, ENTRY, EPOCH, MESSAGE, POSITION, RETAINED, ROUTED, SHARED, walk

__all__ = ["Routes", "Records", "Entry", "MESSAGE", "POSITION", "RETAINED", "SHARED", "ROUTED", "EPOCH", "RESUMED",
           "NO_EPOCH", "epoch_entry", "epoch_of",
           "record_check", "shared_data", "split_shared", "split_routes", "join_routes", "routes_parts",
           "records_parts", "check_routes_length", "check_records_length", "decode_routes", "decode_records",
           "RecordEntries"]

#: ``(epoch, origin)`` of no known epoch.
NO_EPOCH = (0, 0)
#: The largest epoch number and origin (``store.epochs``: a signed 64-bit field on the wire).
MAX_EPOCH_FIELD = 2**63 - 1
ORIGIN = struct.Struct(">q")
#: A POSITION entry's flag: the master resumes the peer's copy here, before the position the peer sent.
RESUMED = 1
STORED_AT = struct.Struct(">q")
GROUPS_LENGTH = struct.Struct(">H")
assert ENTRY.size == 31
#: Entries a RECORDS frame's reader walks in one step (``recordwalk.walk``) before it hands the first on.
WALK_RUN = 64


class Routes(NamedTuple):
    """A peer's route: its broker id, its filters, its resume positions ``((topic, partition, offset), ...)``, the
    ``%MQTT%`` offset to send retained records from (-1: none), its groups and one check per position (empty:
    none); ``more``: a part of a route whose next part follows (``split_routes``); ``version``: the route's, which
    the master acks with a ROUTED entry once it acts on it (0: none asked); ``weights``: one per group, its members
    on that broker (empty: each 1, as a broker that does not send them means); ``retained_check``: the check of the
    retained record before ``retained`` as the peer copied it (0: none), proved as a position's check is;
    ``epochs``: one ``(epoch, origin)`` per position (``NO_EPOCH``: none known; empty: none known of any), None from
    a peer that takes no EPOCH entry; ``retained_epoch``: the epoch of the retained record before ``retained``;
    ``epoch_paths``: one per position (empty: none of any), the epochs its copy went through, ``((number, origin,
    from), ...)`` oldest first, the last the position's own, each with where the copy entered it (``()``: none
    known); ``retained_epoch_path`` the same of the retained offset."""

    broker_id: int
    filters: tuple
    positions: tuple = ()
    retained: int = -1
    groups: tuple = ()
    checks: tuple = ()
    more: bool = False
    version: int = 0
    weights: tuple = ()
    retained_check: int = 0
    epochs: tuple | None = None
    retained_epoch: tuple = NO_EPOCH
    epoch_paths: tuple = ()
    retained_epoch_path: tuple = ()


def epoch_entry(topic, partition, offset, epoch):
    """The EPOCH entry saying ``topic``-``partition``'s records from ``offset`` on are of ``epoch`` ``(number,
    origin)``."""
    return Entry(EPOCH, topic, partition, offset, 0, epoch[0], ORIGIN.pack(epoch[1]))


def epoch_of(entry):
    """``(number, origin)`` of an EPOCH entry; a fatal RemoteProtocolError when its fields cannot be an epoch's."""
    if len(entry.data) != ORIGIN.size or entry.ts < 0:
        raise _fail("an EPOCH entry is a number (0 or more) and an 8-byte origin, not %d and %d bytes"
                    % (entry.ts, len(entry.data)))
    (origin,) = ORIGIN.unpack(entry.data)
    if origin < 0:
        raise _fail("an EPOCH entry's origin %d is negative" % origin)
    return entry.ts, origin


def record_check(stored_at_ms, data):
    """What tells one record of a partition from another at the same offset: a CRC-32 of its store time and data,
    with bit 32 set (0 is "no check")."""
    return (1 << 32) | zlib.crc32(data, zlib.crc32(STORED_AT.pack(stored_at_ms)))


class Entry(NamedTuple):
    kind: int
    topic: str
    partition: int
    offset: int
    flag: int = 0
    ts: int = 0
    data: bytes = b""


class Records(NamedTuple):
    """A RECORDS frame: its entries, a tuple as a sender builds it, ``RecordEntries`` as ``decode_records`` reads
    it."""

    entries: tuple


def shared_data(groups, data):
    """A SHARED entry's data: ``groups`` ((share name, filter), ...) before the record's ``data``."""
    head = json.dumps([list(g) for g in groups], separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return GROUPS_LENGTH.pack(len(head)) + head + data


def split_shared(data):
    """``(groups, record data)`` of a SHARED entry's data (the record's a slice of it, not copied); a fatal
    RemoteProtocolError when it is not one."""
    if len(data) < GROUPS_LENGTH.size:
        raise _fail("a SHARED entry without its groups")
    (length,) = GROUPS_LENGTH.unpack_from(data)
    end = GROUPS_LENGTH.size + length
    try:
        groups = json.loads(bytes(data[GROUPS_LENGTH.size:end]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # (nested past the decoder's depth: a clear error too)
        raise _fail("a SHARED entry's groups are not UTF-8 JSON of a list of pairs") from None
    return _groups(groups), data[end:]


def _groups(groups):
    if not isinstance(groups, list) or len(groups) > mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS or \
            not all(isinstance(g, list) and len(g) == 2 and all(isinstance(x, str) and x for x in g) for g in groups):
        raise _fail("groups must be a list of at most %d [share name, filter] pairs (MQTT_CLUSTER_MAX_GROUPS)"
                    % mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS)
    return tuple((g[0], g[1]) for g in groups)


def _fail(reason):
    return RemoteProtocolError("bad MQTT cluster frame: %s" % reason, fatal=True)


def _json(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _json_size(value, names):
    """``len(_json(value))`` for the ints, strings and tuples of them a route holds, without writing it: an int's
    digits, a string's JSON once per distinct string (``names``: string -> its length), so that a route of
    MQTT_CLUSTER_MAX_POSITIONS positions is measured for its parts without a JSON encoder's call per field."""
    kind = type(value)
    if kind is int:
        return len(str(value))
    if kind is str:
        size = names.get(value)
        if size is None:
            size = names[value] = len(_json(value))
        return size
    if kind is tuple or kind is list:
        return 1 + len(value) + sum([_json_size(v, names) for v in value]) if value else 2
    return len(_json(value))


def split_routes(routes, most=None):
    """``routes`` as the ROUTES frames that carry it: ``[routes]`` when it fits ``most`` bytes (None:
    MQTT_CLUSTER_ROUTES_BYTES), else parts of at most ``most`` bytes each (filters, then positions with their
    checks, then groups, in order), every part but the last with ``more``. One item always fits a part: a filter is
    at most MQTT_MAX_TOPIC_BYTES, a topic name MAX_NAME_BYTES."""
    if most is None:
        most = mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES
    if len(_routes_json(routes)) <= most:
        return [routes._replace(more=False)]
    empty = Routes(routes.broker_id, (), (), routes.retained, (), (), True, routes.version,
                   retained_check=routes.retained_check, epochs=() if routes.epochs is not None else None,
                   retained_epoch=routes.retained_epoch, retained_epoch_path=routes.retained_epoch_path)
    room = most - len(_routes_json(empty))  # what a part holds beside its items (each counted with a comma)
    if routes.epoch_paths:  # each part with positions carries the key, which the empty part's JSON lacks
        room -= len(b',"epoch_paths":[]')
    checks = routes.checks or (0,) * len(routes.positions)
    epochs = routes.epochs or (NO_EPOCH,) * len(routes.positions)
    paths = routes.epoch_paths or ((),) * len(routes.positions)
    names = {}
    items = [("filters", f, _json_size(f, names) + 1) for f in routes.filters]
    items += [("positions", (p, c, e, f), _json_size(p, names) + _json_size(c, names) + _json_size(e, names)
               + _json_size(f, names) + 4)
              for p, c, e, f in zip(routes.positions, checks, epochs, paths, strict=True)]
    weights = routes.weights or (1,) * len(routes.groups)
    items += [("groups", (g, w), _json_size(g, names) + _json_size(w, names) + 2)
              for g, w in zip(routes.groups, weights, strict=True)]
    parts, part, used = [], {"filters": [], "positions": [], "groups": []}, 0
    for kind, item, size in items:
        if used + size > room and used:
            parts.append(part)
            part, used = {"filters": [], "positions": [], "groups": []}, 0
        part[kind].append(item)
        used += size
    parts.append(part)
    out = [empty._replace(filters=tuple(p["filters"]), positions=tuple(x[0] for x in p["positions"]),
                          checks=tuple(x[1] for x in p["positions"]) if routes.checks else (),
                          epochs=tuple(x[2] for x in p["positions"]) if routes.epochs else empty.epochs,
                          epoch_paths=tuple(x[3] for x in p["positions"]) if routes.epoch_paths else (),
                          groups=tuple(x[0] for x in p["groups"]),
                          weights=tuple(x[1] for x in p["groups"]) if routes.weights else ()) for p in parts]
    out[-1] = out[-1]._replace(more=False)
    return out


def join_routes(so_far, part):
    """The route of the parts ``so_far`` (a Routes joined so far, None: ``part`` is the first) and ``part``: their
    filters, positions with checks and groups together, ``more`` as ``part`` says; a fatal RemoteProtocolError when
    they hold more than a route may (MQTT_CLUSTER_MAX_FILTERS, MQTT_CLUSTER_MAX_POSITIONS, MQTT_CLUSTER_MAX_GROUPS)
    or name another broker."""
    if so_far is None:
        return part
    if part.broker_id != so_far.broker_id:
        raise _fail("a ROUTES part of broker %d in broker %d's route" % (part.broker_id, so_far.broker_id))
    joined = Routes(so_far.broker_id, so_far.filters + part.filters, so_far.positions + part.positions,
                    so_far.retained, so_far.groups + part.groups,
                    (so_far.checks or (0,) * len(so_far.positions)) + (part.checks or (0,) * len(part.positions)),
                    part.more, part.version,
                    ((so_far.weights or (1,) * len(so_far.groups)) + (part.weights or (1,) * len(part.groups))
                     if so_far.weights or part.weights else ()),
                    so_far.retained_check,
                    None if so_far.epochs is None or part.epochs is None else
                    ((so_far.epochs or (NO_EPOCH,) * len(so_far.positions))
                     + (part.epochs or (NO_EPOCH,) * len(part.positions))
                     if so_far.epochs or part.epochs else ()),
                    so_far.retained_epoch,
                    ((so_far.epoch_paths or ((),) * len(so_far.positions))
                     + (part.epoch_paths or ((),) * len(part.positions))
                     if so_far.epoch_paths or part.epoch_paths else ()),
                    so_far.retained_epoch_path)
    for what, count, most, name in (("filters", len(joined.filters), mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS,
                                     "MQTT_CLUSTER_MAX_FILTERS"),
                                    ("positions", len(joined.positions), mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS,
                                     "MQTT_CLUSTER_MAX_POSITIONS"),
                                    ("groups", len(joined.groups), mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS,
                                     "MQTT_CLUSTER_MAX_GROUPS")):
        if count > most:
            raise _fail("a route in parts of more than %d %s (%s)" % (most, what, name))
    return joined


def _routes_json(event):
    obj = {"broker": event.broker_id, "filters": list(event.filters), "positions": [list(p) for p in event.positions],
           "retained": event.retained, "groups": [list(g) for g in event.groups], "checks": list(event.checks)}
    if event.more:
        obj["more"] = True
    if event.version:
        obj["version"] = event.version
    if event.weights:
        obj["weights"] = list(event.weights)
    if event.retained_check:
        obj["retained_check"] = event.retained_check
    if event.epochs is not None:
        obj["epochs"] = [list(e) for e in event.epochs]
    if tuple(event.retained_epoch) != NO_EPOCH:
        obj["retained_epoch"] = list(event.retained_epoch)
    if event.epoch_paths:
        obj["epoch_paths"] = [[list(x) for x in path] for path in event.epoch_paths]
    if event.retained_epoch_path:
        obj["retained_epoch_path"] = [list(x) for x in event.retained_epoch_path]
    return _json(obj)


def routes_parts(event):
    payload = _routes_json(event)
    if len(payload) > mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES:
        raise ValueError("a ROUTES frame of %d bytes exceeds MQTT_CLUSTER_ROUTES_BYTES (%d)"
                         % (len(payload), mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES))
    return [payload]


def records_parts(event):
    parts = [COUNT.pack(len(event.entries))]
    for e in event.entries:
        topic = e.topic.encode("utf-8")
        parts.append(ENTRY.pack(e.kind, len(topic), e.partition, e.flag, e.offset, e.ts, len(e.data)))
        parts.append(topic)
        if e.data:
            parts.append(e.data)
    if sum(len(p) for p in parts) > mqttcluster_limits.MQTT_CLUSTER_FRAME_BYTES:
        raise ValueError("a RECORDS frame past MQTT_CLUSTER_FRAME_BYTES (%d)"
                         % mqttcluster_limits.MQTT_CLUSTER_FRAME_BYTES)
    return parts


def check_routes_length(length):
    if not 2 <= length <= mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES:
        raise _fail("ROUTES of %d bytes: must be 2..%d (limit MQTT_CLUSTER_ROUTES_BYTES)"
                    % (length, mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES))


def check_records_length(length):
    if not COUNT.size <= length <= mqttcluster_limits.MQTT_CLUSTER_FRAME_BYTES:
        raise _fail("RECORDS of %d bytes: must be %d..%d (limit MQTT_CLUSTER_FRAME_BYTES)"
                    % (length, COUNT.size, mqttcluster_limits.MQTT_CLUSTER_FRAME_BYTES))


def _bounded(value, low, high, what):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _fail("%s %r out of range" % (what, value))
    return value


def decode_routes(payload):
    try:
        obj = json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _fail("ROUTES is not UTF-8 JSON (%s)" % exc) from None
    except RecursionError:  # the decoder's bound of nesting: a route nests 3 deep
        raise _fail("ROUTES nested deeper than JSON is decoded (a route is an object of lists of lists)") from None
    if not isinstance(obj, dict):
        raise _fail("ROUTES is not a JSON object")
    broker = _bounded(obj.get("broker"), 0, limits.MAX_BROKER_ID, "broker id")
    filters = obj.get("filters")
    if not isinstance(filters, list) or len(filters) > mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS or \
            not all(isinstance(f, str) and f for f in filters):
        raise _fail("ROUTES filters must be a list of at most %d non-empty strings (MQTT_CLUSTER_MAX_FILTERS)"
                    % mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS)
    positions = obj.get("positions", [])
    if not isinstance(positions, list) or len(positions) > mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS:
        raise _fail("ROUTES positions must be a list of at most %d entries (MQTT_CLUSTER_MAX_POSITIONS)"
                    % mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS)
    out = []
    for p in positions:
        if not isinstance(p, list) or len(p) != 3 or not isinstance(p[0], str) or not p[0]:
            raise _fail("a ROUTES position is [topic, partition, offset], not %r" % (p,))
        out.append((p[0], _bounded(p[1], 0, 2**31 - 1, "partition"), _bounded(p[2], 0, 2**63 - 1, "offset")))
    retained = _bounded(obj.get("retained", -1), -1, 2**63 - 1, "retained offset")
    checks = obj.get("checks", [])
    if not isinstance(checks, list) or len(checks) not in (0, len(out)):
        raise _fail("ROUTES checks must be a list of one check per position")
    checks = tuple(_bounded(c, 0, 2**33 - 1, "check") for c in checks)
    more = obj.get("more", False)
    if not isinstance(more, bool):
        raise _fail("ROUTES more must be true or false, not %r" % (more,))
    version = _bounded(obj.get("version", 0), 0, 2**63 - 1, "route version")
    groups = _groups(obj.get("groups", []))
    weights = obj.get("weights", [])
    if not isinstance(weights, list) or len(weights) not in (0, len(groups)):
        raise _fail("ROUTES weights must be a list of one weight per group")
    weights = tuple(_bounded(w, 0, mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX,
                             "group weight (MQTT_CLUSTER_SHARE_WEIGHT_MAX)")
                    for w in weights)
    retained_check = _bounded(obj.get("retained_check", 0), 0, 2**33 - 1, "retained check")
    paths = obj.get("epoch_paths", [])
    if not isinstance(paths, list) or len(paths) not in (0, len(out)):
        raise _fail("ROUTES epoch_paths must be a list of one epoch path per position")
    return Routes(broker, tuple(filters), tuple(out), retained, groups, checks, more, version, weights,
                  retained_check, _epochs(obj.get("epochs"), len(out)),
                  _epochs([obj["retained_epoch"]], 1)[0] if "retained_epoch" in obj else NO_EPOCH,
                  tuple(_epoch_path(p, "epoch_paths") for p in paths),
                  _epoch_path(obj.get("retained_epoch_path", []), "retained_epoch_path"))


def _epoch_path(path, what):
    """One epoch path of a ROUTES (``Routes.epoch_paths``' item): at most MQTT_CLUSTER_EPOCHS_KEPT ``[epoch, origin,
    from]``; a fatal RemoteProtocolError for anything else."""
    if not isinstance(path, list) or len(path) > mqttcluster_limits.MQTT_CLUSTER_EPOCHS_KEPT or \
            not all(isinstance(x, list) and len(x) == 3 for x in path):
        raise _fail("ROUTES %s: an epoch path is a list of at most %d [epoch, origin, from] (MQTT_CLUSTER_EPOCHS_KEPT)"
                    % (what, mqttcluster_limits.MQTT_CLUSTER_EPOCHS_KEPT))
    return tuple((_bounded(x[0], 0, MAX_EPOCH_FIELD, what + " epoch"), _bounded(x[1], 0, MAX_EPOCH_FIELD,
                                                                                 what + " origin"),
                  _bounded(x[2], 0, 2**63 - 1, what + " offset")) for x in path)


def _epochs(epochs, positions):
    """A ROUTES "epochs" as ``Routes.epochs``: None when absent, else one ``(number, origin)`` per position (an empty
    list: none known); a fatal RemoteProtocolError for anything else."""
    if epochs is None:
        return None
    if not isinstance(epochs, list) or len(epochs) not in (0, positions) or \
            not all(isinstance(e, list) and len(e) == 2 for e in epochs):
        raise _fail("ROUTES epochs must be a list of one [epoch, origin] per position")
    return tuple((_bounded(e[0], 0, MAX_EPOCH_FIELD, "epoch"), _bounded(e[1], 0, MAX_EPOCH_FIELD, "epoch origin"))
                 for e in epochs)


def decode_records(payload):
    """A RECORDS frame whose entries are decoded as they are iterated (``RecordEntries``): a frame of
    MQTT_CLUSTER_FRAME_BYTES of tiny entries is hundreds of thousands of them, and its reader lets the other
    connections run between them as it copies them (``MqttCluster.apply``). ``payload``: a buffer nothing changes
    while the entries are read (the parser hands the frame's over), not copied."""
    if len(payload) < COUNT.size:
        raise _fail("RECORDS of %d bytes has no count" % len(payload))
    return Records(RecordEntries(payload))


class RecordEntries:
    """A RECORDS frame's entries, decoded (and checked) as iteration reaches them, WALK_RUN at a time by the one
    walk of a frame's bytes (``recordwalk.walk``): one that does not fit the frame, of an unknown kind or with a
    topic that is not UTF-8, or bytes left over after the last, raise a fatal ``RemoteProtocolError`` there (the
    entries before it stand: each was whole). A MESSAGE's or SHARED's data is a view of the frame (its record is
    copied once, where it is written), any other entry's bytes. Equal to the tuple of its entries."""

    __slots__ = ("_payload", "_count")

    def __init__(self, payload):
        self._payload = payload
        (self._count,) = COUNT.unpack_from(payload)

    def __len__(self):
        return self._count

    @property
    def payload(self):
        """The frame's payload (its count, then its entries' bytes), as the parser handed it over: read, not changed."""
        return self._payload

    def __eq__(self, other):
        if isinstance(other, (tuple, RecordEntries)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return "RecordEntries(%d entries, %d bytes)" % (self._count, len(self._payload))

    def __iter__(self):
        payload, count = self._payload, self._count
        n, at = 0, COUNT.size
        while True:  # (a frame of no entries too: bytes after its count are over)
            entries, at, problem = walk(payload, count, n, at, WALK_RUN)
            for entry in entries:
                yield Entry._make(entry)
            if problem is not None:
                raise _fail(problem)
            n += len(entries)
            if n >= count:
                return
