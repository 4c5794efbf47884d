"""spark.readStream.format("metaq") into the streaming sink with a real broker and a real local Spark: a query from
topic to topic whose driver (a process of its own) is killed mid-batch writes every message once."""

import pytest

from metaq.client.local import small_config
from tests.harness.broker import url_of, wait_for
from tests.harness.spark_stream import (Driver, batch_offsets, checkpoint_state, ends_of, max_offset_request, put_many,
                                        wait_caught_up)

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


@pytest.mark.fault
def test_topic_to_topic_through_the_streaming_sink_exactly_once_when_the_driver_is_killed_mid_batch(
        broker_factory, tmp_path, spark):
    b = broker_factory(small_config(tmp_path / "data"))
    url, ck = url_of(b), str(tmp_path / "ck")
    sent = put_many(b, "tin", 0, 3000)
    args = ["--brokers", url, "--subscribe", "tin", "--checkpoint", ck, "--to-topic", "tout",
            "--max-per-trigger", "600", "--row-delay-ms", "3"]
    driver = Driver(tmp_path, *args)

    def writing_mid_batch():
        assert driver.proc.poll() is None, driver.text()[-3000:]
        last, _offsets, committed = checkpoint_state(ck)
        if not (last >= 2 and committed == last - 1):
            return False
        done = sum(sum(parts.values()) for parts in batch_offsets(ck, committed).values())
        with b.client() as c:  # more in "tout" than the committed batches wrote: the batch is half written
            return sum(int(c.call(max_offset_request("tout", p)).body) for p in range(4)) > done
    wait_for(writing_mid_batch, 180, "a batch half written", interval=0.01)
    driver.kill()
    driver = Driver(tmp_path, *args)
    wait_caught_up(ck, ends_of(sent, "tin"), driver)
    driver.stop()

    rows = (spark.read.format("metaq").option("brokers", url).option("topic", "tout").load()
            .select("value").collect())
    values = [bytes(r["value"]).decode() for r in rows]
    expected = ["%s:%d:%s" % (key, off, body.decode()) for (key, off), body in sent.items()]
    assert len(values) == len(expected) == 3000
    assert sorted(values) == sorted(expected)  # each transformed message exactly once
