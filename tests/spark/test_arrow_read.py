"""The Spark source's Arrow path (metaq.spark.arrowread) and the sink's send_many path, against two real brokers.

The batches hold what was sent (bodies, attributes, keys, properties, offsets, timestamps) and exactly the rows the
row-by-row reader gives, in every partition of both brokers; a reply that fails its checksum or holds no whole record
fails clearly; ``maxRecordsPerBatch`` is a named limit (at the limit and one past); the plain sink's value-only
write (send_many) stores every row once, spread round-robin as before.
"""

import collections
import os
import socket
import threading
import time

import pytest

from metaq import errors
from metaq.spark import limits as spark_limits
from metaq.client import Consumer, Message, Producer
from metaq.client.connection import BrokerConnection
from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.message import gather_payloads_py, scan_reply
from tests.harness.broker import url_of

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

from metaq.spark.arrowread import (ARROW_SCHEMA, DEFAULT_BATCH_ROWS, batch_rows_option, read_batches,  # noqa: E402
                                   scan_checked)
from metaq.spark.ranges import plan_ranges  # noqa: E402
from metaq.spark.rows import COLUMNS, msg_timestamp_ms, read_rows  # noqa: E402

TOPIC = "tarrow"  # t* topics have 4 partitions in small_config
N = 2_000


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    """Brokers 7 and 8 holding N messages of TOPIC over their 8 partitions, some with attributes, keys and
    properties; what was sent, by (partition, offset), and when."""
    from metaq.client.local import BrokerProcess

    started = []
    try:
        for broker_id in (7, 8):
            wd = tmp_path_factory.mktemp("b%d" % broker_id)
            cfg = small_config(os.path.join(str(wd), "data"))
            cfg["broker"]["id"] = broker_id
            started.append(BrokerProcess(wd, cfg).start())
        urls = [url_of(b) for b in started]
        t0 = int(time.time() * 1000)
        with Producer(brokers=urls, send_timeout=60) as producer:  # each stored once on a slow machine too
            messages = [Message(TOPIC, os.urandom(i % 300) + b"body %05d" % i,
                                attribute="tag%d" % (i % 3) if i % 5 == 1 else None,
                                properties={"KEYS": "key%d" % i, "region": "eu"} if i % 4 == 0 else None)
                        for i in range(N)]
            results = [f.result(60) for f in [producer.send_async(m, timeout=60) for m in messages]]
        t1 = int(time.time() * 1000)
        assert all(r.success for r in results)
        sent = {(str(r.partition), r.offset): (m, r.msg_id) for m, r in zip(messages, results, strict=True)}
        yield urls, sent, (t0, t1)
    finally:
        for b in started:
            b.kill()


def rows_of(batches):
    out = []
    for batch in batches:
        assert batch.schema.equals(ARROW_SCHEMA)
        for d in batch.to_pylist():
            d["properties"] = dict(d["properties"])
            out.append(tuple(d[c] for c in COLUMNS))
    return out


def test_batches_hold_what_was_sent_and_what_the_row_reader_gives(two_brokers):
    urls, sent, (t0, t1) = two_brokers
    ranges = plan_ranges({"brokers": ",".join(urls), "topic": TOPIC})
    assert {r.broker_id for r in ranges} == {7, 8} and len(ranges) == 8
    seen = 0
    for r in ranges:
        got = rows_of(read_batches(r, fetch_bytes=16 << 10))  # many replies per range
        assert got == [tuple(row) for row in read_rows(r, fetch_bytes=16 << 10)]
        assert [row[2] for row in got] == list(range(r.start, r.end))
        for topic, key, offset, msg_id, attribute, value, ts, k, props in got:
            message, sent_id = sent[(key, offset)]
            assert (topic, msg_id, value, attribute) == (TOPIC, sent_id, message.body, message.attribute)
            assert k == (message.properties or {}).get("KEYS")
            assert props == (message.properties or {})
            ms = int(ts.timestamp() * 1000)
            assert ms == msg_timestamp_ms(msg_id) and t0 - 5 <= ms <= t1 + 5
            seen += 1
    assert seen == N


def test_a_batch_holds_at_most_max_rows_and_the_option_is_a_named_limit(two_brokers):
    urls, _sent, _ = two_brokers
    r = plan_ranges({"brokers": ",".join(urls), "topic": TOPIC})[0]
    sizes = [b.num_rows for b in read_batches(r, max_rows=7)]
    assert max(sizes) == 7 and sum(sizes) == r.count
    assert sum(b.num_rows for b in read_batches(r, max_rows=spark_limits.MAX_ARROW_BATCH_ROWS)) == r.count
    with pytest.raises(ValueError, match="max_rows must be 1..%d" % spark_limits.MAX_ARROW_BATCH_ROWS):
        list(read_batches(r, max_rows=spark_limits.MAX_ARROW_BATCH_ROWS + 1))
    assert batch_rows_option({}) == DEFAULT_BATCH_ROWS
    assert (batch_rows_option({"maxrecordsperbatch": str(spark_limits.MAX_ARROW_BATCH_ROWS)})
            == spark_limits.MAX_ARROW_BATCH_ROWS)
    for bad in (spark_limits.MAX_ARROW_BATCH_ROWS + 1, 0, "many"):
        with pytest.raises(ValueError, match="maxRecordsPerBatch"):
            batch_rows_option({"maxrecordsperbatch": bad})


