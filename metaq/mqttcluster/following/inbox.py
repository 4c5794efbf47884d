"""The inbox: where a broker keeps its copies of the peers' messages its MQTT sessions subscribe (``%MQTTIN%``).

A copy is the origin record seen as an MQTT message (``records.message_of``: a record put over text, RocketMQ or
HTTP is the message of topic name = its metaq topic) written again as an MQTT record (``records.record_data``), plus
``MQTT_ORIGIN`` = ``<broker id>:<partition>:<offset>:<topic>``, the origin record's place, and for a message the
origin assigned to this broker's ``$share`` groups ``MQTT_GROUPS`` (their JSON ``[[share name, filter], ...]``: only
those groups take it here, ``groups_of``). Its inbox partition is
chosen by (origin broker, topic, partition), so one origin partition keeps its order in one inbox partition.

``Positions`` are where each origin partition's copy resumes: one past the last copied offset, recovered at start
from the inbox itself (``recover``), so a link resumed after a restart copies nothing twice and skips nothing. A
partition followed before anything of it was copied gets a marker record once (``marker``: MQTT name
``MARKER_NAME``, a ``$`` name no client publishes and delivery never sends, with ``MQTT_NEXT`` = its resume
position), so that it too resumes where it was after a restart. A peer's slave holds the same offsets as the peer,
so the positions hold across its failover too; each position keeps the check of the origin record before it
(``MQTT_CHECK``, ``replication_mqtt.record_check``), which the origin proves before it resumes there. When it cannot
(an ``async`` master's failover gave those offsets to other messages) it resumes earlier, and a marker says so: a
marker sets its partition's position where it says, back too (``rewound``). Each copy and marker keeps the epoch of
the origin record at (before) its place too (``MQTT_EPOCH`` = ``<number>:<origin>``, as the origin's EPOCH entries
said): the position's epoch, which the origin answers with where that epoch ended in its history (a peer away through
two failovers in a row resumes before what the middle master wrote), and the epochs the copy went through with the
position it entered each at (``entered``: its epoch path, as the inbox holds it), which the origin answers no
further than where it entered the oldest of the latest ones its history does not hold. Pure but for ``recover``,
which reads the store (a worker thread's call: cold pages).
"""

import json
import logging
import zlib

from metaq import errors
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.following.records import (CHECK, EPOCH, GROUPS, NEXT, ORIGIN, kept_attribute,
                                                 place_properties)
from metaq.mqtt.records import message_of, named_message, record_data
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.protocol.journaltopic import MQTT_INBOX_TOPIC
from metaq.protocol.message import ATTRIBUTE_FLAG, decode_payload, encode_payload, with_attribute
from metaq.protocol.replication_mqtt import NO_EPOCH
from metaq.protocol.properties import encode_attribute, encode_properties, split_attribute

__all__ = ["INBOX", "ORIGIN", "NEXT", "CHECK", "EPOCH", "GROUPS", "MARKER_NAME", "entered", "partition_of", "copy_of",
           "copy_parts", "read_as", "as_is", "marker",
           "origin_of", "place_of", "groups_of", "Positions", "recover"]

log = logging.getLogger(__name__)

INBOX = MQTT_INBOX_TOPIC
#: The MQTT name of a marker record: a ``$`` name (the broker's: no client publishes it, MQTT delivery of the inbox
#: sends none).
MARKER_NAME = "$metaq/cluster/position"
#: Records one step of ``recover`` reads.
RECOVER_BATCH = 1024


def partition_of(origin, topic, partition, partitions=mqttcluster_limits.MQTT_CLUSTER_INBOX_PARTITIONS):
    """The inbox partition of the copies of ``origin``'s ``topic``-``partition``."""
    return zlib.crc32(b"%d:%d:%s" % (origin, partition, topic.encode("utf-8"))) % partitions


def copy_of(origin, topic, partition, offset, flag, data, now_ms, topics=DEFAULT_MAP, groups=(), check=0,
            epoch=NO_EPOCH):
    """``(flag, data)`` of the inbox copy of ``origin``'s record ``topic``-``partition`` at ``offset`` seen under the
    topic map ``topics`` (a cluster's brokers share their mqtt settings), for the ``$share`` groups ``groups`` too;
    None when the message expired (MQTT 5 Message Expiry) or cannot be kept as an MQTT record (logged)."""
    made = copy_parts(origin, topic, partition, offset, flag, data, now_ms, topics, groups, check, epoch)
    return None if made is None else (made[0], b"".join(made[1]))


