"""Every handled remoting code against a real broker, through our own codec (reference rocketmq-remoting.md §2, §5)."""

import json
import time

from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.protocol.rocketmq.bodies import (BatchEntry, decode_stored_messages, encode_batch_messages,
                                            encode_properties, parse_offset_msg_id)
from metaq.client.raw import PULL_FLAGS, RemotingClient, pull_fields
from tests.harness.broker import wait_for
from tests.harness.rocketmq import end_tx, pull, send_v1


def v2_header(topic, queue, props=None, batch=False):
    return {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": queue, "f": 0, "g": int(time.time() * 1000),
            "h": 0, "i": encode_properties(props or {}), "j": 0, "k": "false", "m": "true" if batch else "false"}


def ext_int(cmd, key):
    return int(cmd.ext_fields[key])


def heartbeat_body(client_id, group, topic="tH"):
    return json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0, "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": "1", "classFilterMode": False}]}]
    }).encode()


# -- name server ------------------------------------------------------------------


def test_route_names_the_broker_itself_with_the_topic_partitions(rmq_broker, rc):
    port = rmq_broker.config["remoting"]["port"]
    r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "tRoute"})
    assert r.code == C.SUCCESS and r.is_response
    route = json.loads(r.body)
    assert route["brokerDatas"] == [{"brokerAddrs": {"0": "127.0.0.1:%d" % port}, "brokerName": "metaq-7",
                                     "cluster": "DefaultCluster", "enableActingMaster": False}]
    assert route["queueDatas"] == [{"brokerName": "metaq-7", "perm": 6, "readQueueNums": 4, "topicSysFlag": 0,
                                    "writeQueueNums": 4}]  # "t*" has 4 partitions in small_config
    retry = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%CG"}).body)
    assert retry["queueDatas"][0]["writeQueueNums"] == 1  # remoting.retry_queues
    other = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}).body)
    assert other["queueDatas"][0]["readQueueNums"] == 2  # the "*" pattern


def test_route_of_a_topic_the_broker_refuses_is_topic_not_exist(rmq_factory):
    b = rmq_factory(topics=[{"name": "only", "partitions": 3}])
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "other"})
        assert r.code == C.TOPIC_NOT_EXIST and "other" in r.remark
        assert rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "bad/name"}).code == C.TOPIC_NOT_EXIST
        assert json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "only"}).body)["queueDatas"][0][
            "readQueueNums"] == 3
        assert send_v1(rc, "other", b"x").code == C.TOPIC_NOT_EXIST


def test_cluster_info(rmq_broker, rc):
    info = json.loads(rc.call(R.GET_BROKER_CLUSTER_INFO).body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["metaq-7"]}
    port = rmq_broker.config["remoting"]["port"]
    assert info["brokerAddrTable"]["metaq-7"]["brokerAddrs"]["0"].endswith(":%d" % port)


# -- send and pull ----------------------------------------------------------------


