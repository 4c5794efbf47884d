"""Attacks on issue 19's admin operations against a real broker: the dead letters' resent journal, resends whose
original topic is gone or internal."""


from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.http import request, with_http
from tests.harness.rocketmq import send_v1


def _rmq_broker(broker_factory, tmp_path):
    return broker_factory(with_http(rmq_config(tmp_path / "data", remoting={"max_reconsume_times": 1,
                                                                              "send_back_delay_level": 0})))


def _dead_letter(rc, topic, body, key, group="CGD"):
    sent = send_v1(rc, topic, body, props={"UNIQ_KEY": key})
    assert sent.code == C.SUCCESS, sent
    physical = parse_offset_msg_id(sent.ext_fields["msgId"])[2]
    back = {"offset": physical, "group": group, "delayLevel": -1, "originMsgId": key, "originTopic": topic}
    assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS


def test_a_client_cannot_forge_the_resent_journal_and_hide_a_dead_letter(broker_factory, tmp_path):
    b = _rmq_broker(broker_factory, tmp_path)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        _dead_letter(rc, "tD", b"poison", "U1")
    [letter] = request(b, "GET", "/api/dlq/CGD").json()["dead_letters"]
    part, off = letter["position"].split("-")
    forged = ("%s %s" % (part, off)).encode()
    with b.client() as c:  # a text put straight into the group's journal
        r = c.put("%RESENT%CGD", forged, partition=0)
        assert r.code != 200, r
    r = request(b, "POST", "/api/topics/%25RESENT%25CGD/messages?partition=0", body=forged)  # and over HTTP
    assert r.status != 200, r
    with RemotingClient(b.config["remoting"]["port"]) as rc:  # and with a RocketMQ send
        assert send_v1(rc, "%RESENT%CGD", forged).code != C.SUCCESS
    [letter] = request(b, "GET", "/api/dlq/CGD").json()["dead_letters"]
    assert letter["resent"] is False
    done = request(b, "POST", "/api/dlq/CGD/resend").json()
    assert [x["id"] for x in done["resent"]] == ["U1"], done


def test_a_dead_letter_whose_topic_was_deleted_does_not_stop_the_resend_of_the_others(broker_factory, tmp_path):
    b = _rmq_broker(broker_factory, tmp_path)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        _dead_letter(rc, "tGone", b"first", "G1")
        _dead_letter(rc, "tD", b"second", "U2")
    assert request(b, "DELETE", "/api/topics/tGone").status == 200
    r = request(b, "POST", "/api/dlq/CGD/resend")
    assert r.status == 200, r
    doc = r.json()
    assert [x["id"] for x in doc["resent"]] == ["U2"], doc
    assert [x["id"] for x in doc["skipped"]] == ["G1"], doc


def _fill_dlq(b, count, group="CGD"):
    """``count`` records on the group's dead-letter topic, pipelined over the text port (what a storm of poison
    messages leaves there)."""
    from metaq.protocol import events as ev
    from metaq.protocol.message import encode_payload
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.text import serialize
    with b.client() as c:
        flag, data = encode_payload(b"old letter", None)
        frames = [ev.Put("%DLQ%" + group, 0, flag, data, i + 1, metaq_checksum(data)) for i in range(count)]
        for start in range(0, count, 500):  # pipelined in runs of 500
            run = frames[start:start + 500]
            c.send(b"".join(serialize(f) for f in run))
            assert all(c.read_event().code == 200 for _ in run)


def test_the_newest_dead_letter_can_be_resent_however_many_older_ones_there_are(broker_factory, tmp_path):
    from metaq.admin import limits as admin_limits
    from tests.hostile.common import LoopProbe
    b = _rmq_broker(broker_factory, tmp_path)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        _dead_letter(rc, "tD", b"first", "U0")  # makes the DLQ topic a RocketMQ one
    _fill_dlq(b, admin_limits.MAX_DLQ_SCAN)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        _dead_letter(rc, "tD", b"newest", "UNEW")
    with LoopProbe(b.port) as probe:
        listed = request(b, "GET", "/api/dlq/CGD?max=5", timeout=60).json()
        done = request(b, "POST", "/api/dlq/CGD/resend?ids=UNEW", timeout=60).json()
    print("loop worst %.3f s over %d probes" % (probe.worst(), len(probe.latencies)))
    assert listed["more"] is True
    assert [x["id"] for x in done["resent"]] == ["UNEW"], done["skipped"]


def test_listing_a_full_dead_letter_queue_does_not_stall_the_loop(broker_factory, tmp_path):
    from metaq.admin import limits as admin_limits
    from tests.hostile.common import LoopProbe
    b = _rmq_broker(broker_factory, tmp_path)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        for i in range(20):
            _dead_letter(rc, "tD", b"poison", "U%d" % i)
    _fill_dlq(b, admin_limits.MAX_DLQ_SCAN)
    with LoopProbe(b.port) as probe:
        for _ in range(3):
            listed = request(b, "GET", "/api/dlq/CGD?max=5", timeout=60)
            assert listed.status == 200 and listed.json()["more"] is True
    print("dlq list: loop worst %.1f ms, p99 %.1f ms over %d probes" % (probe.worst() * 1000, probe.p99() * 1000,
                                                                       len(probe.latencies)))
    # the loop answers other clients while a list runs (before the fix it answered none: one probe per list, taken
    # between them, each waiting ~200 ms; now the scan yields every limits.DLQ_SCAN_STEP records)
    assert not probe.failures and len(probe.latencies) > 3 * 3, (len(probe.latencies), probe.worst())
