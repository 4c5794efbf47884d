"""Rows of the ``metaq`` Spark source: one per message, read from one offset range (plain Python, no Spark here).

Both the batch source (``spark.read.format("metaq")``) and the streaming source
(``spark.readStream.format("metaq")``) give these columns (``SCHEMA_DDL``):

    topic string, partition string ("<brokerId>-<p>"), offset long, msg_id long,
    attribute string, value binary, timestamp timestamp, key string, properties map<string,string>

``attribute`` is MetaQ's attribute; for a message sent by a RocketMQ producer (or with
``properties``) it is the tags, as the metaq client shows them. ``key`` is the RocketMQ
``KEYS`` property (what the sink's ``key`` column writes), None without one. ``properties``
are the message's properties without the broker's internal ``@`` ones (an empty map for a plain
MetaQ message). ``timestamp`` is when the broker stored the message (from its id).
"""

import logging
from datetime import datetime, timezone

from metaq import errors
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.fetcher import records_of
from metaq.protocol import events as ev
from metaq.protocol.message import decode_payload
from metaq.protocol.msgid import id_timestamp_ms
from metaq.protocol.properties import PROP_KEYS, split_attribute, stored_payload

__all__ = ["SCHEMA_DDL", "COLUMNS", "DataLoss", "msg_timestamp_ms", "row_of", "read_rows"]

log = logging.getLogger(__name__)

#: The group name sent in ``get`` requests (a get never commits anything).
READER_GROUP = "metaq-spark"
DEFAULT_FETCH_BYTES = 1 << 20
COLUMNS = ("topic", "partition", "offset", "msg_id", "attribute", "value", "timestamp", "key", "properties")
#: Columns of a message DataFrame, as a Spark DDL string.
SCHEMA_DDL = ("topic string, partition string, offset long, msg_id long, attribute string, value binary, "
              "timestamp timestamp, key string, properties map<string,string>")


class DataLoss(errors.ClientError):
    """Requested offsets are no longer (or not yet) in the partition."""


#: Milliseconds since the Unix epoch inside a message id (when the broker stored the message).
msg_timestamp_ms = id_timestamp_ms


def row_of(topic, key, offset, record):
    """The row (a tuple in ``COLUMNS`` order) of ``record``, found at ``offset`` of partition ``key`` ("b-p")."""
    attribute, payload = decode_payload(record.flag, record.data)
    tags, properties, from_remoting = split_attribute(attribute)
    if from_remoting:
        attribute = tags
        payload = stored_payload(properties, payload)  # a record an older broker stored compressed
        properties = {k: v for k, v in properties.items() if not k.startswith("@")}
    ts = datetime.fromtimestamp(msg_timestamp_ms(record.msg_id) / 1000.0, tz=timezone.utc)
    return (topic, key, offset, record.msg_id, attribute, bytes(payload), ts, properties.get(PROP_KEYS),
            properties)


def data_lost(r, key, offset, moved_to, fail_on_data_loss):
    """The readers' one data-loss rule: range ``r``'s offsets from ``offset`` are gone, deleted by retention
    (``moved_to``: where the partition starts now) or past the partition's end (``moved_to`` None: the log was cut).
    Raises DataLoss with ``failOnDataLoss``; else logs what is skipped and returns where reading goes on (None: the
    range is over)."""
    if moved_to is not None:
        if fail_on_data_loss:
            raise DataLoss("%s %s: offsets %d..%d are not in the partition any more (deleted by retention; it starts "
                           "at %d now); set failOnDataLoss=false to skip them"
                           % (r.topic, key, offset, min(moved_to, r.end) - 1, moved_to)) from None
        log.warning("%s %s: skipping offsets %d..%d, deleted before they were read (failOnDataLoss=false)",
                    r.topic, key, offset, min(moved_to, r.end) - 1)
        return moved_to
    if fail_on_data_loss:
        raise DataLoss("%s %s: the partition ends before offset %d (range %d..%d; the log was cut, for instance by a "
                       "failover); set failOnDataLoss=false to skip what is missing"
                       % (r.topic, key, offset, r.start, r.end - 1)) from None
    log.warning("%s %s: skipping offsets %d..%d, past the partition's end (failOnDataLoss=false)",
                r.topic, key, offset, r.end - 1)
    return None


def read_rows(r, fetch_bytes=DEFAULT_FETCH_BYTES, timeout=30.0, security=None, fail_on_data_loss=True):
    """Yield the row of every offset of the range ``r`` (an ``OffsetRange``: ``[r.start, r.end)``), in order.

    With ``fail_on_data_loss`` (the default): exactly ``r.count`` rows or an exception, DataLoss when
    the broker says an offset of the range no longer exists (301: deleted by retention) or does not
    exist yet (404: the log was cut, for instance after a failover to a slave that lacked its tail).
    Without it, such offsets are skipped with a WARNING line naming them and the read goes on. A
    corrupt record (the broker never serves one) is always an error. ``security``: what
    ``metaq.client.security.resolve`` takes.
    """
    if r.count <= 0:
        return
    key = "%d-%d" % (r.broker_id, r.partition)
    conn = BrokerConnection(r.url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                            security=client_security.resolve(security))
    try:
        offset = r.start
        while offset < r.end:
            reply = conn.call(ev.Get(r.topic, READER_GROUP, r.partition, offset, fetch_bytes, 0), timeout=timeout)
            try:
                records = records_of(reply, "get %s %s %d" % (r.topic, key, offset))
            except errors.Moved as exc:
                if exc.offset > offset:  # below the first kept offset: deleted by retention
                    offset = data_lost(r, key, offset, exc.offset, fail_on_data_loss)
                    continue
                records = []  # past the partition's end
            if not records:
                data_lost(r, key, offset, None, fail_on_data_loss)
                return
            for record in records[: r.end - offset]:
                yield row_of(r.topic, key, offset, record)
                offset += 1
    finally:
        conn.close()
