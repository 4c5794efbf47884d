"""A hostile client's review of issue 16 (authentication, authorization, TLS): each test reproduces one hole
found against a real broker. A test marked ``xfail(strict=True)`` shows a hole that is still open: it fails
(XPASS) once the hole is fixed, so remove the mark then."""

import threading
import time


from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.timers.levels import SCHEDULE_TOPIC
from tests.harness.acl import DEFAULT_USERS, SECRETS, login, secured_config, write_acl
from tests.harness.broker import wait_for


secured = secured_config


def test_reader_denied_payroll_cannot_read_payroll_delayed_messages(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    with login(b, "admin") as admin:
        body = b"salary of the CEO: 1,000,000"
        r = admin.call(ev.DelayedPut("payroll", 0, 0, body, 1, metaq_checksum(body), 5))
        assert r.code == 200, r
    with login(b, "reader") as reader:
        assert reader.get("payroll", 0, 0).code == 403  # the direct read is refused...
        leaked = b""
        for partition in range(18):  # ...but the delay scheduler's topic holds the body, one partition per level
            r = reader.call(ev.Get(SCHEDULE_TOPIC, "g", partition, 0, 1 << 16, 2, None))
            if isinstance(r, ev.Value):
                leaked += r.body
    assert b"salary of the CEO" not in leaked


def test_reader_denied_payroll_cannot_read_payroll_timed_messages(broker_factory, tmp_path):
    from metaq.timers.records import TIMER_TOPIC
    from metaq.timers.wire import TimerCancelCommand, TimerList, TimerPut
    b = broker_factory(secured(tmp_path))
    with login(b, "admin") as admin:
        body = b"salary of the CEO: 1,000,000"
        r = admin.call(TimerPut("payroll", 0, 0, body, 1, metaq_checksum(body), "+600000"))
        assert r.code == 200, r
        msg_id = int(r.body.split()[0])
    with login(b, "reader") as reader:
        r = reader.call(ev.Get(TIMER_TOPIC, "g", 0, 0, 1 << 16, 2, None))  # the timer topic holds the body
        assert isinstance(r, ev.Result) and r.code == 403, r
        assert reader.call(TimerList("*", 10, 3)).code == 403  # listing and cancelling are the admin's
        assert reader.call(TimerCancelCommand(msg_id, 4)).code == 403
        r = reader.call(TimerPut("payroll", 0, 0, b"x", 5, metaq_checksum(b"x"), "+1000"))
        assert r.code == 403, r


WRITER = dict(DEFAULT_USERS, writer={"secret": "writer-secret-0123456789", "default_topic": "pub",
                                     "topics": {"payroll": "deny"}})
WRITER_SECRETS = dict(SECRETS, writer="writer-secret-0123456789")


def test_half_message_into_the_scheduler_topic_is_refused(broker_factory, tmp_path):
    from metaq.client.local import rmq_config
    from metaq.client.raw import RemotingClient
    from metaq.timers.levels import encode_entry
    from metaq.protocol.rocketmq.remoting import ResponseCode
    from tests.harness.rocketmq import end_tx, send_v1

    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml", users=WRITER)},
                     store={"flush": "async", "flush_interval_ms": 50})
    b = broker_factory(cfg, workdir=wd)
    now = int(time.time() * 1000)
    forged = encode_entry("payroll", 0, 0, metaq_checksum(b"forged raise"), now, now, 1, b"forged raise")
    with RemotingClient(b.config["remoting"]["port"], credentials=("writer", WRITER_SECRETS["writer"])) as rc:
        assert send_v1(rc, SCHEDULE_TOPIC, forged).code != ResponseCode.SUCCESS  # a plain send is refused
        sent = send_v1(rc, SCHEDULE_TOPIC, forged, queue=0, sys_flag=4)  # 4: TRANSACTION_PREPARED
        committed = sent.code == ResponseCode.SUCCESS and end_tx(rc, sent, 8).code == ResponseCode.SUCCESS
    assert not committed


def _burst(topic, n, first_opaque):
    from metaq.protocol.text import serialize
    return b"".join(serialize(ev.Put(topic, 0, 0, b"m%d" % i, first_opaque + i, metaq_checksum(b"m%d" % i), None))
                    for i in range(n))


