"""The transaction check-back against real brokers, our codec acting as the transactional producer: the check's
header and body, the answer committing or rolling back, the maximum number of checks, a producer reconnecting,
no producer online, forged ends, and a half message across a broker kill -9."""

import json
import socket

import pytest

from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import decode_stored_message, decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.headers import CheckTransactionStateHeader, decode_header
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.protocol.stream import CLOSED
from tests.harness.broker import wait_for
from tests.harness.rocketmq import pull, send_v1

#: Small values so a round comes often; the timeout 0 makes a message due at the first round after it is stored.
FAST = {"transaction_check_interval_ms": 200, "transaction_timeout_ms": 0}
HALF = {"TRAN_MSG": "true", "PGROUP": "PG", "TAGS": "H"}


def rport(broker):
    return broker.config["remoting"]["port"]


def heartbeat(rc, group="PG", client_id="producer-1"):
    body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": group},
                                                                   {"groupName": "CLIENT_INNER_PRODUCER"}],
                       "consumerDataSet": []}).encode()
    assert rc.call(R.HEART_BEAT, {}, body).code == C.SUCCESS


def send_half(rc, topic, body, uniq):
    sent = send_v1(rc, topic, body, sys_flag=4, props=dict(HALF, UNIQ_KEY=uniq))
    assert sent.code == C.SUCCESS, sent.remark
    return sent


def next_check(rc, timeout=20.0):
    """The next CHECK_TRANSACTION_STATE the broker sends this connection: (header, stored message)."""
    while True:
        cmd = rc.read(timeout)
        assert cmd is not CLOSED, "the broker closed the producer's connection"
        if not cmd.is_response and cmd.code == R.CHECK_TRANSACTION_STATE:
            assert cmd.is_oneway
            msg, end = decode_stored_message(cmd.body, check_crc=True)
            assert end == len(cmd.body)
            return decode_header(CheckTransactionStateHeader, cmd), msg


def checks_until_quiet(rc, quiet=1.0):
    """Every check that arrives until none has for ``quiet`` s."""
    got = []
    while True:
        try:
            got.append(next_check(rc, quiet))
        except (socket.timeout, TimeoutError):
            return got


def answer(rc, check, decision, group="PG", transaction_id=None):
    """END_TRANSACTION as a producer answers a check (fields from the check and its message)."""
    h, msg = check
    return rc.call(R.END_TRANSACTION, {
        "producerGroup": group, "tranStateTableOffset": msg.queue_offset, "commitLogOffset": msg.physical_offset,
        "commitOrRollback": decision, "fromTransactionCheck": "true", "msgId": h.msg_id,
        "transactionId": transaction_id or h.transaction_id})


def visible(rc, topic):
    return decode_stored_messages(pull(rc, topic, 0, 0).body) if max_offset(rc, topic) else []


def max_offset(rc, topic):
    return int(rc.call(R.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}).ext_fields["offset"])


def tx_rollbacks(broker):
    with broker.client() as text:
        return int(text.stats().split("tx_rollback ")[1].split("\r\n")[0])


def test_a_check_carries_the_half_message_and_a_commit_answer_delivers_it_once(rmq_factory):
    b = rmq_factory(remoting=FAST)
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        sent = send_half(rc, "tC", b"pay order 17", "UNIQ-17")
        h, msg = check = next_check(rc)
        number, physical = int(sent.ext_fields["queueOffset"]), parse_offset_msg_id(sent.ext_fields["msgId"])[2]
        assert (h.tran_state_table_offset, h.commit_log_offset) == (number, physical)
        assert (h.msg_id, h.transaction_id, h.offset_msg_id, h.topic) == ("UNIQ-17", "UNIQ-17",
                                                                          sent.ext_fields["msgId"], "tC")
        assert (msg.topic, msg.queue_id, msg.queue_offset, msg.physical_offset, msg.body) == \
            ("tC", 0, number, physical, b"pay order 17")
        assert msg.sys_flag & 12 == 4  # PREPARED
        assert {k: msg.properties.get(k) for k in ("TRAN_MSG", "PGROUP", "TAGS", "UNIQ_KEY")} == \
            {"TRAN_MSG": "true", "PGROUP": "PG", "TAGS": "H", "UNIQ_KEY": "UNIQ-17"}
        assert max_offset(rc, "tC") == 0  # still invisible while it is checked
        assert answer(rc, check, 8).code == C.SUCCESS
        [m] = visible(rc, "tC")
        assert m.body == b"pay order 17" and "TRAN_MSG" not in m.properties and m.sys_flag & 12 == 0
        late = answer(rc, check, 8)  # a second answer (a later check's, a resend) finds nothing to commit
        assert late.code == C.SYSTEM_ERROR and "no half message" in late.remark
        assert len(visible(rc, "tC")) == 1