def copy_parts(origin, topic, partition, offset, flag, data, now_ms, topics=DEFAULT_MAP, groups=(), check=0,
               epoch=NO_EPOCH):
    """``copy_of``'s answer with its data as pieces to join (``(flag, pieces)``). An MQTT record (one ``as_is``
    keeps) keeps its bytes: its attribute block with the copy's properties added, then its payload, neither decoded
    nor copied; any other record is made again as the MQTT message ``message_of`` reads in it. A third item,
    ``read``, is what ``as_is`` read of a record kept as it is (``read_as`` makes the copy's message from it without
    decoding the record again), None for a copy made again."""
    kept = as_is(origin, topic, partition, offset, flag, data, now_ms, topics, groups, check, epoch)
    if kept is not None:
        return kept or None
    m = message_of(topic, flag, data, topics)
    props = dict(m.properties)
    if m.expires_ms is not None:
        left = m.expires_ms - now_ms
        if left <= 0:
            return None
        props["message_expiry_interval"] = (left + 999) // 1000
    try:
        flag2, data2 = record_data(m.topic, m.payload, m.qos, m.client_id, props, m.retain, now_ms)
    except ValueError as exc:  # RecordRefusal: a name or client id a record cannot hold
        log.warning("mqtt cluster: broker %d's %s-%d@%d is not copied: %s", origin, topic, partition, offset, exc)
        return None
    attribute, payload = decode_payload(flag2, data2)
    tags, props2, _remoting = split_attribute(attribute)
    own = place_properties(ORIGIN, origin, topic, partition, offset, check, epoch) + _groups(groups)
    flag3, data3 = encode_payload(payload, encode_attribute(tags, props2) + own)
    return flag3, (data3,), None


def read_as(topic, flag, data, made):
    """``(metaq topic, flag, data, message)``: a record whose message (``records.message_of``) is that of the copy
    ``made`` (``copy_parts``' answer, or a ``marker``'s as one piece and None) of the origin record ``(flag, data)`` of
    ``topic``, read without joining the copy's pieces, and that message when it is known without decoding (else None):
    an MQTT record kept as it is (``as_is``) reads as its origin record (the properties the copy adds are none of its
    message's), its message made from what ``as_is`` read of it; any other as what it was made into (one piece)."""
    copy_flag, pieces, read = made
    if read is None:
        return INBOX, copy_flag, pieces[0], None
    name, props, end = read
    return topic, flag, data, named_message(name, props, bytes(data[end:]))


def as_is(origin, topic, partition, offset, flag, data, now_ms, topics=DEFAULT_MAP, groups=(), check=0,
          epoch=NO_EPOCH):
    """``(flag, pieces, read)`` of the copy of an MQTT record kept as it is (its attribute read, its payload a view of
    ``data``; ``read``: its MQTT topic name, its properties and where its payload starts in ``data``, which
    ``read_as`` makes its message of), ``()`` when it expired; None when the record is not one to keep as it is
    (``records.kept_attribute`` says which are). Its attribute is the record's, then the copy's place, check and epoch
    (``records.place_properties``, as the one-step copy writes them), then its ``groups``."""
    kept = kept_attribute(topic, flag, data, now_ms, topics)
    if not kept:
        return kept
    attribute, name, props, end = kept
    own = place_properties(ORIGIN, origin, topic, partition, offset, check, epoch) + _groups(groups)
    # the flag every copy has
    return ATTRIBUTE_FLAG, with_attribute(data, end, (attribute + own).encode("utf-8")), (name, props, end)


def _groups(groups):
    """The copy's ``GROUPS`` property, encoded ("" for none): the ``$share`` groups it was copied for."""
    if not groups:
        return ""
    return encode_properties({GROUPS: json.dumps([list(g) for g in groups], separators=(",", ":"))})


def marker(origin, topic, partition, next_offset, now_ms, check=0, epoch=NO_EPOCH):
    """``(flag, data)`` of the marker record saying ``origin``'s ``topic``-``partition`` resumes at ``next_offset``
    (``check``, ``epoch``: of the origin record before it, 0 and NO_EPOCH: none)."""
    flag, data = record_data(MARKER_NAME, b"", 0, None, None, False, now_ms)
    attribute, payload = decode_payload(flag, data)
    tags, props, _remoting = split_attribute(attribute)
    own = place_properties(NEXT, origin, topic, partition, next_offset, check, epoch)
    return encode_payload(payload, encode_attribute(tags, props) + own)


def origin_of(flag, data):
    """``(origin broker, topic, partition, offset)`` of an inbox record: a copy's origin record, or for a marker
    the offset before its resume position (-1: from the start); None when it names none."""
    place = place_of(flag, data)
    return None if place is None else place[0]


