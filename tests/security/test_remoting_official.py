"""The official RocketMQ client (PyPI rocketmq==0.4.4, C++ core) against a broker with authentication on: its
``set_session_credentials(access_key, secret_key, channel)`` signs every request as RocketMQ 4's ACL wants.

The C++ client reports any failed send as "No route info of this topic" once its retries are spent; the broker's
reason is in the client's log (``$HOME/logs/rocketmq-cpp``), which is where its user would look."""

import pathlib

import pytest

from bench.rocketmq_peer import run_peer
from metaq.client.local import ns_of, rmq_config
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import consume_all
from tests.harness.rocketmq import received, require_official_client

pytestmark = pytest.mark.slow

ACL = "org.apache.rocketmq.acl.common.AclException: "


@pytest.fixture(autouse=True)
def _official_client():
    require_official_client()


@pytest.fixture
def secured(broker_factory, tmp_path):
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml")},
                     store={"flush": "async", "flush_interval_ms": 50})
    return broker_factory(cfg, workdir=wd)


def keys(user, secret=None):
    return ["--access-key", user, "--secret-key", secret or SECRETS[user]]


def client_log(home):
    """The C++ client's log lines of a run whose HOME was ``home``."""
    return "".join(p.read_text(errors="replace") for p in sorted(pathlib.Path(home, "logs").rglob("*log*"))
                   if p.is_file())


def stored(b, topic):
    with b.client() as text:
        assert text.auth("admin", SECRETS["admin"]).code == 200
        return sorted(rec.payload for p in (0, 1) for rec in consume_all(text, topic, p))


def produce(b, home, topic, count, *args):
    return run_peer(home, "produce", "--ns", ns_of(b), "--topic", topic, "--count", count, "--keep-going", *args,
                    timeout=120)


def test_right_keys_produce_and_a_push_consumer_consumes(secured, tmp_path):
    sent = produce(secured, tmp_path / "p", "orders", 20, *keys("alice"))
    assert [line["status"] for line in sent if "i" in line] == [0] * 20
    lines = run_peer(tmp_path / "c", "consume", "--ns", ns_of(secured), "--topic", "orders", "--group", "billing",
                     "--expect", 20, "--timeout", 60, *keys("alice"))
    assert sorted(m["body"] for m in received(lines)) == sorted("m-%d" % i for i in range(20))
    assert ACL not in client_log(tmp_path / "p") + client_log(tmp_path / "c")


def test_a_wrong_secret_fails_every_send_with_rocketmqs_error_and_stores_nothing(secured, tmp_path):
    sent = produce(secured, tmp_path / "p", "orders", 2, *keys("alice", "not-alices-secret-000"))
    assert [("error" in line) for line in sent if "i" in line] == [True, True]
    assert ACL + "Check signature failed for accessKey=alice" in client_log(tmp_path / "p")
    assert stored(secured, "orders") == []


def test_no_credentials_are_refused(secured, tmp_path):
    sent = produce(secured, tmp_path / "p", "orders", 2)
    assert [("error" in line) for line in sent if "i" in line] == [True, True]
    assert ACL + "No accessKey is configured" in client_log(tmp_path / "p")
    assert stored(secured, "orders") == []


def test_a_topic_the_user_may_not_publish_to_is_refused(secured, tmp_path):
    sent = produce(secured, tmp_path / "p", "payroll", 2, *keys("bob"))
    assert [("error" in line) for line in sent if "i" in line] == [True, True]
    assert ACL + "No default permission for topic:payroll" in client_log(tmp_path / "p")
    assert stored(secured, "payroll") == []


def test_a_group_the_user_may_not_consume_as_gets_nothing(secured, tmp_path):
    sent = produce(secured, tmp_path / "p", "orders", 3, *keys("alice"))
    assert [line["status"] for line in sent if "i" in line] == [0, 0, 0]
    lines = run_peer(tmp_path / "c", "consume", "--ns", ns_of(secured), "--topic", "orders", "--group", "audit",
                     "--expect", 3, "--timeout", 8, *keys("alice"))
    assert received(lines) == []
    assert ACL + "No default permission for group:audit" in client_log(tmp_path / "c")
    # the group the user may consume as gets all three
    lines = run_peer(tmp_path / "c2", "consume", "--ns", ns_of(secured), "--topic", "orders", "--group", "billing",
                     "--expect", 3, "--timeout", 60, *keys("alice"))
    assert sorted(m["body"] for m in received(lines)) == ["m-0", "m-1", "m-2"]
