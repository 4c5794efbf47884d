"""The ``metaq`` source's rows as Arrow record batches, built straight from ``get`` replies (no Python object per row).

Both sources' ``read`` (batch and streaming) yield ``pyarrow.RecordBatch``es with the columns and values of
:mod:`metaq.spark.rows` (``ARROW_SCHEMA`` is ``SCHEMA_DDL`` as Spark converts it). Each reply is scanned once
by ``protocol.message.scan_reply`` (the C helper when built: checksums checked, an index of every record's id,
flag and where its payload lies), and the columns come from that index: ``value`` gathered by
``gather_payloads`` into one buffer with int32 offsets, ``msg_id`` / ``offset`` / ``timestamp`` as numpy
arrays, ``topic`` / ``partition`` repeated, and for records without an attribute block null ``attribute`` /
``key`` and an empty ``properties`` map. Only records with an attribute block (RocketMQ producers, tags,
properties) are decoded one by one, as :func:`metaq.spark.rows.row_of` decodes them.

While a reply is turned into columns, the request for the next one is already on its way. A batch holds at
most ``max_rows`` rows (the ``maxRecordsPerBatch`` option, 1 .. ``limits.MAX_ARROW_BATCH_ROWS``): a reply with
more records is cut. The data-loss rules are those of :func:`metaq.spark.rows.read_rows`; a reply that does not
scan (a checksum mismatch, a negative length) or holds no whole record raises RemoteProtocolError naming the
range and offset.
"""

import numpy as np
import pyarrow as pa

from metaq import errors
from metaq.spark import limits as spark_limits
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.fetcher import records_of
from metaq.protocol import events as ev
from metaq.protocol.message import gather_payloads, raise_fault, scan_reply
from metaq.protocol.msgid import TIMESTAMP_SHIFT, TWEPOCH
from metaq.protocol.properties import PROP_KEYS, split_attribute, stored_payload
from metaq.spark.rows import DEFAULT_FETCH_BYTES, READER_GROUP, data_lost

__all__ = ["ARROW_SCHEMA", "DEFAULT_BATCH_ROWS", "batch_rows_option", "read_batches", "reply_batches",
           "scan_checked"]


#: Rows of one Arrow batch unless ``maxRecordsPerBatch`` says otherwise (Spark's own Arrow batches default to it).
DEFAULT_BATCH_ROWS = 10_000

#: ``rows.SCHEMA_DDL`` as Spark converts it to Arrow (timestamps in microseconds, UTC): what ``read`` must yield.
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.string()), ("offset", pa.int64()), ("msg_id", pa.int64()),
    ("attribute", pa.string()), ("value", pa.binary()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("key", pa.string()), ("properties", pa.map_(pa.string(), pa.string())),
])

_Q = 6 * 8  # bytes of one record in a scan_reply index
_PROPS_TYPE = ARROW_SCHEMA.field("properties").type


def batch_rows_option(opts):
    """The ``maxrecordsperbatch`` option of ``opts`` (lower-case keys): 1 .. MAX_ARROW_BATCH_ROWS, else ValueError."""
    value = opts.get("maxrecordsperbatch")
    if value in (None, ""):
        return DEFAULT_BATCH_ROWS
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ValueError("option maxRecordsPerBatch must be an integer, got %r" % (value,)) from None
    if not 1 <= value <= spark_limits.MAX_ARROW_BATCH_ROWS:
        raise ValueError("option maxRecordsPerBatch must be 1..%d, got %d" % (spark_limits.MAX_ARROW_BATCH_ROWS, value))
    return value


def _empty_maps(n):
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                                   pa.array([], pa.string()), type=_PROPS_TYPE)


def _decoded(body, q, count, what, first):
    """``(attribute, key, properties, values)`` lists for a reply with attribute blocks, as ``row_of`` gives them
    (``values``: None, or every payload when one differs from the record's bytes: a compressed old record)."""
    attrs, keys, props = [None] * count, [None] * count, [[] for _ in range(count)]
    values = None
    for k in np.flatnonzero(q[:, 1] & 1).tolist():
        a0, a1, p0, p1 = (int(x) for x in q[k, 2:6])
        if a0 < 0:
            raise errors.RemoteProtocolError("%s: the record at offset %d has a malformed attribute block"
                                             % (what, first + k))
        attribute = bytes(body[a0:a1]).decode("utf-8", "replace")
        tags, properties, from_remoting = split_attribute(attribute)
        if from_remoting:
            attribute = tags
            payload = body[p0:p1]
            stored = stored_payload(properties, payload)
            if stored is not payload:
                if values is None:
                    values = [bytes(body[int(s):int(e)]) for s, e in q[:, 4:6].tolist()]
                values[k] = bytes(stored)
            properties = {name: v for name, v in properties.items() if not name.startswith("@")}
        attrs[k], keys[k], props[k] = attribute, properties.get(PROP_KEYS), list(properties.items())
    return attrs, keys, props, values


