"""ZooKeeper goes away and comes back: brokers, producers and a consumer group all carry on."""

import os
import threading
import time

import pytest
from kazoo.client import KazooClient

from metaq.client import Consumer, Message, Producer
from metaq.client.local import small_config
from tests.harness.broker import wait_for

TOPIC = "orders"


def zk_broker(broker_factory, connect, broker_id):
    b = broker_factory(start=False)
    b.config = small_config(os.path.join(str(b.workdir), "data"),
                            zk={"connect": connect, "session_timeout_ms": 6000},
                            topics=[{"name": TOPIC, "partitions": 2}])
    b.config["broker"]["id"] = broker_id
    b.data_dir = b.config["broker"]["data_dir"]
    return b.start()


def owners(connect, group):
    zk = KazooClient(hosts=connect)
    zk.start(15)
    try:
        path = "/meta/consumers/%s/owners/%s" % (group, TOPIC)
        return sorted(zk.get_children(path)) if zk.exists(path) else []
    finally:
        zk.stop()


@pytest.mark.slow
@pytest.mark.fault
def test_everyone_recovers_after_a_zookeeper_outage(broker_factory, own_zk):
    connect = own_zk.connect
    zk_broker(broker_factory, connect, 1)
    zk_broker(broker_factory, connect, 2)
    got, lock = [], threading.Lock()

    def handle(message):
        with lock:
            got.append(message.body)

    def received():
        with lock:
            return set(got)

    consumer = Consumer("billing", zk_connect=connect, session_timeout=6.0, commit_interval=0.5)
    consumer.subscribe(TOPIC, handle)
    producer = Producer(zk_connect=connect)
    try:
        sent = set()

        def send(n, tag):
            for i in range(n):
                body = b"%s-%d" % (tag, i)
                r = producer.send(Message(TOPIC, body))
                assert r.success, r
                sent.add(body)

        send(10, b"create")  # creates the topic's partitions on both brokers (partition -1 puts)
        wait_for(lambda: len(producer.partitions(TOPIC)) == 4, 20, "the producer to see 4 partitions")
        consumer.start()
        send(40, b"before")
        wait_for(lambda: received() >= sent, 30, "the messages sent before the outage")
        assert owners(connect, "billing") == ["1-0", "1-1", "2-0", "2-1"]

        own_zk.stop()
        send(30, b"during")  # brokers still serve; the producer keeps its last known partitions
        time.sleep(8)  # longer than the 6 s session timeout
        own_zk.start()

        send(30, b"after")
        wait_for(lambda: received() >= sent, 60, lambda: "everything; missing %d" % len(sent - received()))
        wait_for(lambda: owners(connect, "billing") == ["1-0", "1-1", "2-0", "2-1"], 30, "owners again")
        zk = KazooClient(hosts=connect)
        zk.start(15)
        try:
            assert sorted(zk.get_children("/meta/brokers/topics-pub/%s" % TOPIC)) == ["1-m", "2-m"]
        finally:
            zk.stop()
        send(5, b"later")
        wait_for(lambda: received() >= sent, 30, "messages after recovery")
    finally:
        producer.close()
        consumer.close()
