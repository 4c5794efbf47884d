"""The clients against a real broker with a permissions file: producer, consumer, metaq-admin and raw
connections authenticate, a wrong secret is a prompt ``Unauthenticated`` (no hang, no retry storm), a broker
that cannot prove the secret is refused, reconnects authenticate again, and no secret reaches a log."""

import logging
import os
import socket
import threading
import time

import pytest
import yaml

from metaq import errors
from metaq import admincli as admin
from metaq.client import Consumer, Message, Producer
from metaq.client.connection import BrokerConnection
from metaq.client.local import BrokerProcess, free_port, small_config
from metaq.client.security import ClientSecurity
from metaq.protocol import events as ev
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import url_of, wait_for

pytestmark = pytest.mark.integration

WRONG = "not-alice-secret-9876543210"


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("acl-broker")
    acl = write_acl(wd / "acl.yaml")
    broker = BrokerProcess(wd, small_config(wd / "data", security={"acl_file": acl})).start()
    yield broker
    broker.kill()


def alice():
    return ClientSecurity("alice", SECRETS["alice"])


def credentials_file(path, user, secret=None, mode=0o600):
    with open(path, "w") as f:
        yaml.safe_dump({"user": user, "secret": secret or SECRETS[user]}, f)
    os.chmod(path, mode)
    return str(path)


def failed_auths(broker):
    return broker.log_text().count("authentication failed from")


def test_producer_and_consumer_with_the_right_credentials(acl_broker, tmp_path):
    url = url_of(acl_broker)
    with Producer(brokers=[url], security=alice()) as producer:
        results = [producer.send(Message("orders", b"order %d" % i)) for i in range(20)]
    assert all(r.success for r in results), [r.error for r in results if not r.success]
    got = []
    consumer = Consumer("billing", brokers=[url], security=alice(), recover_dir=str(tmp_path / "recover"),
                        long_poll_ms=200)
    consumer.subscribe("orders", lambda m: got.append(bytes(m.body)))
    with consumer.start():
        wait_for(lambda: len(got) >= 20, what=lambda: "20 messages consumed, got %d" % len(got))
    assert set(got) >= {b"order %d" % i for i in range(20)}


