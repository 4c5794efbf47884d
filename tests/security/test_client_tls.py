"""The clients over TLS (with authentication inside it), through a TLS-terminating proxy in front of a real
broker with a permissions file: the broker is verified against the CA given, a client certificate is presented
when asked for, and every TLS failure is a clear ``ConnectionLost``."""

import os
import time

import pytest
import yaml

from metaq import errors
from metaq import admincli as admin
from metaq.client import Consumer, Message, Producer
from metaq.client.connection import BrokerConnection
from metaq.client.local import BrokerProcess, small_config
from metaq.client.security import ClientSecurity
from metaq.protocol import events as ev
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import url_of, wait_for
from tests.harness.pki import Pki
from tests.harness.tls_proxy import TlsProxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("tls-broker")
    broker = BrokerProcess(wd, small_config(wd / "data", security={"acl_file": write_acl(wd / "acl.yaml")})).start()
    yield broker
    broker.kill()


@pytest.fixture
def proxy(acl_broker, pki):
    with TlsProxy(("127.0.0.1", acl_broker.port), pki.server_cert, pki.server_key) as p:
        yield p


def alice(pki, **tls):
    return ClientSecurity("alice", SECRETS["alice"], **tls)


def test_producer_and_consumer_over_tls(proxy, pki, tmp_path):
    sec = alice(pki, ca=pki.ca)
    with Producer(brokers=[proxy.url], security=sec) as producer:
        results = [producer.send(Message("orders-tls", b"m%d" % i)) for i in range(10)]
    assert all(r.success for r in results), [r.error for r in results if not r.success]
    got = []
    consumer = Consumer("billing", brokers=[proxy.url], security=sec, recover_dir=str(tmp_path / "r"),
                        long_poll_ms=200)
    consumer.subscribe("orders-tls", lambda m: got.append(bytes(m.body)))
    with consumer.start():
        wait_for(lambda: len(got) >= 10, what=lambda: "10 messages over TLS, got %d" % len(got))
    assert proxy.accepted >= 2 and proxy.refused == 0


def test_credentials_file_with_tls_and_metaq_admin(proxy, pki, tmp_path, capsys):
    path = tmp_path / "admin.yaml"
    path.write_text(yaml.safe_dump({"user": "admin", "secret": SECRETS["admin"], "tls": {"ca": pki.ca}}))
    path.chmod(0o600)
    assert admin.main(["--brokers", proxy.url, "--credentials", str(path), "stats"]) == admin.EXIT_OK
    assert "broker_id" in capsys.readouterr().out
    # the same with flags: --user/--secret-file and --ca
    secret = tmp_path / "admin.secret"
    secret.write_text(SECRETS["admin"])
    secret.chmod(0o600)
    assert admin.main(["--brokers", proxy.url, "--user", "admin", "--secret-file", str(secret), "--ca", pki.ca,
                       "stats"]) == admin.EXIT_OK
    capsys.readouterr()
    assert proxy.accepted == 2


def test_an_untrusted_broker_certificate_is_refused(proxy, pki):
    started = time.monotonic()
    for sec, words in ((alice(pki, tls=True), "certificate is not trusted"),  # the system store: not our CA
                       (alice(pki, ca=pki.rogue_ca), "certificate is not trusted"),
                       (alice(pki, ca=pki.ca, server_hostname="broker.example.com"), "Hostname mismatch")):
        with BrokerConnection(proxy.url, security=sec) as conn:
            with pytest.raises(errors.ConnectionLost, match=words) as exc:
                conn.call(ev.Stats(None, 0))
            assert "--ca" in str(exc.value) and not conn.connected
    assert time.monotonic() - started < 5
    assert proxy.accepted == 0


def test_tls_to_a_plaintext_port_fails_clearly(acl_broker, pki):
    with BrokerConnection(url_of(acl_broker), security=alice(pki, ca=pki.ca), connect_timeout=2) as conn:
        with pytest.raises(errors.ConnectionLost, match="TLS handshake with .* failed"):
            conn.call(ev.Stats(None, 0))