def test_a_rollback_answer_drops_the_message(rmq_factory):
    b = rmq_factory(remoting=FAST)
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        send_half(rc, "tR", b"cancelled", "UNIQ-R")
        check = next_check(rc)
        assert answer(rc, check, 12).code == C.SUCCESS
        assert answer(rc, check, 8).code == C.SYSTEM_ERROR  # rolled back: a commit after it finds nothing
        assert max_offset(rc, "tR") == 0 and tx_rollbacks(b) == 1


def test_unknown_answers_are_checked_again_and_rolled_back_after_the_maximum(rmq_factory):
    b = rmq_factory(remoting=dict(FAST, transaction_check_max=3))
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        send_half(rc, "tU", b"undecided", "UNIQ-U")
        first = next_check(rc)
        assert answer(rc, first, 0).code == C.SUCCESS  # unknown: asked again next round
        wait_for(lambda: tx_rollbacks(b) == 1, 20, "rolled back after its last check")
        checks = [first] + checks_until_quiet(rc)
        assert len(checks) == 3 and {c[1].queue_offset for c in checks} == {first[1].queue_offset}
        assert max_offset(rc, "tU") == 0
        assert answer(rc, first, 8).code == C.SYSTEM_ERROR  # too late
        assert "rolled back: no answer after 3 check-backs" in b.log_text()


def test_a_new_connection_of_the_group_is_asked_after_the_sender_closed(rmq_factory):
    b = rmq_factory(remoting=dict(FAST, transaction_check_max=1000))
    with RemotingClient(rport(b)) as sender:
        heartbeat(sender, client_id="first")
        send_half(sender, "tN", b"survives its connection", "UNIQ-N")
    with RemotingClient(rport(b)) as other, RemotingClient(rport(b)) as stranger:
        heartbeat(stranger, group="PG_OTHER", client_id="stranger")
        heartbeat(other, client_id="second")
        check = next_check(other)
        assert check[1].body == b"survives its connection"
        assert answer(other, check, 8).code == C.SUCCESS
        assert [m.body for m in visible(other, "tN")] == [b"survives its connection"]
        assert checks_until_quiet(stranger, 0.5) == []  # another group's producer is never asked


def test_with_no_producer_of_the_group_online_a_half_message_waits_for_one(rmq_factory):
    b = rmq_factory(remoting=dict(FAST, transaction_check_max=1000))
    with RemotingClient(rport(b)) as rc:
        send_half(rc, "tW", b"patient", "UNIQ-W")  # no heartbeat: not a known producer
        wait_for(lambda: "no producer of group PG to ask" in b.log_text(), 20, "a round without a producer")
        heartbeat(rc)
        check = next_check(rc)
        assert answer(rc, check, 8).code == C.SUCCESS and len(visible(rc, "tW")) == 1


def test_forged_ends_are_refused_and_leave_the_half_message_pending(rmq_factory):
    b = rmq_factory(remoting=FAST)
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        send_half(rc, "tF", b"mine", "UNIQ-F")
        check = next_check(rc)
        other_group = answer(rc, check, 8, group="PG_OTHER")
        assert other_group.code == C.SYSTEM_ERROR and "no half message" in other_group.remark
        wrong_id = answer(rc, check, 8, transaction_id="UNIQ-SOMEONE-ELSE")
        assert wrong_id.code == C.INVALID_PARAMETER and "transactionId" in wrong_id.remark
        h, msg = check
        wrong_offset = rc.call(R.END_TRANSACTION, {
            "producerGroup": "PG", "tranStateTableOffset": msg.queue_offset, "commitLogOffset": 4096,
            "commitOrRollback": 8, "fromTransactionCheck": "true", "msgId": h.msg_id})
        assert wrong_offset.code == C.SYSTEM_ERROR
        assert max_offset(rc, "tF") == 0
        assert answer(rc, check, 8).code == C.SUCCESS and len(visible(rc, "tF")) == 1