def test_many_requests_on_a_fresh_connection_all_go_after_the_handshake(acl_broker):
    with BrokerConnection(url_of(acl_broker), security=alice()) as conn:
        futures = []
        threads = [threading.Thread(target=lambda: futures.extend(conn.request(ev.Stats(None, 0)) for _ in range(25)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = [f.result(10).code for f in futures]
    assert codes == [200] * 100  # not one written before the auth exchange (it would be answered 401)
    assert conn.connect_count == 1


def test_a_wrong_secret_fails_sends_at_once_without_a_retry_storm(acl_broker):
    before = failed_auths(acl_broker)
    started = time.monotonic()
    with Producer(brokers=[url_of(acl_broker)], security=ClientSecurity("alice", WRONG), retry_deadline=60) as p:
        results = [p.send(Message("orders", b"x")) for _ in range(20)]
    elapsed = time.monotonic() - started
    assert all(not r.success and isinstance(r.error, errors.Unauthenticated) for r in results)
    assert "refused the credentials of user alice" in str(results[0].error)
    assert elapsed < 30.0, elapsed  # not the 60 s retry deadline
    wait_for(lambda: failed_auths(acl_broker) > before, what="the broker's log line")
    assert failed_auths(acl_broker) - before == 1  # one attempt, then the same answer without reconnecting


def test_a_wrong_secret_stops_a_consumer_start_and_a_fetch(acl_broker, tmp_path):
    started = time.monotonic()
    consumer = Consumer("billing", brokers=[url_of(acl_broker)], security=ClientSecurity("alice", WRONG),
                        recover_dir=str(tmp_path / "recover"))
    consumer.subscribe("orders", lambda m: None)
    with pytest.raises(errors.Unauthenticated, match="refused the credentials"):
        consumer.start()
    assert time.monotonic() - started < 3.0
    with BrokerConnection(url_of(acl_broker), security=ClientSecurity("alice", WRONG)) as conn:
        for _ in range(3):
            with pytest.raises(errors.Unauthenticated):
                conn.call(ev.Stats(None, 0))
        assert conn.connect_count == 0


def test_no_credentials_and_another_users_topic_are_refused_with_the_broker_s_words(acl_broker, tmp_path):
    with BrokerConnection(url_of(acl_broker), security=ClientSecurity()) as conn:
        reply = conn.call(ev.Stats(None, 0))
    assert reply.code == 401 and b"authentication required" in bytes(reply.body)
    consumer = Consumer("billing", brokers=[url_of(acl_broker)], security=ClientSecurity("bob", SECRETS["bob"]),
                        recover_dir=str(tmp_path / "recover"))
    with pytest.raises(errors.Forbidden, match="permission denied: user bob"):
        consumer.fetch("orders", "7-0", 0)
    consumer.close()


def test_a_reconnect_authenticates_again(tmp_path):
    wd = tmp_path / "b"
    wd.mkdir()
    config = small_config(wd / "data", security={"acl_file": write_acl(wd / "acl.yaml")})
    config["broker"]["port"] = free_port()
    broker = BrokerProcess(wd, config).start()
    try:
        with BrokerConnection(url_of(broker), security=alice(), initial_backoff=0.05, max_backoff=0.2) as conn:
            assert conn.call(ev.Stats(None, 0)).code == 200
            broker.stop()
            broker.start()

            def answered():
                try:
                    return conn.call(ev.Stats(None, 0), timeout=2).code == 200
                except errors.ConnectionLost:
                    return False

            wait_for(answered, what="stats after the restart")
            assert conn.connect_count == 2
        assert broker.log_text(since_start=True).count("authenticated as alice") == 1  # the new broker's one
    finally:
        broker.kill()


def test_a_broker_with_authentication_off_is_refused_unless_optional(broker):
    url = url_of(broker)  # the plain broker of conftest: no permissions file
    with BrokerConnection(url, security=alice()) as conn:
        with pytest.raises(errors.Unauthenticated, match="cannot prove it holds user alice's secret"):
            conn.call(ev.Stats(None, 0))
    optional = ClientSecurity("alice", SECRETS["alice"], optional=True)
    with BrokerConnection(url, security=optional) as conn:
        assert conn.call(ev.Stats(None, 0)).code == 200


def impostor(listener, stop):
    """A server that takes any proof and answers with a made-up one of its own (it does not know the secret)."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            sock, _ = listener.accept()
        except socket.timeout:
            continue
        with sock:
            parser = TextParser()
            sock.settimeout(5)
            while True:
                event = parser.next_event()
                if event is NEED_DATA:
                    data = sock.recv(4096)
                    if not data:
                        break
                    parser.receive_data(data)
                    continue
                body = b"ab" * 16 if event.client_nonce is None else b"00" * 32
                sock.sendall(serialize(ev.Result(200, body, event.opaque)))


def test_a_broker_that_cannot_prove_the_secret_is_an_impostor():
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    thread = threading.Thread(target=impostor, args=(listener, stop), daemon=True)
    thread.start()
    try:
        url = "meta://127.0.0.1:%d" % listener.getsockname()[1]
        with BrokerConnection(url, security=alice()) as conn:
            with pytest.raises(errors.Unauthenticated, match="could not prove it holds user alice's secret .*impostor"):
                conn.call(ev.Stats(None, 0))
            assert not conn.connected
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_no_secret_in_logs_or_reprs(acl_broker, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    url = url_of(acl_broker)
    with Producer(brokers=[url], security=ClientSecurity("alice", WRONG)) as p:
        bad = p.send(Message("orders", b"x"))
    with Producer(brokers=[url], security=alice()) as p:
        good = p.send(Message("orders", b"y"))
        texts = [repr(p._pool.get(url)), repr(p._pool.get(url).security)]  # noqa: SLF001
    assert not bad.success and good.success
    texts += [caplog.text, str(bad.error), repr(bad)]
    assert "refused the credentials" in caplog.text  # the failure is logged...
    for secret in (WRONG, SECRETS["alice"]):
        for text in texts:
            assert secret not in text  # ...without the secret
        assert secret not in acl_broker.log_text()


def test_metaq_admin_with_and_without_credentials(acl_broker, tmp_path, capsys):
    url = url_of(acl_broker)
    path = credentials_file(tmp_path / "admin.yaml", "admin")
    assert admin.main(["--brokers", url, "--credentials", path, "--json", "stats"]) == admin.EXIT_OK
    out = capsys.readouterr()
    assert '"key": "broker_id"' in out.out and out.err == ""

    assert admin.main(["--brokers", url, "stats"]) == admin.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "401 authentication required" in err and "--credentials FILE" in err

    secret_file = tmp_path / "admin.secret"
    secret_file.write_text(SECRETS["admin"] + "\n")
    secret_file.chmod(0o600)
    assert admin.main(["--brokers", url, "--user", "admin", "--secret-file", str(secret_file), "stats"]) == 0
    capsys.readouterr()

    loose = credentials_file(tmp_path / "loose.yaml", "admin", mode=0o644)
    assert admin.main(["--brokers", url, "--credentials", loose, "stats"]) == admin.EXIT_USAGE
    err = capsys.readouterr().err
    assert "group or others (mode 0644)" in err and SECRETS["admin"] not in err

    wrong = credentials_file(tmp_path / "wrong.yaml", "admin", secret=WRONG)
    assert admin.main(["--brokers", url, "--credentials", wrong, "stats"]) == admin.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "refused the credentials of user admin" in err and WRONG not in err


def test_metaq_admin_takes_credentials_from_the_environment(acl_broker, tmp_path, capsys, monkeypatch):
    with Producer(brokers=[url_of(acl_broker)], security=ClientSecurity("alice", SECRETS["alice"])) as producer:
        assert producer.send(Message("orders", b"listed")).success  # a topic to list, whatever ran before
    monkeypatch.setenv("METAQ_CREDENTIALS", credentials_file(tmp_path / "admin.yaml", "admin"))
    assert admin.main(["--brokers", url_of(acl_broker), "topics"]) == admin.EXIT_OK
    assert "orders" in capsys.readouterr().out


def test_the_lag_collector_reads_brokers_with_credentials(acl_broker):
    from metaq.spark.collector import collect_snapshot

    url = url_of(acl_broker)
    snap = collect_snapshot(brokers=[url], security=ClientSecurity("admin", SECRETS["admin"]))
    assert [(b["status"], b["broker_id"]) for b in snap.brokers] == [("UP", 7)]
    snap = collect_snapshot(brokers=[url], security=ClientSecurity())
    assert [b["status"] for b in snap.brokers] == ["DOWN"] and "401" in snap.brokers[0]["error"]
    snap = collect_snapshot(brokers=[url], security=ClientSecurity("admin", WRONG))
    assert "refused the credentials of user admin" in snap.brokers[0]["error"]
