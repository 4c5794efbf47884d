"""A RECORDS frame of plain copies taken in one step (``MqttCluster.apply``'s common case, docs/architecture.md "MQTT
across the cluster"): compiled with Cython where it is built (``metaq.native``), this source itself elsewhere.

A frame is plain when each of its entries is a MESSAGE of an MQTT record ``inbox.as_is`` keeps as it is (named by
the topic map, not expired), of a partition whose position an inbox record holds, at or past that position and past
the frame's entry before it of that partition: then ``take`` walks the frame's bytes once, writes the copies with
the put path's burst writer in one append, moves each partition's position once (to its last copy) and hands back
what the cluster makes visible and serves. Any other frame (an EPOCH, a POSITION, SHARED, RETAINED or ROUTED entry,
a copy to make again, a frame that is not well formed) is left whole to the general path, which reads it entry by
entry and says what is wrong with it. A copy's bytes are those ``inbox.copy_parts`` makes: both read the record and
write the copy's own properties with ``records.py``'s functions (tests compare them).
"""

from zlib import crc32

from metaq.mqtt.records import named_message
from metaq.mqttcluster.following.inbox import INBOX, partition_of
from metaq.mqttcluster.following.records import ORIGIN, kept_attribute, place_properties
from metaq.protocol.message import ATTRIBUTE_FLAG
from metaq.protocol.recordwalk import COUNT, MESSAGE, walk
from metaq.protocol.replication_mqtt import record_check
from metaq.serving.putpath import AUTHORIZED
from metaq.store.record import FIXED_OVERHEAD

#: A copy's record in the log past its data: the record's fixed part and the inbox's name (``store.record``).
_OVERHEAD = FIXED_OVERHEAD + len(INBOX)
_INBOX_TOPIC = INBOX.encode("ascii")


def messages_of(payload):
    """The entries ``(kind, topic, partition, offset, flag, store time, data)`` of a RECORDS frame's payload whose
    entries are all MESSAGEs and well formed (``recordwalk.walk``: the data a view of ``payload``); None for any
    other frame (the general path's, which reads it and raises for a frame that is not well formed)."""
    if len(payload) < COUNT.size:
        return None
    (count,) = COUNT.unpack_from(payload, 0)
    entries, _at, problem = walk(payload, count, 0, COUNT.size, count)
    if problem is not None:
        return None
    message = MESSAGE
    for entry in entries:
        if entry[0] != message:
            return None
    return entries


def kept_copy(origin, topic, partition, offset, flag, data, now_ms, topics, check, epoch):
    """``(attribute block, MQTT topic name, properties, where the payload starts in data)`` of the copy of an MQTT
    record ``inbox.as_is`` keeps as it is, with no ``$share`` groups: the block (its length, then the record's
    attribute with the copy's own properties: ``records.kept_attribute``, ``records.place_properties``, as ``as_is``
    makes it) is what goes before the record's payload; None when ``as_is`` would not keep it so (or it expired, or
    its topic cannot be a property's value): the general path copies it."""
    kept = kept_attribute(topic, flag, data, now_ms, topics)
    if not kept:
        return None
    attribute, name, props, end = kept
    try:
        own = place_properties(ORIGIN, origin, topic, partition, offset, check, epoch)
    except ValueError:  # the general path raises it
        return None
    block = (attribute + own).encode("utf-8")
    return len(block).to_bytes(4, "big") + block, name, props, end


def take(origin, payload, now, positions, path, topics, most_served):
    """Take the RECORDS frame ``payload`` of peer ``origin`` in one step when it is plain (the module doc): its copies
    appended to the inbox with ``path``'s burst writer (``PutPath.append_burst``, its refusal asked first: raised as
    the general path raises it), counted, and the positions (``inbox.Positions``) moved once per partition past the
    last copy the burst took. Returns None when the frame is not plain or the burst writer took none of it (nothing
    done: the general path's), else ``(copied, whole, keys, ends, copies)``: how many were copied, whether that is the
    whole frame (if not, the burst writer stopped: the general path copies the rest, passing over the copies taken,
    which the positions hold), the ``(topic, partition)`` of the inbox partitions written, ``[(inbox partition, the
    offset after its last copy)]``, and ``{key: copies}`` as ``MqttPort.serve_copies`` takes them when the frame holds
    at most ``most_served`` copies (None otherwise: their readers are woken)."""
    entries = messages_of(payload)
    if not entries:
        return None
    src, frames, made, last = bytearray(), [], [], {}
    for _kind, topic, partition, offset, flag, ts, data in entries:
        place = (topic, partition)
        if offset <= last.get(place, -1):
            return None
        epoch = positions.plain(origin, topic, partition, offset)
        if epoch is None:
            return None
        check = record_check(ts, data)
        kept = kept_copy(origin, topic, partition, offset, flag, data, now, topics, check, epoch)
        if kept is None:
            return None
        block, name, props, end = kept
        last[place] = offset
        tail = data[end:]
        start = len(src)
        src += block
        frames.append((_INBOX_TOPIC, partition_of(origin, topic, partition), ATTRIBUTE_FLAG, 0, start,
                       len(block) + len(tail), crc32(tail, crc32(block)), 0, tail))
        made.append((topic, partition, offset, flag, data, name, props, end, check, epoch))
    path.check_write(INBOX, AUTHORIZED, True)
    taken, written = path.append_burst(frames, src, now)
    if not taken:
        return None
    keys, ends = set(), []
    copies = {} if len(frames) <= most_served else None
    for run_key, count, nbytes, first_id, first_offset, first, log_end in written:
        path.counted(INBOX, count, nbytes)
        keys.add(run_key)
        ends.append((run_key[1], first_offset + count))
        if copies is not None:  # a run's records lie one after the other, ending at its log end
            served = copies.setdefault(run_key, [])
            position = log_end - nbytes - count * _OVERHEAD
            for k in range(count):
                topic, _partition, _offset, flag, data, name, props, end, _check, _epoch = made[first + k]
                served.append((first_offset + k, (position, first_id + k), topic, flag, data,
                               named_message(name, props, bytes(data[end:]))))
                position += _OVERHEAD + frames[first + k][5]
    moved = {}
    for i in range(taken):
        moved[(made[i][0], made[i][1])] = i
    for i in moved.values():
        topic, partition, offset, _flag, _data, _name, _props, _end, check, epoch = made[i]
        positions.copied(origin, topic, partition, offset, check, False, epoch)
    return taken, taken == len(frames), keys, ends, copies