def reply_batches(topic, key, first_offset, body, index, count, max_rows):
    """The Arrow batches (at most ``max_rows`` rows each) of the first ``count`` records a ``scan_reply`` index of
    ``body`` names, the first at ``first_offset`` of partition ``key`` ("b-p") of ``topic``."""
    q_all = np.frombuffer(index, dtype=np.int64, count=6 * count).reshape(count, 6)
    for lo in range(0, count, max_rows):
        n = min(max_rows, count - lo)
        q = q_all[lo:lo + n]
        ids = q[:, 0].copy()
        offsets, data = gather_payloads(body, memoryview(index)[lo * _Q:(lo + n) * _Q], n)
        value = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        micros = ((ids >> TIMESTAMP_SHIFT) + TWEPOCH) * 1000
        if (q[:, 1] & 1).any():
            attrs, keys, props, values = _decoded(body, q, n, "%s %s" % (topic, key), first_offset + lo)
            attribute, key_col = pa.array(attrs, pa.string()), pa.array(keys, pa.string())
            properties = pa.array(props, _PROPS_TYPE)
            if values is not None:
                value = pa.array(values, pa.binary())
        else:
            attribute = key_col = pa.nulls(n, pa.string())
            properties = _empty_maps(n)
        yield pa.RecordBatch.from_arrays([
            pa.repeat(pa.scalar(topic, pa.string()), n), pa.repeat(pa.scalar(key, pa.string()), n),
            pa.array(np.arange(first_offset + lo, first_offset + lo + n, dtype=np.int64)), pa.array(ids),
            attribute, value, pa.Array.from_buffers(ARROW_SCHEMA.field("timestamp").type, n,
                                                    [None, pa.py_buffer(micros)]),
            key_col, properties], schema=ARROW_SCHEMA)


def scan_checked(body, what, offset):
    """``(index, count)`` of a ``get`` reply ``body`` whose first record is at ``offset`` (``scan_reply``, checksums
    checked); RemoteProtocolError naming ``what`` and ``offset`` for a reply that does not scan (a checksum mismatch,
    a negative length) or holds no whole record (a cut-off final record is normal: the next get starts there)."""
    index, count, _stop, fault = scan_reply(body)
    if fault is not None:
        try:
            raise_fault(fault)
        except errors.RemoteProtocolError as exc:
            raise errors.RemoteProtocolError("%s: the reply from offset %d does not scan: %s"
                                             % (what, offset, exc)) from None
    if count == 0:
        raise errors.RemoteProtocolError("%s: the reply from offset %d holds no whole record (%d bytes, cut off)"
                                         % (what, offset, len(body)))
    return index, count


def read_batches(r, fetch_bytes=DEFAULT_FETCH_BYTES, timeout=30.0, security=None, fail_on_data_loss=True,
                 max_rows=DEFAULT_BATCH_ROWS):
    """Yield Arrow batches of every offset of the range ``r`` (``[r.start, r.end)``), in order: exactly ``r.count``
    rows, the rows ``read_rows`` yields, or an exception. DataLoss / skipped offsets as ``read_rows``; a reply that
    fails its scan (checksum, length) or holds no whole record raises RemoteProtocolError."""
    if not 1 <= max_rows <= spark_limits.MAX_ARROW_BATCH_ROWS:
        raise ValueError("max_rows must be 1..%d, got %r" % (spark_limits.MAX_ARROW_BATCH_ROWS, max_rows))
    if r.count <= 0:
        return
    key = "%d-%d" % (r.broker_id, r.partition)
    conn = BrokerConnection(r.url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                            security=client_security.resolve(security))

    def ask(at):
        return conn.request(ev.Get(r.topic, READER_GROUP, r.partition, at, fetch_bytes, 0), timeout)

    try:
        offset, pending = r.start, ask(r.start)
        while offset < r.end:
            reply, pending = pending.result(timeout + 1.0), None
            if not isinstance(reply, ev.Value):
                try:
                    records_of(reply, "get %s %s %d" % (r.topic, key, offset))  # 404: none; else raises
                except errors.Moved as exc:
                    if exc.offset > offset:  # below the first kept offset: deleted by retention
                        offset = data_lost(r, key, offset, exc.offset, fail_on_data_loss)
                        if offset < r.end:
                            pending = ask(offset)
                        continue
                data_lost(r, key, offset, None, fail_on_data_loss)  # past the partition's end
                return
            body = reply.body
            index, count = scan_checked(body, "%s %s" % (r.topic, key), offset)
            take = min(count, r.end - offset)
            if offset + take < r.end:
                pending = ask(offset + take)  # on its way while this reply becomes columns
            yield from reply_batches(r.topic, key, offset, body, index, take, max_rows)
            offset += take
    finally:
        conn.close()