def real_reply(url, partition=0, size=64 << 10):
    with BrokerConnection(url, heartbeat_interval=0) as conn:
        reply = conn.call(ev.Get(TOPIC, "g", partition, 0, size, 0), timeout=10)
    assert isinstance(reply, ev.Value)
    return reply.body


def test_a_corrupt_or_cut_reply_fails_clearly_and_the_c_gather_equals_its_reference(two_brokers):
    urls, _sent, _ = two_brokers
    body = real_reply(urls[0])
    index, count = scan_checked(body, "tarrow 7-0", 0)
    assert count > 10
    assert gather_payloads_py(body, index, count, 5) == scan_gather(body, index, count, 5)
    corrupt = bytearray(body)
    corrupt[30] ^= 0xFF  # inside the first record's data
    with pytest.raises(errors.RemoteProtocolError, match="tarrow 7-0: the reply from offset 0 does not scan: "
                                                         "checksum mismatch in record at position 0"):
        scan_checked(bytes(corrupt), "tarrow 7-0", 0)
    first_end = scan_reply(body)[0]  # the first record's payload end is the second record's start
    second = int(memoryview(first_end).cast("q")[5])
    with pytest.raises(errors.RemoteProtocolError, match="holds no whole record"):
        scan_checked(body[:second - 1], "tarrow 7-0", 0)
    assert scan_checked(body[:second + 21], "tarrow 7-0", 0)[1] == 1  # a cut-off last record is normal
    with pytest.raises(ValueError, match="outside"):
        scan_gather(body[:100], index, count)


def scan_gather(body, index, count, base=0):
    from metaq.protocol.message import gather_payloads

    return gather_payloads(body, index, count, base)


class CorruptingProxy:
    """A TCP relay to a real broker that flips one byte of the first record's checksum in the first reply (the
    reply's line, ``\\r\\n``, then the record header: length, checksum ...)."""

    def __init__(self, upstream_port):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream_port = upstream_port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, corrupt):
        held = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if corrupt:
                    held += data
                    line_end = held.find(b"\r\n")
                    if line_end < 0 or len(held) < line_end + 2 + 8:
                        continue
                    data, held, corrupt = bytearray(held), b"", False
                    data[line_end + 2 + 6] ^= 0x55
                dst.sendall(bytes(data))
        except OSError:
            pass
        finally:
            dst.close()

    def close(self):
        self.listener.close()


def test_a_reply_corrupted_on_the_wire_fails_the_read_naming_the_range(two_brokers):
    urls, _sent, _ = two_brokers
    r = plan_ranges({"brokers": urls[0], "topic": TOPIC, "partitions": "7-1"})[0]
    proxy = CorruptingProxy(int(urls[0].rsplit(":", 1)[1]))
    try:
        with pytest.raises(errors.RemoteProtocolError, match="tarrow 7-1: the reply from offset 0 does not scan: "
                                                             "checksum mismatch"):
            list(read_batches(r._replace(url="meta://127.0.0.1:%d" % proxy.port), timeout=10))
    finally:
        proxy.close()


def test_spark_reads_the_same_dataframe_with_arrow_and_without(spark, two_brokers):
    urls, sent, _ = two_brokers

    def load(**options):
        reader = spark.read.format("metaq").option("brokers", ",".join(urls)).option("topic", TOPIC)
        for k, v in options.items():
            reader = reader.option(k, v)
        return sorted(tuple(row) for row in reader.load().collect())

    arrow = load(maxRecordsPerBatch=100, maxOffsetsPerPartition=400)
    assert len(arrow) == N and arrow == load(arrow="false")
    assert {(row[1], row[2]) for row in arrow} == set(sent)
    with pytest.raises(Exception, match="maxRecordsPerBatch must be 1..%d" % spark_limits.MAX_ARROW_BATCH_ROWS):
        load(maxRecordsPerBatch=spark_limits.MAX_ARROW_BATCH_ROWS + 1)


def test_the_plain_sinks_value_writes_store_every_row_once_round_robin(spark, two_brokers):
    urls, _sent, _ = two_brokers
    topic = "tsinkmany"
    df = spark.range(3000, numPartitions=2).selectExpr("CAST(concat('v', id) AS BINARY) AS value")
    (df.write.format("metaq").option("brokers", ",".join(urls)).option("topic", topic)
     .option("idempotent", "false").mode("append").save())
    got, per_partition = collections.Counter(), collections.Counter()
    with Consumer("g-many", brokers=urls) as consumer:
        for part in ("%d-%d" % (b, p) for b in (7, 8) for p in range(4)):
            for batch in consumer.iter_batches(topic, part, 0):
                got.update(bytes(p) for p in batch.payloads())
                per_partition[part] += batch.count
    assert got == collections.Counter(b"v%d" % i for i in range(3000))  # every row once
    assert len(per_partition) >= 2 and max(per_partition.values()) - min(per_partition.values()) <= 2
    with pytest.raises(Exception, match="row 1 of this task has no value"):
        (spark.createDataFrame([(b"a",), (None,)], "value binary").coalesce(1).write.format("metaq")
         .option("brokers", urls[0]).option("topic", topic).option("idempotent", "false").mode("append").save())
