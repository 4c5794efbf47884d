"""spark.readStream.format("metaq") into Parquet with a real broker and a real local Spark: a query whose driver (a
process of its own) is killed mid-batch writes every message once."""

import pytest

from metaq.client.local import small_config
from tests.harness.broker import url_of, wait_for
from tests.harness.spark_stream import Driver, checkpoint_state, ends_of, put_many, wait_caught_up

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


@pytest.mark.fault
def test_stream_into_parquet_exactly_once_when_its_driver_is_killed_mid_batch(broker_factory, tmp_path, spark):
    """A query stopped cleanly and restarted from its checkpoint: test_retention_behind_a_stopped_stream…"""
    b = broker_factory(small_config(tmp_path / "data"))
    url, topic = url_of(b), "tstream"
    out, ck = str(tmp_path / "table"), str(tmp_path / "ck")
    args = ["--brokers", url, "--subscribe", topic, "--checkpoint", ck, "--parquet", out, "--max-per-trigger", "400",
            "--row-delay-ms", "4"]
    sent = put_many(b, topic, 0, 1500)

    driver = Driver(tmp_path, *args)
    wait_for(lambda: checkpoint_state(ck)[2] >= 0, 180, "a committed batch")
    sent.update(put_many(b, topic, 1500, 1000))  # while the query runs

    def mid_batch():
        assert driver.proc.poll() is None, driver.text()[-3000:]
        last, _offsets, committed = checkpoint_state(ck)
        return last >= 2 and committed < last  # a batch planned and not finished
    wait_for(mid_batch, 180, "a batch in progress", interval=0.01)
    killed_in = checkpoint_state(ck)[0]
    driver.kill()
    assert checkpoint_state(ck)[2] < killed_in  # it really died mid-batch
    sent.update(put_many(b, topic, 2500, 1500))

    driver = Driver(tmp_path, *args)
    wait_caught_up(ck, ends_of(sent, topic), driver)
    driver.stop()

    rows = spark.read.parquet(out).select("partition", "offset", "value").collect()
    got = [(r["partition"], r["offset"]) for r in rows]
    assert len(got) == len(set(got)) == len(sent) == 4000  # nothing twice ...
    values = [bytes(r["value"]) for r in rows]
    assert dict(zip(got, values, strict=True)) == sent  # ... nothing missing, unchanged