def place_of(flag, data):
    """``(origin_of's answer, check, is a marker, epoch)`` of an inbox record (check 0: none; epoch NO_EPOCH: none),
    None when it names none."""
    try:
        attribute, _payload = decode_payload(flag, data)
    except ValueError:
        return None
    _tags, props, _remoting = split_attribute(attribute)
    value, back = props.get(ORIGIN), 0
    if value is None:
        value, back = props.get(NEXT), 1
    if value is None:
        return None
    parts = value.split(":", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return None
    check = props.get(CHECK, "0")
    epoch = props.get(EPOCH, "").split(":")
    epoch = (int(epoch[0]), int(epoch[1])) if len(epoch) == 2 and all(e.isdigit() for e in epoch) else NO_EPOCH
    return (int(parts[0]), parts[3], int(parts[1]), int(parts[2]) - back), int(check) if check.isdigit() else 0, \
        bool(back), epoch


def groups_of(flag, data):
    """The ``$share`` groups ((share name, filter), ...) an inbox record was copied for (empty: none)."""
    try:
        attribute, _payload = decode_payload(flag, data)
        value = split_attribute(attribute)[1].get(GROUPS)
        if value is None:
            return ()
        return tuple(tuple(g) for g in json.loads(value) if isinstance(g, list) and len(g) == 2)
    except ValueError:
        return ()


def entered(path, epoch, before, offset, rewound=False, most=mqttcluster_limits.MQTT_CLUSTER_EPOCHS_KEPT):
    """A copy's epoch path, ``((number, origin, from), ...)`` oldest first, the last its position's, once the origin
    record at ``offset`` of ``epoch`` was copied or passed (``before``: the position then, None: none; ``rewound``:
    the position went back to it). An epoch is entered at the position the copy had then (what it passed unread of
    it counts); a rewind drops the epochs entered past its record; at most ``most`` kept, the oldest dropped; () for
    NO_EPOCH."""
    if tuple(epoch) == NO_EPOCH:
        return ()
    here = max(offset, 0)
    if rewound:
        path = tuple(x for x in path if x[2] <= here)
    if path and path[-1][:2] == tuple(epoch):
        return path
    start = here if before is None else min(before, here)
    return (path + ((epoch[0], epoch[1], start),))[-most:]


class Positions:
    """Where each origin partition's copy resumes: ``{(origin, topic, partition): next offset}``, at most
    ``most`` of them (past it the new one is not kept: its copy then resumes where the peer decides, its end, and
    it is logged once); with each the check and the epoch of the origin record before it and its epoch path
    (``entered``), and the epoch the origin last told of its records from an offset on (``told``: one per position,
    the same bound)."""

    def __init__(self, most=mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS):
        self.most = most
        self._next = {}
        self._checks = {}  # key -> the check of the origin record before its next offset (absent: none)
        self._epochs = {}  # key -> (number, origin) of the epoch of that record (absent: none known)
        self._paths = {}  # key -> its epoch path (``entered``), the last entry that epoch's
        self._told = {}  # key -> (offset, (number, origin)): the origin's records from that offset on are of it
        self._kept = set()  # the keys an inbox record (a copy or a marker) holds the position of
        self.refused = 0

    def __len__(self):
        return len(self._next)

    def get(self, origin, topic, partition):
        return self._next.get((origin, topic, partition))

    def kept(self, origin, topic, partition):
        """True when an inbox record holds this partition's position (a restart finds it)."""
        return (origin, topic, partition) in self._kept

    def keep(self, origin, topic, partition):
        self._kept.add((origin, topic, partition))

    def told(self, origin, topic, partition, offset, epoch):
        """The origin's records of ``topic``-``partition`` from ``offset`` on are of ``epoch`` (an EPOCH entry);
        False when the partition has no position and the bound is reached (its epoch is then not known)."""
        key = (origin, topic, partition)
        if key not in self._next and key not in self._told and len(self._told) >= self.most:
            return False
        self._told[key] = (offset, tuple(epoch))
        return True

    def untold(self, origin):
        """A new link to ``origin`` begins: what its last one told of epochs holds no more (the new one tells again)."""
        for key in [k for k in self._told if k[0] == origin]:
            del self._told[key]

    def epoch_at(self, origin, topic, partition, offset):
        """The epoch of the origin's record ``offset``: as told when it is at or past the told offset, else the one kept
        with the position when it is the record before it; NO_EPOCH: none known (an origin of the version before the
        epochs tells none)."""
        key = (origin, topic, partition)
        told = self._told.get(key)
        if told is not None and told[0] <= offset:
            return told[1]
        return self._epochs.get(key, NO_EPOCH) if self._next.get(key) == offset + 1 else NO_EPOCH

    def plain(self, origin, topic, partition, offset):
        """The epoch of the origin's record ``offset`` (``epoch_at``'s) when copying it is all there is to do: an inbox
        record holds its partition's position, at or before ``offset`` (nothing of it copied yet, nothing to mark);
        None otherwise (``MqttCluster.apply``'s general path decides)."""
        key = (origin, topic, partition)
        nxt = self._next.get(key)
        if nxt is None or offset < nxt or key not in self._kept:
            return None
        return self.epoch_at(origin, topic, partition, offset)

    def copied(self, origin, topic, partition, offset, check=0, rewound=False, epoch=None, trimmed=False):
        """The record at ``offset`` was copied (or read and not wanted; -1: none yet, the copy starts at 0), its
        ``record_check`` ``check`` (0: none), its ``epoch`` (None: as ``epoch_at`` says): the copy resumes past it.
        ``rewound``: there even when it had gone further (the origin resumed it there: what it had copied past it is
        not the origin's now). ``trimmed``: copies before it may have been removed (a recovery from an inbox that
        retention trimmed): where the copy entered its first epoch is not known, and is said to be 0."""
        key = (origin, topic, partition)
        old = self._next.get(key)
        if old is None and len(self._next) >= self.most:
            if not self.refused:
                log.warning("mqtt cluster: %d resume positions is the limit (MQTT_CLUSTER_MAX_POSITIONS): broker "
                            "%d's %s-%d is not remembered", self.most, origin, topic, partition)
            self.refused += 1
            return False
        if old is None or offset + 1 > old or rewound:
            if epoch is None:
                epoch = self.epoch_at(origin, topic, partition, offset)
            self._next[key] = offset + 1
            if check:
                self._checks[key] = check
            else:
                self._checks.pop(key, None)
            if tuple(epoch) != NO_EPOCH:
                epoch = tuple(epoch)
                self._paths[key] = entered(self._paths.get(key, ()), epoch, 0 if old is None and trimmed else old,
                                           offset, rewound)
                self._epochs[key] = epoch
            else:
                self._epochs.pop(key, None)
                self._paths.pop(key, None)
        return True

    def is_copied(self, origin, topic, partition, offset):
        """True when the record at ``offset`` is behind the resume position (a copy of it exists, or it was passed)."""
        nxt = self._next.get((origin, topic, partition))
        return nxt is not None and offset < nxt

    def of(self, origin):
        """``((topic, partition, next offset), ...)`` of ``origin``'s partitions."""
        return tuple((t, p, o) for (b, t, p), o in self._next.items() if b == origin)

    def checks(self, origin, positions):
        """The check of each of ``positions`` (``of(origin)``'s answer), 0 for none."""
        return tuple(self._checks.get((origin, t, p), 0) for t, p, _o in positions)

    def epochs(self, origin, positions):
        """The epoch ``(number, origin)`` of each of ``positions`` (``of(origin)``'s answer), NO_EPOCH for none."""
        return tuple(self._epochs.get((origin, t, p), NO_EPOCH) for t, p, _o in positions)

    def epoch_paths(self, origin, positions):
        """The epoch path (``entered``) of each of ``positions`` (``of(origin)``'s answer), () for none."""
        return tuple(self._paths.get((origin, t, p), ()) for t, p, _o in positions)


def recover(store, positions):
    """Fill ``positions`` from the inbox's records (each partition read from its start); returns how many were read.
    Blocking reads: a worker thread's call."""
    read = 0
    for partition in range(store.partitions_of(INBOX)):
        offset = store.min_offset(INBOX, partition)
        trimmed = offset > 0  # retention removed copies: the first one left of an origin partition may not be its first
        end = store.max_offset(INBOX, partition)
        while offset < end:
            try:
                records, _nxt = store.read_records(INBOX, partition, offset, RECOVER_BATCH,
                                                   mqttcluster_limits.MQTT_CLUSTER_BATCH_BYTES)
            except (errors.Moved, errors.CorruptRecord) as exc:  # go on from where it says
                nxt = exc.offset if isinstance(exc, errors.Moved) else exc.next_offset
                if nxt is None or nxt <= offset:
                    log.warning("mqtt cluster: the inbox %s-%d could not be read past %d: %s", INBOX, partition,
                                offset, exc)
                    break
                offset = nxt
                continue
            if not records:
                break
            for rec in records:
                place = place_of(rec.flag, rec.data)
                if place is not None:
                    origin, check, is_marker, epoch = place
                    positions.copied(*origin, check=check, rewound=is_marker, epoch=epoch,  # in order: a marker says
                                     trimmed=trimmed)
                    positions.keep(*origin[:3])
                read += 1
            offset = records[-1].queue_offset + 1
    return read