def test_send_v1_then_pull_gives_the_stored_message_as_clients_decode_it(rmq_broker, rc):
    port = rmq_broker.config["remoting"]["port"]
    r = send_v1(rc, "tS", b"hello", queue=2, props={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC", "u": "v"},
                flag=5)
    assert r.code == C.SUCCESS, r
    assert ext_int(r, "queueId") == 2 and ext_int(r, "queueOffset") == 0
    ip, id_port, physical = parse_offset_msg_id(r.ext_fields["msgId"])
    assert (ip, id_port) == ("127.0.0.1", port)
    p = pull(rc, "tS", 2, 0)
    assert p.code == C.SUCCESS and p.remark == "FOUND"
    assert (ext_int(p, "nextBeginOffset"), ext_int(p, "minOffset"), ext_int(p, "maxOffset")) == (1, 0, 1)
    [m] = decode_stored_messages(p.body, check_crc=True)
    assert (m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.body, m.flag) == ("tS", 2, 0, physical,
                                                                                        b"hello", 5)
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC", "u": "v"}
    assert m.store_host == ("127.0.0.1", port) and m.store_timestamp > 0 and m.reconsume_times == 0


def test_send_v2_and_batch(rmq_broker, rc):
    r = rc.call(R.SEND_MESSAGE_V2, v2_header("tV", 1, {"TAGS": "T2"}), b"v2 body")
    assert r.code == C.SUCCESS and ext_int(r, "queueOffset") == 0
    body = encode_batch_messages([BatchEntry(b"b%d" % i, 0, {"KEYS": "k%d" % i}) for i in range(3)])
    b = rc.call(R.SEND_BATCH_MESSAGE, v2_header("tV", 1, batch=True), body)
    assert b.code == C.SUCCESS and ext_int(b, "queueOffset") == 1
    ids = b.ext_fields["msgId"].split(",")
    assert len(ids) == 3
    msgs = decode_stored_messages(pull(rc, "tV", 1, 0).body)
    assert [m.body for m in msgs] == [b"v2 body", b"b0", b"b1", b"b2"]
    assert [parse_offset_msg_id(i)[2] for i in ids] == [m.physical_offset for m in msgs[1:]]
    assert msgs[2].properties["KEYS"] == "k1"


def test_pull_statuses(rmq_broker, rc):
    empty = pull(rc, "tP", 0, 0)
    assert empty.code == C.PULL_NOT_FOUND and ext_int(empty, "nextBeginOffset") == 0
    moved = pull(rc, "tP", 0, 5)
    assert moved.code == C.PULL_OFFSET_MOVED and ext_int(moved, "nextBeginOffset") == 0
    for i in range(5):
        send_v1(rc, "tP", b"m%d" % i, props={"TAGS": "A" if i % 2 else "B"})
    past = pull(rc, "tP", 0, 9)
    assert past.code == C.PULL_OFFSET_MOVED and ext_int(past, "nextBeginOffset") == 5
    at_end = pull(rc, "tP", 0, 5)
    assert at_end.code == C.PULL_NOT_FOUND and ext_int(at_end, "maxOffset") == 5
    two = pull(rc, "tP", 0, 1, max_nums=2)
    assert [m.body for m in decode_stored_messages(two.body)] == [b"m1", b"m2"]
    assert ext_int(two, "nextBeginOffset") == 3
    only_a = pull(rc, "tP", 0, 0, sub="A || C")
    assert [m.body for m in decode_stored_messages(only_a.body)] == [b"m1", b"m3"]
    none = pull(rc, "tP", 0, 4, sub="C")  # nothing wanted up to the end: not found, and go on from the end
    assert none.code == C.PULL_NOT_FOUND and ext_int(none, "nextBeginOffset") == 5
    bad_queue = pull(rc, "tP", 9, 0)
    assert bad_queue.code == C.SYSTEM_ERROR
    other = pull(rc, "tP", 0, 0, sub="a > 1", expression="CLASS_FILTER")
    assert other.code == C.SYSTEM_ERROR and "CLASS_FILTER" in other.remark


def test_long_poll_answers_when_a_message_arrives_and_does_not_block_the_connection(rmq_broker, rc):
    port = rmq_broker.config["remoting"]["port"]
    parked = rc.request(R.PULL_MESSAGE, pull_fields("tL", 0, 0, suspend_ms=60000))
    hb = rc.call(R.HEART_BEAT, body=heartbeat_body("c@1", "CGL"))  # same socket, answered while the pull waits
    assert hb.code == C.SUCCESS
    with RemotingClient(port) as other:
        assert send_v1(other, "tL", b"wake up").code == C.SUCCESS
    r = rc.response(parked, timeout=30.0)  # woken by the send: the 60 s suspension would fail the read
    assert r.code == C.SUCCESS and decode_stored_messages(r.body)[0].body == b"wake up"
    started = time.monotonic()
    timeout = pull(rc, "tL", 0, 1, suspend_ms=700)
    assert timeout.code == C.PULL_NOT_FOUND and 0.6 <= time.monotonic() - started  # held for its suspension


def test_text_put_wakes_a_remoting_long_poll(rmq_broker, rc):
    parked = rc.request(R.PULL_MESSAGE, pull_fields("tX", 1, 0, suspend_ms=8000))
    with rmq_broker.client() as text:
        text.put_ok("tX", b"from text", partition=1, attribute="TagT")
    [m] = decode_stored_messages(rc.response(parked).body)
    assert (m.body, m.properties, m.flag) == (b"from text", {"TAGS": "TagT"}, 1)


# -- offsets ----------------------------------------------------------------------


def test_consumer_offsets_are_the_broker_store_shared_with_text(rmq_broker, rc):
    for i in range(4):
        send_v1(rc, "tO", b"m%d" % i)
    q = {"consumerGroup": "CGO", "topic": "tO", "queueId": 0}
    assert ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset") == 0  # new group, first message still there
    assert rc.call(R.QUERY_CONSUMER_OFFSET, dict(q, setZeroIfNotFound="false")).code == C.QUERY_NOT_FOUND
    pull(rc, "tO", 0, 0, group="CGO", sys_flag=PULL_FLAGS | 1, commit_offset=2)  # commit side effect
    assert ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset") == 2
    assert rc.call(R.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset=3)).code == C.SUCCESS
    assert rc.call(R.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset=-1)).code == C.SUCCESS  # ignored
    assert ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset") == 3
    with rmq_broker.client() as text:
        r = text.call(ev.QueryOffset("CGO", "tO", 0, text.opaque()))
        assert (r.code, r.body) == (200, b"3")
        assert text.call(ev.CommitOffset("CGO", "tO", 0, 2, text.opaque())).code == 200
    assert ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset") == 2