def test_a_reload_revokes_publishing_on_the_put_fast_path(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    c = login(b, "alice")
    c.send(_burst("orders", 20, 1))
    assert [c.read_event().code for _ in range(20)] == [200] * 20
    users = dict(DEFAULT_USERS)
    del users["alice"]  # alice is fired
    write_acl(tmp_path / "acl.yaml", users=users)
    with login(b, "admin") as admin:  # acl_reload_s is 0.2: the file is looked at again within that
        wait_for(lambda: admin.stats_dict()["acl_reloads"] != "0", what="the file reloaded")
        assert admin.stats_dict()["acl_reloads"] == "1"
    assert c.call(ev.Offset("orders", "g", 0, 0, 99)).code == 401  # the general path has revoked her...
    c.send(_burst("orders", 20, 100))
    codes = [c.read_event().code for _ in range(20)]
    assert codes == [401] * 20, codes  # ...the fast path still stores her puts


def test_stats_does_not_show_a_user_topics_and_groups_it_may_not_see(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    with login(b, "admin") as admin:
        for i in range(3):
            admin.put_ok("payroll", b"pay%d" % i, partition=0)
        assert admin.call(ev.CommitOffset("hr-secret-group", "payroll", 0, 2, 1)).code == 200
    with login(b, "bob") as bob:
        assert bob.call(ev.QueryOffset("hr-secret-group", "payroll", 0, 1)).code == 403  # refused directly
        seen = "".join(bob.stats(item) for item in ("offsets", "groups", "topics"))
        r = bob.call(ev.Stats("payroll", 9))
        assert r.code == 403 and b"not one this user may subscribe to" in r.body
    assert "hr-secret-group" not in seen and "payroll" not in seen, seen
    with login(b, "admin") as admin:  # an admin still sees everything
        assert "hr-secret-group" in admin.stats("groups") and "payroll" in admin.stats("topics")


def _remoting_broker(broker_factory, tmp_path, users=None):
    from metaq.client.local import rmq_config
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml", users=users)},
                     store={"flush": "async", "flush_interval_ms": 50})
    return broker_factory(cfg, workdir=wd)


def test_another_user_cannot_end_my_half_message(broker_factory, tmp_path):
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.remoting import ResponseCode
    from metaq.protocol.rocketmq.remoting import RequestCode as R
    from metaq.transactions.state import HALF_ID_BASE
    from tests.harness.rocketmq import send_v1

    b = _remoting_broker(broker_factory, tmp_path)
    port = b.config["remoting"]["port"]
    with RemotingClient(port, credentials=("alice", SECRETS["alice"])) as alice, \
            RemotingClient(port, credentials=("bob", SECRETS["bob"])) as bob:
        sent = send_v1(alice, "orders", b"only if my local transaction commits", sys_flag=4)
        assert sent.code == ResponseCode.SUCCESS, sent
        # bob was told nothing: half numbers count from 1 per broker run, and the commitLogOffset is HALF_ID_BASE
        # plus the number (the msgId field is not checked)
        r = bob.call(R.END_TRANSACTION, {"producerGroup": "PG", "tranStateTableOffset": 1,
                                         "commitLogOffset": HALF_ID_BASE + 1, "commitOrRollback": 12,  # rollback
                                         "msgId": "0", "fromTransactionCheck": "false"})
        assert r.code != ResponseCode.SUCCESS, "bob rolled back alice's half message"


def test_reader_denied_payroll_cannot_read_payroll_dead_letters(broker_factory, tmp_path):
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.bodies import parse_offset_msg_id
    from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode
    from tests.harness.rocketmq import send_v1

    b = _remoting_broker(broker_factory, tmp_path)
    with RemotingClient(b.config["remoting"]["port"], credentials=("admin", SECRETS["admin"])) as hr:
        # the payroll service (here the admin) fails to process a message: its consumer sends it to the DLQ
        sent = send_v1(hr, "payroll", b"bonus of the CFO", props={"UNIQ_KEY": "U1"})
        physical = parse_offset_msg_id(sent.ext_fields["msgId"])[2]
        back = {"offset": physical, "group": "hr", "delayLevel": -1, "originMsgId": "U1", "originTopic": "payroll"}
        assert hr.call(R.CONSUMER_SEND_MSG_BACK, back).code == ResponseCode.SUCCESS
    time.sleep(0.5)
    with login(b, "reader") as reader:
        assert reader.get("payroll", 0, 0).code == 403
        leaked = b""
        for topic in ("%DLQ%hr", "%RETRY%hr"):
            for partition in range(4):
                r = reader.get(topic, partition, 0)
                if isinstance(r, ev.Value):
                    leaked += r.body
    assert b"bonus of the CFO" not in leaked


def test_a_tls_renegotiation_is_refused_at_once(broker_factory, tmp_path):
    import subprocess

    from tests.harness.pki import Pki

    pki = Pki(tmp_path / "pki")
    b = broker_factory(small_config(tmp_path / "data", security={"tls": pki.tls_config("on", False)}))
    # OpenSSL 3.0's s_client renegotiates on a line "R" (without -ign_eof, which turns its commands off), when "R"
    # begins what one read of its stdin returns: each line is written once the client is ready for it (the session
    # up, the line before answered), not after a fixed time (two lines read at once both go to the broker).
    p = subprocess.Popen(["openssl", "s_client", "-connect", "127.0.0.1:%d" % b.port, "-CAfile", pki.ca, "-tls1_2"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, b"")), daemon=True)
    reader.start()

    def printed(prefix):
        return any(line.lstrip().startswith(prefix) for line in list(lines)) or p.poll() is not None

    try:
        wait_for(lambda: printed(b"Verify return code"), 30, "the TLS session up")
        p.stdin.write(b"version 1\r\n")
        p.stdin.flush()
        wait_for(lambda: printed(b"result 200"), 30, "the answer to version over TLS")
        p.stdin.write(b"R\n")
        p.stdin.flush()
        try:
            p.wait(timeout=5)  # refused: an alert, and s_client ends
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
    finally:
        p.kill()
        p.wait()
        reader.join(10)
        out = b"".join(lines).decode("utf-8", "replace")
    assert "RENEGOTIATING" in out and "result 200" in out, out  # the session was up, the renegotiation tried
    assert ended, "the renegotiating client still waits after 5 s: " + out[-300:]


def test_a_second_auth_on_a_connection_drops_the_first_users_publish_rights(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    c = login(b, "alice")
    c.send(_burst("orders-eu", 10, 1))
    assert [c.read_event().code for _ in range(10)] == [200] * 10
    assert c.auth("bob", SECRETS["bob"]).code == 200  # the same connection, now bob's (orders only)
    assert c.call(ev.Put("orders-eu", 0, 0, b"x", 50, metaq_checksum(b"x"), "TX:1:1")).code == 403  # general path
    c.send(_burst("orders-eu", 10, 100))
    codes = [c.read_event().code for _ in range(10)]
    assert codes == [403] * 10, codes
