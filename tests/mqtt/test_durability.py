"""A QoS 1 PUBACK (and a QoS 2 PUBREC) is sent when the put would be acknowledged to a text put: after its flush in
`sync` flush mode, at once in `async` (docs/mqtt.md "Publishing"). The data dir is on the FUSE fault filesystem
(tests/harness/fusefs.py), whose stall holds the commit log's fsync."""

import os

import pytest

from metaq.client.local import small_config
from metaq.mqtt import wire
from tests.harness.fusefs import FaultMount
from tests.harness.mqtt import Raw, with_mqtt


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_the_acknowledgement_waits_for_the_flush_the_topic_promises(broker_factory, tmp_path, flush):
    fs = FaultMount(tmp_path, stall_prefix="/data/commitlog/").start()
    b = None
    try:
        b = broker_factory(with_mqtt(small_config(os.path.join(fs.mountpoint, "data"),
                                                  store={"flush": flush, "segment_size": 4 << 20})))
        raw = Raw(b)
        assert raw.connect("durable").reason_code == 0
        raw.send(wire.Publish("durable/x", b"1", 1, packet_id=1))
        assert raw.read() == wire.PubAck(1)
        fs.set_fault("stall")
        raw.send(wire.Publish("durable/x", b"2", 1, packet_id=2))
        raw.send(wire.Publish("durable/x", b"3", 2, packet_id=3))
        raw.sock.settimeout(1.5)
        if flush == "sync":
            with pytest.raises(OSError):  # nothing acknowledged while its flush cannot finish
                raw.read()
        else:
            assert [raw.read(), raw.read()] == [wire.PubAck(2), wire.PubRec(3)]  # async: acknowledged once written
        raw.sock.settimeout(20)
        fs.set_fault("stall", on=False)
        if flush == "sync":
            assert [raw.read(), raw.read()] == [wire.PubAck(2), wire.PubRec(3)]  # in the order they came
    finally:
        if b is not None:
            b.kill()
        fs.stop()