def test_an_offset_update_past_the_queue_end_is_taken_as_the_end(rmq_broker, rc):
    """RocketMQ's broker answers SUCCESS to any offset (and moves a later pull from past the end back to it);
    metaq answers SUCCESS and stores the end, so a message written after the commit is not skipped."""
    for i in range(4):
        send_v1(rc, "tOE", b"m%d" % i)
    q = {"consumerGroup": "CGE", "topic": "tOE", "queueId": 0}
    assert rc.call(R.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset=99)).code == C.SUCCESS
    assert ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset") == 4  # the queue's end, not 99
    moved = pull(rc, "tOE", 0, 99, group="CGE")
    assert (moved.code, ext_int(moved, "nextBeginOffset")) == (C.PULL_OFFSET_MOVED, 4)  # RocketMQ's answer
    send_v1(rc, "tOE", b"after the commit")
    [m] = decode_stored_messages(pull(rc, "tOE", 0, ext_int(rc.call(R.QUERY_CONSUMER_OFFSET, q), "offset")).body)
    assert m.body == b"after the commit"
    with rmq_broker.client() as text:  # the text protocol keeps refusing an offset it cannot hold
        assert text.call(ev.CommitOffset("CGE", "tOE", 0, 99, text.opaque())).code == 400


def test_min_max_search_and_earliest_time(rmq_broker, rc):
    q = {"topic": "tM", "queueId": 0}
    assert ext_int(rc.call(R.GET_MAX_OFFSET, q), "offset") == 0
    send_v1(rc, "tM", b"a")
    send_v1(rc, "tM", b"b")
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    send_v1(rc, "tM", b"c")
    assert ext_int(rc.call(R.GET_MAX_OFFSET, q), "offset") == 3
    assert ext_int(rc.call(R.GET_MIN_OFFSET, q), "offset") == 0
    assert ext_int(rc.call(R.SEARCH_OFFSET_BY_TIMESTAMP, dict(q, timestamp=middle)), "offset") == 2
    assert ext_int(rc.call(R.SEARCH_OFFSET_BY_TIMESTAMP, dict(q, timestamp=middle, boundaryType="upper")),
                   "offset") == 1
    assert ext_int(rc.call(R.SEARCH_OFFSET_BY_TIMESTAMP, dict(q, timestamp=0)), "offset") == 0
    first = decode_stored_messages(pull(rc, "tM", 0, 0, max_nums=1).body)[0]
    assert ext_int(rc.call(R.GET_EARLIEST_MSG_STORETIME, q), "timestamp") == first.store_timestamp