def test_a_client_certificate_is_presented_when_asked_for(acl_broker, pki):
    with TlsProxy(("127.0.0.1", acl_broker.port), pki.server_cert, pki.server_key, ca=pki.ca) as strict:
        with BrokerConnection(strict.url, security=alice(pki, ca=pki.ca, cert=pki.client_cert,
                                                         key=pki.client_key)) as conn:
            assert conn.call(ev.Stats(None, 0)).code == 200
        assert strict.peer_names == ["alice"]
        for sec in (alice(pki, ca=pki.ca), alice(pki, ca=pki.ca, cert=pki.rogue_cert, key=pki.rogue_key)):
            with BrokerConnection(strict.url, security=sec, connect_timeout=2) as conn:
                with pytest.raises(errors.ConnectionLost):
                    conn.call(ev.Stats(None, 0))
        wait_for(lambda: strict.refused == 2, what="two refused handshakes")


def test_tls_connections_opened_and_closed_in_a_loop_never_mix_their_streams(proxy, pki):
    # An ssl.SSLSocket closed while its reader thread is still inside SSL_read keeps reading the descriptor number
    # it was given, which the next connection reuses: bad record MACs, stolen replies (TlsSocket avoids it).
    sec = alice(pki, ca=pki.ca)
    failures = []
    for i in range(150):
        with BrokerConnection(proxy.url, security=sec, heartbeat_interval=0) as conn:
            futures = [conn.request(ev.Stats(None, 0)) for _ in range(10)]
            try:
                codes = [f.result(10).code for f in futures]
            except errors.MetaqError as exc:
                failures.append((i, exc))
                continue
            if codes != [200] * 10:
                failures.append((i, codes))
    assert failures == []
    assert proxy.refused == 0


def test_pipelined_sends_over_one_tls_connection(proxy, pki):
    with Producer(brokers=[proxy.url], security=alice(pki, ca=pki.ca)) as producer:
        futures = [producer.send_async(Message("orders-burst", os.urandom(100))) for _ in range(3000)]
        results = [f.result(60) for f in futures]
    assert all(r.success for r in results), next(r.error for r in results if not r.success)
    assert len({(str(r.partition), r.offset) for r in results}) == 3000


def test_producer_consumer_and_admin_over_the_brokers_own_tls(pki, tmp_path, capsys):
    """No proxy: the broker's own TLS (``security.tls``), a client certificate required, authentication inside."""
    wd = tmp_path / "b"
    wd.mkdir()
    tls = pki.tls_config("on", verify_clients=True)
    broker = BrokerProcess(wd, small_config(wd / "data", security={"acl_file": write_acl(wd / "acl.yaml"),
                                                                   "tls": tls})).start()
    try:
        url = url_of(broker)
        sec = alice(pki, ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
        with Producer(brokers=[url], security=sec) as producer:
            results = [producer.send(Message("orders-tls", b"m%d" % i)) for i in range(20)]
        assert all(r.success for r in results), [r.error for r in results if not r.success]
        got = []
        consumer = Consumer("billing", brokers=[url], security=sec, recover_dir=str(tmp_path / "r"), long_poll_ms=200)
        consumer.subscribe("orders-tls", lambda m: got.append(bytes(m.body)))
        with consumer.start():
            wait_for(lambda: len(got) >= 20, what=lambda: "20 messages over TLS, got %d" % len(got))
        assert sorted(got) == sorted(b"m%d" % i for i in range(20))
        path = tmp_path / "admin.yaml"
        path.write_text(yaml.safe_dump({"user": "admin", "secret": SECRETS["admin"],
                                        "tls": {"ca": pki.ca, "cert": pki.client_cert, "key": pki.client_key}}))
        path.chmod(0o600)
        os.chmod(pki.client_key, 0o600)
        assert admin.main(["--brokers", url, "--credentials", str(path), "stats"]) == admin.EXIT_OK
        out = capsys.readouterr().out
        assert "tls" in out and "on" in out
        # no client certificate: the broker refuses the handshake, the client says so clearly
        with pytest.raises(errors.MetaqError):
            with BrokerConnection(url, security=alice(pki, ca=pki.ca), connect_timeout=3) as conn:
                conn.call(ev.Version(0), timeout=3)
    finally:
        broker.stop()
