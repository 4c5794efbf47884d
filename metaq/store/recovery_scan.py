"""Recovery's scan of one segment in batches: the valid records' index units, grouped into runs.

``scan_log(buf, rel, size, base, max_records)`` checks the records of a segment's bytes ``buf`` from ``rel``
(each as ``record.check_record`` does: magic, sizes, CRC) and stops at the first that fails, at ``size``, or
after ``max_records`` records. It returns ``(stop, count, max_msg_id, units, runs)``:

* ``stop``: where it stopped, relative to the segment (the first record not valid, or the one after the
  ``max_records``-th, or what is left before ``size`` when too short for a record);
* ``count``: how many valid records lie before it (from ``rel``);
* ``max_msg_id``: the largest msgId among them (None without records);
* ``units``: their index units (``index.UNIT``: log position = ``base`` + relative position, size, tag hash),
  run after run;
* ``runs``: one ``(topic_bytes, partition, first_offset, unit_start, n)`` per run: records of one
  topic-partition with consecutive queue offsets, ``n`` units from unit ``unit_start`` of ``units``, in the
  order the runs began. A record whose offset does not follow its partition's previous one begins a new run,
  so the runs of one partition are in log order and writing them in order leaves each unit as the last record
  of that offset made it.

Why the scan stopped is not its concern: ``recovery.stop_reason`` reads it from the bytes at ``stop``.

``write_units(dst, at, src, src_at, n)`` makes the ``n`` units at byte ``at`` of ``dst`` (an index file's map)
equal those at ``src_at`` of ``src`` and returns how many differed (each rewritten).

Both are in the C helper (``native/recovery.c``); these are their exact pure-Python twins.
"""

from metaq import speedups
from metaq.protocol.checksum import crc32
from metaq.protocol.message import HEADER
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import CRC_START, FIXED_OVERHEAD, MESSAGE_MAGIC, MIN_RECORD, PREFIX, TOPIC_START, tag_hash

_INT64_MAX = (1 << 63) - 1


def scan_log_py(buf, rel, size, base, max_records):
    if not (0 <= rel <= size <= len(buf)) or max_records < 1:
        raise ValueError("need 0 <= rel <= size <= %d and max_records >= 1" % len(buf))
    if not 0 <= base <= _INT64_MAX - size:
        raise ValueError("a segment's base must be from 0 to 2**63-1 less its size, not %d" % base)
    unpack_prefix, unpack_header, pack_unit = PREFIX.unpack_from, HEADER.unpack_from, UNIT.pack
    view = memoryview(buf)
    current = {}  # (topic bytes, partition) -> its open run: [topic, partition, first, last, [units]]
    runs = []
    count, max_id = 0, None
    while count < max_records and size - rel >= MIN_RECORD:
        # record.check_record, inlined (this runs once per record)
        total, magic, crc, part, qoff, _s, _b, tlen = unpack_prefix(buf, rel)
        if magic != MESSAGE_MAGIC or total < MIN_RECORD or total > size - rel or tlen < 1 \
                or FIXED_OVERHEAD + tlen > total:
            break
        h = rel + TOPIC_START + tlen
        msg_len, _chk, msg_id, flag = unpack_header(buf, h)
        if FIXED_OVERHEAD + tlen + msg_len != total or crc32(view[rel + CRC_START:rel + total]) != crc:
            break
        if max_id is None or msg_id > max_id:
            max_id = msg_id
        topic = bytes(buf[rel + TOPIC_START:h])
        key = (topic, part)
        run = current.get(key)
        if run is None or run[3] == _INT64_MAX or qoff != run[3] + 1:
            run = current[key] = [topic, part, qoff, qoff, []]
            runs.append(run)
        run[3] = qoff
        run[4].append(pack_unit(base + rel, total, tag_hash(flag, buf[h + 20:rel + total]) if flag & 1 else 0))
        count += 1
        rel += total
    view.release()
    out, units = [], []
    for topic, part, first, _last, us in runs:
        out.append((topic, part, first, len(units), len(us)))
        units.extend(us)
    return rel, count, max_id, b"".join(units), out


def write_units_py(dst, at, src, src_at, n):
    if n < 0 or at < 0 or src_at < 0 or at + n * UNIT_SIZE > len(dst) or src_at + n * UNIT_SIZE > len(src):
        raise ValueError("units out of range")
    end = n * UNIT_SIZE
    new = bytes(src[src_at:src_at + end])
    if dst[at:at + end] == new:
        return 0
    changed = 0
    for i in range(0, end, UNIT_SIZE):
        unit = new[i:i + UNIT_SIZE]
        if dst[at + i:at + i + UNIT_SIZE] != unit:
            dst[at + i:at + i + UNIT_SIZE] = unit
            changed += 1
    return changed


scan_log = speedups.load("scan_log", scan_log_py)
write_units = speedups.load("write_units", write_units_py)