def test_view_message_by_its_offset_id(rmq_broker, rc):
    r = send_v1(rc, "tW", b"look at me", props={"TAGS": "V"})
    physical = parse_offset_msg_id(r.ext_fields["msgId"])[2]
    [m] = decode_stored_messages(rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": physical}).body)
    assert (m.body, m.physical_offset, m.properties["TAGS"]) == (b"look at me", physical, "V")
    assert rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": physical + 1}).code == C.SYSTEM_ERROR


# -- clients ----------------------------------------------------------------------


def test_heartbeat_consumer_list_unregister_and_close(rmq_broker, rc):
    port = rmq_broker.config["remoting"]["port"]
    none = rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CGH"})
    assert none.code == C.SYSTEM_ERROR
    assert rc.call(R.HEART_BEAT, body=heartbeat_body("10.0.0.1@1", "CGH")).code == C.SUCCESS
    other = RemotingClient(port)
    assert other.call(R.HEART_BEAT, body=heartbeat_body("10.0.0.2@2", "CGH")).code == C.SUCCESS
    notify = rc.read()  # the first member is told to rebalance
    assert (notify.code, notify.is_oneway, notify.ext_fields) == (R.NOTIFY_CONSUMER_IDS_CHANGED, True,
                                                                   {"consumerGroup": "CGH"})
    ids = json.loads(rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CGH"}).body)["consumerIdList"]
    assert ids == ["10.0.0.1@1", "10.0.0.2@2"]
    with rmq_broker.client() as text:
        summary = text.stats_dict()
    assert summary["remoting_port"] == str(port) and summary["rocketmq_consumer_groups"] == "1"
    assert summary["remoting_connections"] == "2"
    assert summary["remoting_route_master"] == "127.0.0.1:%d" % port  # ha: manual: the broker itself
    assert rc.call(R.UNREGISTER_CLIENT, {"clientID": "10.0.0.1@1", "producerGroup": "",
                                         "consumerGroup": "CGH"}).code == C.SUCCESS
    ids = json.loads(rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CGH"}).body)["consumerIdList"]
    assert ids == ["10.0.0.2@2"]
    other.close()  # a closed connection takes its clients with it
    deadline = time.monotonic() + 5
    while rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "CGH"}).code == C.SUCCESS:
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- retry and dead letters -------------------------------------------------------


def test_send_back_goes_to_retry_then_dead_letter(rmq_broker, rc):
    physical = parse_offset_msg_id(send_v1(rc, "tR", b"poison", props={"TAGS": "P", "UNIQ_KEY": "U1"})
                                   .ext_fields["msgId"])[2]
    back = {"offset": physical, "group": "CGR", "delayLevel": 0, "originMsgId": "U1", "originTopic": "tR"}
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS
    [retry] = decode_stored_messages(pull(rc, "%RETRY%CGR", 0, 0).body)
    assert (retry.body, retry.reconsume_times, retry.topic) == (b"poison", 1, "%RETRY%CGR")
    assert retry.properties["RETRY_TOPIC"] == "tR" and retry.properties["ORIGIN_MESSAGE_ID"] == "U1"
    assert retry.properties["TAGS"] == "P"
    # max_reconsume_times is 1 on this broker: the next send-back is a dead letter
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, dict(back, offset=retry.physical_offset)).code == C.SUCCESS
    [dead] = decode_stored_messages(pull(rc, "%DLQ%CGR", 0, 0).body)
    assert (dead.body, dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (b"poison", 2, "tR")
    # a negative delay level sends it to the dead letters at once
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, dict(back, delayLevel=-1)).code == C.SUCCESS
    assert ext_int(rc.call(R.GET_MAX_OFFSET, {"topic": "%DLQ%CGR", "queueId": 0}), "offset") == 2
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, dict(back, offset=physical + 3)).code == C.SYSTEM_ERROR


def max_of(rc, topic, queue=0):
    return ext_int(rc.call(R.GET_MAX_OFFSET, {"topic": topic, "queueId": queue}), "offset")


