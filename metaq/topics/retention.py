"""Per-topic retention (the table's ``retention_hours`` and ``retention_bytes``, table.py): a logical start.

The commit log is shared by every topic, so one topic's retention cannot delete a segment that may hold another
topic's records. Per-topic retention therefore moves the topic's first offset (each partition's ``min``): the
messages below it are no longer served (a get answers as below the minimum: ``Moved`` to the new first offset,
RocketMQ's OFFSET_TOO_SMALL), and the partition's index files wholly below it are deleted at once. Their records'
bytes in the commit log are freed when the broker's own retention (``store.retention_hours``, or the disk
pressure rule) deletes their segments: that retention stays the upper bound for every topic.

- ``retention_hours``: messages stored more than that long ago go (fractions of an hour allowed);
- ``retention_bytes``: each of the topic's N partitions keeps its newest messages totalling at most B/N bytes of
  records (the record's size in the log), so the topic keeps at most B bytes; the newest message of a partition is
  kept even if it alone is larger.

Applied by the retention task (``MessageStore.retention``) and once at open, so it holds across restarts. It only
ever raises ``min``, never past the visible end, and never for a topic without such a setting.
"""

from metaq.store.lookup import offset_by_time

_CHUNK = 4096


def bytes_floor(p, budget):
    """The first offset of ``p`` such that the records from it to the visible end total at most ``budget`` bytes
    (the last record is always kept)."""
    hi = p.visible
    total = 0
    while hi > p.min:
        lo = max(p.min, hi - _CHUNK)
        sizes = [size for _n, _pos, size, _tag in p.units(lo, hi)]
        for i in range(len(sizes) - 1, -1, -1):
            total += sizes[i]
            if total > budget:
                return min(lo + i + 1, p.visible - 1)
        hi = lo
    return p.min


def floor_of(log_, p, settings, now_ms):
    """The new first offset of partition ``p`` under the topic's ``settings`` (never below ``p.min``)."""
    floor = p.min
    if p.visible <= p.min:
        return floor
    if settings.retention_hours is not None:
        floor = max(floor, offset_by_time(log_, p, now_ms - int(settings.retention_hours * 3600_000)))
    if settings.retention_bytes is not None:
        floor = max(floor, bytes_floor(p, max(1, settings.retention_bytes // max(1, settings.partitions))))
    return min(floor, p.visible)


def apply_topic_retention(log_, parts, entries, now_ms, raised=None):
    """Raise the first offset of every partition of a topic with its own retention; returns the index files
    deleted. ``raised``: a dict that gets ``(topic, partition) -> new min`` for each partition moved."""
    deleted = []
    for key, p in list(parts.items()):
        s = entries.get(key[0])
        if s is None or (s.retention_hours is None and s.retention_bytes is None):
            continue
        new_min = floor_of(log_, p, s, now_ms)
        if new_min > p.min:
            p.min = new_min
            p.log_bytes = None
            if raised is not None:
                raised[key] = new_min
        deleted.extend(p.delete_files_below(p.min))
    return deleted
