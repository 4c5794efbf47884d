"""Issue 16 points 1, 3 and 7 on the text port of a real broker: the ``auth`` handshake, ``result 401`` before it
for every command, each command checked against the user's permissions, the address allow-list, reloads of the
permissions file, and the protected mode of a broker with authentication off."""

import json
import socket
import time
import zlib

import pytest

from metaq.client.local import small_config
from metaq.client.raw import TextClient
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import TextParser, serialize
from tests.harness.acl import SECRETS, login, secured_config, write_acl
from tests.harness.broker import wait_for


secured = secured_config


def put_event(topic, body=b"x", opaque=1, tx_key=None):
    return ev.Put(topic, -1, 0, body, opaque, metaq_checksum(body), tx_key)


#: One of every request a client can send before it authenticates (``auth``, ``version`` and ``quit`` aside).
EVERY_COMMAND = [
    put_event("orders"),
    ev.DelayedPut("orders", -1, 0, b"x", 1, metaq_checksum(b"x"), 1),
    ev.Get("orders", "billing", 0, 0, 1024, 1, None),
    ev.Offset("orders", "billing", 0, 0, 1),
    ev.OffsetAt("orders", 0, 0, 1),
    ev.CommitOffset("billing", "orders", 0, 5, 1),
    ev.QueryOffset("billing", "orders", 0, 1),
    ev.Stats(None, 1),
    ev.Stats("reset", 1),
    ev.Stats("config", 1),
    ev.Transaction("TX:1:2", "sessionid", "BEGIN", 1),
    ev.Transaction("TX:1:2", "sessionid", "RECOVER", 1),
    ev.Sync("orders", 0, 0, 1, b"x", 1, metaq_checksum(b"x")),
    ev.Promote(True, 1),
]


def test_every_command_before_auth_is_401_and_changes_nothing(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    with b.client() as c:
        for event in EVERY_COMMAND:
            r = c.call(event)
            assert isinstance(r, ev.Result) and r.code == 401, (event, r)
            assert b"authentication required: send auth <user> <opaque> first" in r.body
        assert c.call(ev.Version(9)).code == 200  # the connection stays usable: version, then auth
        assert c.auth("admin", SECRETS["admin"]).code == 200
        summary = c.stats_dict()
        assert summary["total_messages"] == "0" and summary["auth"] == "on" and summary["tls"] == "off"
        assert c.call(ev.QueryOffset("billing", "orders", 0, 3)).code == 404  # the commit above was not taken


def test_pipelined_puts_stop_at_a_refused_topic_and_answer_each_in_order(broker_factory, tmp_path):
    """The put fast path takes a burst only up to a topic the user may not publish to; that put gets its 403 and
    the ones after it are still answered, in order (and stored when allowed)."""
    b = broker_factory(secured(tmp_path))
    c = login(b, "alice")
    topics = ["orders"] * 50 + ["payroll"] + ["orders"] * 50 + ["elsewhere"] + ["orders"] * 10
    c.send(b"".join(serialize(put_event(t, b"m%d" % i, i)) for i, t in enumerate(topics)))
    replies = [c.read_event() for _ in topics]
    assert [r.opaque for r in replies] == list(range(len(topics)))
    codes = [r.code for r in replies]
    assert codes == [200] * 50 + [403] + [200] * 50 + [403] + [200] * 10
    assert b"alice may not publish to topic payroll" in replies[50].body
    with login(b, "admin") as admin:
        assert admin.stats_dict()["total_messages"] == "110"
        assert "payroll" not in admin.stats("topics")


@pytest.mark.parametrize("user, request_, code", [
    ("alice", put_event("orders-eu"), 200),
    ("alice", put_event("payroll"), 403),
    ("alice", ev.Get("orders", "billing", 0, 0, 1024, 1, None), 404),  # allowed: nothing there yet
    ("alice", ev.Get("payroll", "billing", 0, 0, 1024, 1, None), 403),
    ("alice", ev.CommitOffset("billing", "orders", 0, 0, 1), 200),
    ("alice", ev.CommitOffset("audit", "orders", 0, 0, 1), 403),  # a group alice may not consume as
    ("alice", ev.QueryOffset("audit", "orders", 0, 1), 403),
    ("alice", ev.Offset("payroll", "billing", 0, 0, 1), 403),
    ("alice", ev.OffsetAt("orders", 0, 0, 1), 200),  # replay from a time: a read, checked as get is
    ("alice", ev.OffsetAt("payroll", 0, 0, 1), 403),
    ("bob", ev.OffsetAt("orders", 0, 0, 1), 403),  # pub only
    ("reader", ev.OffsetAt("anything", 0, 0, 1), 200),
    ("bob", put_event("orders"), 200),
    ("bob", put_event("orders-eu"), 403),  # bob's rule names orders exactly
    ("bob", ev.Get("orders", "g", 0, 0, 1024, 1, None), 403),  # pub only
    ("reader", ev.Get("anything", "any-group", 0, 0, 1024, 1, None), 404),  # the role's default sub
    ("reader", ev.Get("payroll", "g", 0, 0, 1024, 1, None), 403),  # the user's own deny beats the role
    ("reader", ev.Get("payroll%P1", "g", 0, 0, 1024, 1, None), 403),  # and covers the topic's priority levels
    ("bob", ev.OffsetAt("orders%P2", 0, 0, 1), 403),  # a level is its topic's: pub only there
    ("reader", put_event("anything"), 403),
    ("reader", ev.Stats(None, 1), 200),  # any user may read stats
])
def test_each_command_is_checked_against_the_users_permissions(broker_factory, tmp_path, user, request_, code):
    b = broker_factory(secured(tmp_path))
    with login(b, user) as c:
        r = c.call(request_)
        assert r.code == code, r
        if code == 403:
            assert b"permission denied: user %s" % user.encode() in r.body


def test_failed_auth_is_401_then_closed_and_the_broker_serves_on(broker_factory, tmp_path):
    b = broker_factory(secured(tmp_path))
    cases = [("alice", "wrong-secret"), ("nobody", "whatever")]
    for user, secret in cases:
        with b.client() as c:
            r = c.auth(user, secret)
            assert r.code == 401 and r.body == b"authentication failed: unknown user or wrong secret"
            c.sock.settimeout(5)
            assert c.sock.recv(10) == b""  # closed by the broker
    with b.client() as c:  # a step two with no step one, a malformed proof
        r = c.call(ev.Auth("alice", "ab" * 8, "cd" * 32, 3))
        assert r.code == 401 and b"no nonce outstanding" in r.body
    with b.client() as c:
        c.send(b"auth alice 0123 zz 4\r\n")
        r = c.read_event()
        assert r.code == 400 and b"invalid client nonce" in r.body
    log = b.log_text()
    assert "wrong proof for user alice" in log and "unknown user nobody" in log
    assert "Traceback" not in log
    assert all(s not in log for s in SECRETS.values())  # no secret is ever logged
    with login(b, "alice") as c:
        assert c.put("orders", b"still served").code == 200


def test_repeated_failures_from_one_address_are_slowed(broker_factory, tmp_path):
    from metaq.auth import limits as auth_limits

    b = broker_factory(secured(tmp_path))
    took = []
    for _ in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY + 1):
        with b.client() as c:
            started = time.monotonic()
            assert c.auth("alice", "guess").code == 401
            took.append(time.monotonic() - started)
    assert max(took[:-1]) < auth_limits.AUTH_FAILURE_DELAY_S
    assert took[-1] >= auth_limits.AUTH_FAILURE_DELAY_S * 0.9
    with login(b, "alice") as c:  # the right secret still works at once
        assert c.call(ev.Version(1)).code == 200


