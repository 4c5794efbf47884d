"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42) against a real broker, through our own codec: the lock table as an
orderly consumer sees it (README "RocketMQ clients", "Orderly consumers")."""

import json
import time

from metaq.server.remoting import limits as remoting_limits
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.lockbodies import LockBatchBody, MessageQueue, encode_lock_batch
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import wait_for

BROKER = "metaq-7"  # small_config's broker id 7


def heartbeat(rc, client_id, group, topic="tL"):
    body = json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0, "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": "1"}]}]}).encode()
    assert rc.call(R.HEART_BEAT, body=body).code == C.SUCCESS


def body(client_id, group, queues, topic="tL", broker=BROKER):
    mqs = tuple(q if isinstance(q, MessageQueue) else MessageQueue(topic, broker, q) for q in queues)
    return encode_lock_batch(LockBatchBody(group, client_id, mqs))


def lock(rc, client_id, group, queues, **kw):
    """LOCK_BATCH_MQ; the queue ids (or MessageQueues, for other topics) the broker says the client holds."""
    r = rc.call(R.LOCK_BATCH_MQ, body=body(client_id, group, queues, **kw))
    assert r.code == C.SUCCESS, r
    return [mq["queueId"] if mq["topic"] == kw.get("topic", "tL") else MessageQueue(mq["topic"], mq["brokerName"],
                                                                                     mq["queueId"])
            for mq in json.loads(r.body)["lockOKMQSet"]]


def unlock(rc, client_id, group, queues, **kw):
    r = rc.call(R.UNLOCK_BATCH_MQ, body=body(client_id, group, queues, **kw))
    assert r.code == C.SUCCESS and not r.body, r
    return r


def member(port, client_id, group, topic="tL"):
    rc = RemotingClient(port)
    heartbeat(rc, client_id, group, topic)
    return rc


def test_a_queue_is_locked_by_one_client_of_a_group_and_any_other_group_may_lock_it(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    a, b, other = member(port, "c-a", "G"), member(port, "c-b", "G"), member(port, "c-x", "OTHER")
    try:
        assert lock(a, "c-a", "G", [0, 1]) == [0, 1]
        assert lock(b, "c-b", "G", [0, 1, 2, 3]) == [2, 3]  # 0 and 1 are c-a's
        assert lock(a, "c-a", "G", [0, 1, 2]) == [0, 1]  # renewed; 2 is c-b's
        assert lock(other, "c-x", "OTHER", [0, 1, 2, 3]) == [0, 1, 2, 3]  # another group: its own table
        unlock(b, "c-a", "G", [0])  # unlocking in another client's name (and connection) frees nothing
        assert lock(b, "c-b", "G", [0]) == []
        unlock(a, "c-a", "G", [0])
        assert lock(b, "c-b", "G", [0]) == [0]
        with rmq_broker.client() as text:
            assert text.stats_dict()["rocketmq_queue_locks"] == "8"  # G: 0-3, OTHER: 0-3
    finally:
        for rc in (a, b, other):
            rc.close()


def test_a_client_must_have_sent_its_heartbeat_through_the_same_connection(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    a = member(port, "c-a", "G")
    with RemotingClient(port) as stranger:
        r = stranger.call(R.LOCK_BATCH_MQ, body=body("c-a", "G", [0]))  # c-a's id, not c-a's connection
        assert r.code == C.SYSTEM_ERROR and "not registered in consumer group G" in r.remark
        r = stranger.call(R.LOCK_BATCH_MQ, body=body("c-a", "NOT-ITS-GROUP", [0]))
        assert r.code == C.SYSTEM_ERROR
    assert lock(a, "c-a", "G", [0]) == [0]
    a.close()


def test_a_lying_mq_set_locks_nothing_it_names_falsely(rmq_factory):
    b = rmq_factory(topics=[{"name": "tL", "partitions": 4}])
    port = b.config["remoting"]["port"]
    with member(port, "c-a", "G") as a:
        lies = [MessageQueue("tL", "another-broker", 0), MessageQueue("tL", BROKER, 4),  # past the topic's queues
                MessageQueue("tL", BROKER, -1), MessageQueue("unknown", BROKER, 0),  # a topic the broker refuses
                MessageQueue("bad/name", BROKER, 0), MessageQueue("tL", BROKER, 3), MessageQueue("tL", BROKER, 3)]
        assert lock(a, "c-a", "G", lies) == [3]
        many = [MessageQueue("tL", BROKER, i % 4) for i in range(remoting_limits.MAX_LOCK_BATCH_QUEUES + 1)]
        r = a.call(R.LOCK_BATCH_MQ, body=body("c-a", "G", many))
        assert r.code == C.INVALID_PARAMETER and "MAX_LOCK_BATCH_QUEUES" in r.remark
        assert a.call(R.LOCK_BATCH_MQ, body=b"{not json").code == C.INVALID_PARAMETER
        assert lock(a, "c-a", "G", many[:remoting_limits.MAX_LOCK_BATCH_QUEUES]) == [0, 1, 2, 3]  # at the limit: served
        with b.client() as text:
            assert text.stats_dict()["rocketmq_queue_locks"] == "4"


def test_locks_are_released_when_the_client_unregisters_and_when_its_connection_closes(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    a, b = member(port, "c-a", "G"), member(port, "c-b", "G")
    assert lock(a, "c-a", "G", [0, 1]) == [0, 1]
    assert b.call(R.UNREGISTER_CLIENT, {"clientID": "c-a", "producerGroup": "", "consumerGroup": "G"}).code == 0
    assert lock(b, "c-b", "G", [0, 1]) == []  # c-a's name on another connection frees nothing
    assert a.call(R.UNREGISTER_CLIENT, {"clientID": "c-a", "producerGroup": "", "consumerGroup": "G"}).code == 0
    assert lock(b, "c-b", "G", [0, 1]) == [0, 1]
    c = member(port, "c-c", "G")
    assert lock(c, "c-c", "G", [2, 3]) == [2, 3]
    c.close()  # as a consumer killed with kill -9: the kernel closes its connection
    wait_for(lambda: lock(b, "c-b", "G", [2, 3]) == [2, 3], timeout=5.0, what="c-c's queues freed by its close")
    a.close()
    b.close()


def test_a_lock_not_renewed_expires_and_a_renewed_one_does_not(rmq_factory):
    expiry = 3.0
    br = rmq_factory(remoting={"lock_expiry_s": expiry})
    port = br.config["remoting"]["port"]
    a, b = member(port, "c-a", "G"), member(port, "c-b", "G")
    assert lock(a, "c-a", "G", [0, 1]) == [0, 1]
    taken = time.monotonic()  # when the answer came: the broker took the locks no later
    # c-a renews queue 0 every 0.3 s for longer than the expiry; queue 1 it leaves alone
    while time.monotonic() - taken < expiry + 1.0:
        assert lock(a, "c-a", "G", [0]) == [0]
        assert 0 not in lock(b, "c-b", "G", [0])  # never c-b's while renewed
        time.sleep(0.3)
    assert lock(b, "c-b", "G", [0, 1]) == [1]  # queue 1 expired: c-b takes it
    assert lock(a, "c-a", "G", [1]) == []  # and holds it now
    a.close()
    b.close()


def test_the_lock_table_holds_at_most_max_locks(rmq_factory):
    br = rmq_factory(remoting={"max_locks": 3})
    port = br.config["remoting"]["port"]
    with member(port, "c-a", "G") as a:
        assert lock(a, "c-a", "G", [0, 1, 2]) == [0, 1, 2]  # at the limit
        assert lock(a, "c-a", "G", [3]) == []  # one past it
        assert lock(a, "c-a", "G", [0, 1, 2]) == [0, 1, 2]  # renewals need no room
        unlock(a, "c-a", "G", [2])
        assert lock(a, "c-a", "G", [3]) == [3]
