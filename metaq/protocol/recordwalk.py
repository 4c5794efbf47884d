"""A RECORDS frame's entries read from its payload: the one walk of their bytes (``replication_mqtt``'s layout),
compiled with Cython where it is built (``metaq.native``), this source itself elsewhere.

Both readers of a frame take it: ``replication_mqtt.RecordEntries`` (the general path, which raises at the first
entry that is not well formed, those before it standing) and ``mqttcluster.following.copyturn`` (the one-step copy
of a frame of plain MESSAGEs, which leaves any other frame to the general path). Sans-IO.
"""

import struct

__all__ = ["MESSAGE", "POSITION", "RETAINED", "SHARED", "ROUTED", "EPOCH", "COUNT", "ENTRY", "walk"]

#: The entries' kinds: 1 to 6, none other.
MESSAGE, POSITION, RETAINED, SHARED, ROUTED, EPOCH = 1, 2, 3, 4, 5, 6
#: A frame's payload begins with its entry count; each entry is this fixed part (kind, topic length, partition,
#: flag, offset, store time, data length), then its topic (UTF-8) and its data.
COUNT = struct.Struct(">I")
ENTRY = struct.Struct(">BHiiqqI")
_ENTRY_BYTES = ENTRY.size


def walk(payload, count, n, at, most):
    """``(entries, at, problem)``: entries ``n`` on of a RECORDS frame's ``payload`` (its ``count``, then its
    entries), the first at byte ``at``, at most ``most`` of them: ``entries`` a list of ``(kind, topic, partition,
    offset, flag, store time, data)``, each checked (a known kind, a UTF-8 topic, a partition and offset not
    negative, within the frame), up to the first that is not; ``at`` where the next begins; ``problem`` why that one
    (or the bytes left over after the frame's last) is not well formed, else None. A MESSAGE's or SHARED's data is a
    view of ``payload`` (the record is copied once, where it is written), any other entry's bytes. A reader walks a
    large frame a run of entries at a time, sharing the loop between them."""
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    end = len(view)
    last = min(count, n + most)
    message, shared, epoch, head = MESSAGE, SHARED, EPOCH, _ENTRY_BYTES  # (compiled: C integers, read once)
    entries = []
    while n < last:
        if at + head > end:
            return entries, at, "RECORDS entry %d runs past the frame" % n
        kind, tlen, partition, flag, offset, ts, dlen = ENTRY.unpack_from(view, at)
        if not message <= kind <= epoch or partition < 0 or offset < 0:
            return entries, at, "RECORDS entry of kind %d, partition %d, offset %d" % (kind, partition, offset)
        if at + head + tlen + dlen > end:
            return entries, at, "RECORDS entry %d runs past the frame" % n
        at += head
        try:
            topic = str(view[at:at + tlen], "utf-8")
        except UnicodeDecodeError:
            return entries, at - head, "a RECORDS topic is not UTF-8"
        at += tlen
        if kind == message or kind == shared:
            data = view[at:at + dlen]
        else:
            data = bytes(view[at:at + dlen])
        at += dlen
        entries.append((kind, topic, partition, offset, flag, ts, data))
        n += 1
    if n == count and at != end:
        return entries, at, "RECORDS of %d entries leaves %d bytes over" % (count, end - at)
    return entries, at, None