def test_half_messages_are_invisible_until_committed_and_gone_when_rolled_back(rmq_broker, rc):
    half = {"TRAN_MSG": "true", "PGROUP": "PG", "TAGS": "H", "UNIQ_KEY": "TXU1"}
    sent = send_v1(rc, "tT", b"half one", sys_flag=4, props=half)
    assert sent.code == C.SUCCESS and sent.ext_fields["transactionId"] == "TXU1"
    assert max_of(rc, "tT") == 0  # a half message is not visible
    assert end_tx(rc, sent, 0).code == C.SUCCESS and max_of(rc, "tT") == 0  # unknown: still waiting
    assert end_tx(rc, sent, 8).code == C.SUCCESS  # commit
    [m] = decode_stored_messages(pull(rc, "tT", 0, 0).body)
    assert m.body == b"half one" and m.properties["TAGS"] == "H" and "TRAN_MSG" not in m.properties
    assert m.sys_flag & 12 == 0  # a stored message is a committed one
    again = end_tx(rc, sent, 8)
    assert again.code == C.SYSTEM_ERROR and "no half message" in again.remark
    gone = send_v1(rc, "tT", b"half two", sys_flag=4, props=half)
    assert end_tx(rc, gone, 12).code == C.SUCCESS
    assert max_of(rc, "tT") == 1


def test_half_messages_outlive_their_connection_and_another_connection_of_the_group_ends_them(rmq_broker, rc):
    port = rmq_broker.config["remoting"]["port"]
    with RemotingClient(port) as other:
        sent = send_v1(other, "tT2", b"orphan", sys_flag=4, props={"TRAN_MSG": "true"})
        assert sent.code == C.SUCCESS
    with rmq_broker.client() as text:  # the broker has seen the close (a text transaction would be rolled back)
        wait_for(lambda: "remoting_connections 1\r\n" in text.stats(), 10, "the sender's connection closed")
        assert "tx_rollback 0\r\n" in text.stats()
    assert end_tx(rc, sent, 8).code == C.SUCCESS  # another connection, the same producer group ("PG")
    [m] = decode_stored_messages(pull(rc, "tT2", 0, 0).body)
    assert m.body == b"orphan"



def test_the_producers_address_is_the_born_host_consumers_see(rmq_broker, rc):
    """RocketMQ's broker records a message's born host (the sending connection's address); so does metaq (an
    internal property of the record), for pulls and VIEW_MESSAGE_BY_ID. A text put has none: the broker's."""
    ip, port = rc.sock.getsockname()[:2]
    send_v1(rc, "tBH", b"from rc", props={"KEYS": "k"})
    with rmq_broker.client() as text:
        text.put_ok("tBH", b"from text", partition=0)
    sent, texted = decode_stored_messages(pull(rc, "tBH", 0, 0).body)
    assert (sent.born_host, sent.properties) == ((ip, port), {"KEYS": "k"})  # not shown as a property
    assert texted.born_host == texted.store_host
    [viewed] = decode_stored_messages(rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": sent.physical_offset}).body)
    assert viewed.born_host == (ip, port)

# -- anything else -----------------------------------------------------------------


def test_unknown_codes_are_not_supported_and_oneway_gets_no_answer(rmq_broker, rc):
    r = rc.call(17, {"topic": "x"})  # UPDATE_AND_CREATE_TOPIC (admin)
    assert (r.code, r.remark) == (C.REQUEST_CODE_NOT_SUPPORTED, " request type 17 not supported")
    rc.request(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "tU", "queueId": 0, "commitOffset": 0},
               oneway=True)
    after = rc.request(R.GET_MAX_OFFSET, {"topic": "tU", "queueId": 0})
    nxt = rc.read()
    assert nxt.opaque == after and nxt.code == C.SUCCESS  # nothing came back for the oneway request


def test_graceful_stop_answers_parked_pulls_and_acknowledged_sends_stay(rmq_broker, rc):
    assert send_v1(rc, "tG", b"kept").code == C.SUCCESS
    parked = rc.request(R.PULL_MESSAGE, pull_fields("tG", 0, 1, suspend_ms=60000))
    with rmq_broker.client() as c:
        wait_for(lambda: c.stats_dict()["parked_gets"] == "1", what="the pull parked")
    rmq_broker.proc.send_signal(15)
    r = rc.response(parked, timeout=30.0)  # answered by the stop: the 60 s suspension would fail the read
    assert r.code == C.PULL_NOT_FOUND
    assert rmq_broker.wait_exit(15) == 0
    rmq_broker.start()
    with RemotingClient(rmq_broker.config["remoting"]["port"]) as again:
        assert [m.body for m in decode_stored_messages(pull(again, "tG", 0, 0).body)] == [b"kept"]