def test_guessers_rotating_their_address_within_a_network_are_slowed_too(broker_factory, tmp_path):
    from metaq.auth import limits as auth_limits

    b = broker_factory(secured(tmp_path))
    took = []
    for i in range(auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY
                   + 1):  # one guess from each of 21 addresses of 127.0.0/24
        with TextClient("127.0.0.1", b.port, source="127.0.0.%d" % (i + 10)) as c:
            started = time.monotonic()
            assert c.auth("alice", "guess-%d" % i).code == 401
            took.append(time.monotonic() - started)
    assert max(took[:-1]) < auth_limits.AUTH_FAILURE_DELAY_S  # no address passed its own limit
    assert took[-1] >= auth_limits.AUTH_FAILURE_DELAY_S * 0.9  # the network did
    with TextClient("127.0.0.1", b.port, source="127.0.0.9") as c:  # the right secret from that network: at once
        started = time.monotonic()
        assert c.auth("alice", SECRETS["alice"]).code == 200
        assert time.monotonic() - started < auth_limits.AUTH_FAILURE_DELAY_S


def test_reloaded_permissions_apply_to_open_connections(broker_factory, tmp_path):
    config = secured(tmp_path)
    b = broker_factory(config)
    c = login(b, "bob")
    assert c.put("orders", b"1").code == 200
    users = {"bob": {"secret": SECRETS["bob"], "topics": {"orders": "deny"}}, "admin": {"secret": SECRETS["admin"],
                                                                                        "admin": True}}
    write_acl(config["security"]["acl_file"], users=users, roles={})
    wait_for(lambda: c.put("orders", b"2").code == 403, timeout=10, what="the reload to revoke bob's publish")
    with open(config["security"]["acl_file"], "w") as f:
        f.write("users: {bob: [broken\n")
    wait_for(lambda: "not reloaded, the previous version stays in force" in b.log_text(), timeout=10,
             what="the bad file to be logged")
    assert c.put("orders", b"3").code == 403  # the last good version holds
    with login(b, "admin") as admin:
        assert admin.stats_dict()["acl_reload_error"] == "true"


def _connect_from(source, port):
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_allow_list_refuses_other_addresses_before_anything(broker_factory, tmp_path):
    config = secured(tmp_path)
    write_acl(config["security"]["acl_file"], allow=["127.0.0.1"])
    b = broker_factory(config)
    with _connect_from("127.0.0.2", b.port) as sock:
        parser = TextParser()
        data = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        parser.receive_data(data)
        r = parser.next_event()
        assert r.code == 503 and b"127.0.0.2 is not in the allow-list" in r.body
    with _connect_from("127.0.0.1", b.port) as sock:
        sock.sendall(serialize(ev.Version(1)))
        assert b"result 200" in sock.recv(100)