def test_half_messages_past_the_limit_are_refused(rmq_factory):
    b = rmq_factory(remoting={"max_half_messages": 2})
    with RemotingClient(rport(b)) as rc:
        send_half(rc, "tL", b"one", "L1")
        send_half(rc, "tL", b"two", "L2")
        refused = send_v1(rc, "tL", b"three", sys_flag=4, props=dict(HALF, UNIQ_KEY="L3"))
        assert refused.code == C.TRANSACTION_FAILED and "remoting.max_half_messages" in refused.remark


@pytest.mark.slow
@pytest.mark.fault
def test_a_half_message_survives_a_kill_9_and_its_answer_commits_it_exactly_once(rmq_factory):
    b = rmq_factory(remoting=dict(FAST, transaction_check_interval_ms=60_000))  # no round before the kill
    with RemotingClient(rport(b)) as rc:
        sent = send_half(rc, "tK", b"across a crash", "UNIQ-K")
    b.kill()
    b.config["remoting"].update(transaction_check_interval_ms=200)
    b.start()
    with RemotingClient(rport(b)) as rc:
        assert max_offset(rc, "tK") == 0  # still pending, still invisible
        heartbeat(rc, client_id="after-restart")
        h, msg = check = next_check(rc)
        assert (msg.queue_offset, msg.body, h.transaction_id) == (int(sent.ext_fields["queueOffset"]),
                                                                  b"across a crash", "UNIQ-K")
        assert answer(rc, check, 8).code == C.SUCCESS
        assert [m.body for m in visible(rc, "tK")] == [b"across a crash"]
    b.kill()
    b.start()
    with RemotingClient(rport(b)) as rc:
        assert [m.body for m in visible(rc, "tK")] == [b"across a crash"]  # once, after a second crash too
        assert answer(rc, check, 8).code == C.SYSTEM_ERROR


def test_due_by_the_brokers_clock_and_the_check_immunity_property_not_the_born_timestamp(rmq_factory):
    b = rmq_factory(remoting=dict(FAST, transaction_timeout_ms=3_600_000))  # due an hour after it is stored
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        old = rc.call(R.SEND_MESSAGE, {  # born in 1970: RocketMQ's rule would check it at once
            "producerGroup": "PG", "topic": "tI", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
            "queueId": 0, "sysFlag": 4, "bornTimestamp": 1, "flag": 0,
            "properties": "TRAN_MSG\x01true\x02PGROUP\x01PG\x02UNIQ_KEY\x01OLD\x02"}, b"born long ago")
        assert old.code == C.SUCCESS
        send_v1(rc, "tI", b"immune for 0 s", sys_flag=4,
                props=dict(HALF, UNIQ_KEY="NOW", CHECK_IMMUNITY_TIME_IN_SECONDS="0"))
        h, msg = next_check(rc)  # stored after the other: a round that checked both would ask about it first
        assert (h.transaction_id, msg.body) == ("NOW", b"immune for 0 s")
        assert answer(rc, (h, msg), 12).code == C.SUCCESS


def test_a_producer_that_never_answers_is_checked_the_maximum_then_rolled_back_never_delivered(rmq_factory):
    """README "half messages": the producer stays online (and keeps its heartbeat) but answers no check at all.
    After ``transaction_check_max`` checks the half message is rolled back: never visible, not even after a
    restart, and asked about no more."""
    b = rmq_factory(remoting=dict(FAST, transaction_check_max=2))
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc)
        send_half(rc, "tS", b"never answered", "UNIQ-S")
        send_v1(rc, "tS", b"a plain message after it")  # the queue moves on past the half message
        wait_for(lambda: tx_rollbacks(b) == 1, 20, "rolled back after its last unanswered check")
        checks = checks_until_quiet(rc)
        assert len(checks) == 2 and all(c[1].body == b"never answered" for c in checks)
        assert [m.body for m in visible(rc, "tS")] == [b"a plain message after it"]
        assert "rolled back: no answer after 2 check-backs" in b.log_text()
        heartbeat(rc)
        assert checks_until_quiet(rc, 0.6) == []  # rolled back for good: no further check
    b.kill()
    b.start()
    with RemotingClient(rport(b)) as rc:
        heartbeat(rc, client_id="after-restart")
        assert checks_until_quiet(rc, 0.6) == []
        assert [m.body for m in visible(rc, "tS")] == [b"a plain message after it"]
        late = answer(rc, checks[0], 8)  # a commit arriving after the rollback finds nothing to commit
        assert late.code == C.SYSTEM_ERROR and "no half message" in late.remark
        assert [m.body for m in visible(rc, "tS")] == [b"a plain message after it"]
