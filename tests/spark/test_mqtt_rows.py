"""Messages published over MQTT read by Spark (docs/mqtt.md "Topics"): spark.read.format("metaq") sees each with its
MQTT topic name, QoS and user properties, as get and RocketMQ pulls do."""

import json

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.client.local import BrokerProcess
from tests.harness.broker import url_of
from tests.harness.mqtt import Paho, mqtt_config

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def test_spark_reads_mqtt_messages_with_their_topic_name_qos_and_user_properties(spark, tmp_path):
    b = BrokerProcess(tmp_path, mqtt_config(tmp_path)).start()
    try:
        device = Paho(b, "device-7")
        sent = {}
        # in order on one connection: once the QoS 2 one is acknowledged, the QoS 0 one before it is stored too
        for i, (name, qos) in enumerate([("sensors/room2/temp", 0), ("sensors/room1/temp", 1),
                                         ("sensors/room1/humidity", 2)]):
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = [("unit", "C"), ("seq", str(i))]
            payload = b"%d.5" % (20 + i)
            device.publish(name, payload, qos=qos, properties=props)
            sent[payload] = (name, qos, [["unit", "C"], ["seq", str(i)]])
        device.c.disconnect()
        rows = (spark.read.format("metaq").option("brokers", url_of(b)).option("topic", "sensors").load()
                .select("value", "properties").collect())
    finally:
        b.kill()
    got = {bytes(r["value"]): r["properties"] for r in rows}
    assert set(got) == set(sent)
    for payload, (name, qos, user) in sent.items():
        props = got[payload]
        assert props["MQTT_TOPIC"] == name and props["MQTT_QOS"] == str(qos) and props["MQTT_CLIENT"] == "device-7"
        assert json.loads(props["MQTT_USER_PROPERTIES"]) == user