def test_protected_mode_refuses_a_public_address_with_auth_off(broker_factory, tmp_path):
    config = small_config(tmp_path / "data", broker={"host": "0.0.0.0"})
    b = broker_factory(config, start=False)
    b.start(expect_ready=False)
    assert b.wait_exit(30) != 0
    log = b.log_text()
    assert "broker.host 0.0.0.0 is not a loopback address and authentication is off" in log
    assert "security.insecure: true" in log


def test_insecure_starts_and_says_so_at_every_start(broker_factory, tmp_path):
    config = small_config(tmp_path / "data", broker={"host": "0.0.0.0"}, security={"insecure": True})
    b = broker_factory(config)
    with TextClient("127.0.0.1", b.port) as c:
        assert c.stats_dict()["auth"] == "off"
    assert "INSECURE: listening on 0.0.0.0 with authentication off" in b.log_text()
    b.stop()
    b.start()
    assert b.log_text().count("INSECURE: listening on 0.0.0.0") == 2


def test_auth_on_a_broker_without_authentication_is_a_clear_400(broker):
    with broker.client() as c:
        r = c.auth("alice", "x")
        assert r.code == 400 and b"authentication is off on this broker" in r.body
        assert c.put("t", b"still open").code == 200


def _security_section(form, security):
    """The ``security:`` section in one YAML form: each was once shown by ``stats config``, which edited the
    file's text line by line (only the block form was caught)."""
    if form == "flow":
        return "security: {%s}\n" % ", ".join("%s: %s" % (k, json.dumps(v)) for k, v in security.items())
    lines = []
    for k, v in security.items():
        if k == "replication_secret" and form == "block scalar":
            lines.append("  %s: >-\n    %s\n" % (k, v))
        else:
            lines.append("  %s: %s\n" % (k, json.dumps(v)))
    return "security:\n" + "".join(lines)


@pytest.mark.parametrize("form", ["block", "flow", "block scalar"])
def test_no_secret_in_stats_config_or_check_config(broker_factory, tmp_path, form):
    import subprocess
    import sys

    import yaml

    secret = "replication-secret-0123456789abcdef"
    config = secured(tmp_path, replication_secret=secret)
    security = config.pop("security")
    text = yaml.safe_dump(config) + _security_section(form, security)
    b = broker_factory(dict(config, security=security), start=False)
    b.config_text = text
    b.start()
    for user in ("admin", "bob"):  # any logged-in user may ask for stats config
        with login(b, user) as c:
            shown = c.stats("config")
        assert "replication_secret: <redacted>" in shown and secret not in shown and secret[:16] not in shown
        assert yaml.safe_load(shown)["security"]["acl_file"] == security["acl_file"]
    out = subprocess.run([sys.executable, "-m", "metaq.server", "-c", b.config_path, "--check-config"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "replication_secret: <redacted>" in out.stdout and secret not in out.stdout
    assert secret not in b.log_text()
    with login(b, "bob") as c:  # the summary's checksum is of the redacted view: no oracle for the secret
        summary = c.stats_dict()
    assert int(summary["config_checksum"]) == zlib.crc32(shown.encode("utf-8"))


def test_a_grant_on_a_topic_covers_its_priority_levels(broker_factory, tmp_path):
    # a priority consumer's divergence probes and offsets name the levels' own topics (<topic>%P<k>): a user granted
    # the topic exactly must be able to read them, or its fetcher would stop at the first failover
    users = {"admin": {"secret": SECRETS["admin"], "admin": True},
             "alice": {"secret": SECRETS["alice"], "topics": {"jobs": "sub"}, "groups": {"g": "sub"}}}
    b = broker_factory(secured(tmp_path, users=users))
    with login(b, "admin") as c:
        from tests.client.test_priorities import create

        create(c, "jobs", partitions=1, priorities=3)
        assert c.put_prio("jobs", b"urgent", 2, partition=0).code == 200
    with login(b, "alice") as c:
        records = c.get_records("jobs%P2", 0, 0)
        assert [r.data for r in records] == [b"urgent"]
        assert c.call(ev.OffsetAt("jobs%P1", 0, 0, 1)).code == 200
        r = c.get_prio("jobs", 0, [0, 0, 1], group="g", expects=[None, None, (0, records[0].msg_id)])
        assert isinstance(r, ev.Result) and r.code == 404, r  # read past it, checked: nothing new
        r = c.get_prio("jobs", 0, [0, 0, 1], group="g", expects=[None, None, (0, records[0].msg_id + 1)])
        assert r.code == 412 and r.body.startswith(b"2 diverged: "), r
        r = c.call(ev.Get("jobsx%P1", "g", 0, 0, 1024, 1, None))  # another topic's level: not granted
        assert r.code == 403 and b"may not subscribe to topic jobsx%P1" in r.body, r
