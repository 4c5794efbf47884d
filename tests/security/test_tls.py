"""TLS on every port (issue 16) with real brokers, a real PKI made by ``openssl`` and the real ``openssl s_client``.

Every test here starts brokers (``broker_factory``): integration.
"""

import os
import re
import socket
import ssl
import subprocess
import time

import pytest

from metaq.client.local import free_port, rmq_config, small_config
from metaq.client.raw import RemotingClient, TextClient
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.rocketmq.headers import RequestCode as R
from metaq.protocol.stream import CLOSED
from metaq.protocol.text import serialize
from tests.harness.broker import wait_for
from tests.harness.pki import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_context(pki, cert=None, key=None, ca=None):
    ctx = ssl.create_default_context(cafile=ca or pki.ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def tls_client(broker, pki, **kw):
    return TextClient("127.0.0.1", broker.port, ssl_context=tls_context(pki, **kw))


def tls_stats(broker, pki):
    with tls_client(broker, pki, cert=pki.client_cert, key=pki.client_key) as c:
        return c.stats_dict()


def s_client(port, ca, stdin=b"", *extra):
    """``openssl s_client`` against 127.0.0.1:port: its stdout and stderr, as text."""
    r = subprocess.run(("openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-CAfile", ca) + extra,
                       input=stdin, capture_output=True, timeout=30)
    return r.stdout.decode("utf-8", "replace") + r.stderr.decode("utf-8", "replace")


def tls_broker(broker_factory, tmp_path, pki, mode="on", verify_clients=False, name="b", **sections):
    wd = tmp_path / name
    cfg = rmq_config(os.path.join(str(wd), "data"), **sections)
    cfg.setdefault("security", {})["tls"] = pki.tls_config(mode, verify_clients)
    return broker_factory(cfg, workdir=wd)


def closed_by_broker(sock, timeout=5.0):
    """True when the broker closes ``sock`` (EOF or reset) within ``timeout`` without sending anything."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def refused(call):
    """True when ``call()`` fails as a refused TLS connection does: an SSL alert, a reset, or a closed reply."""
    try:
        return call() is CLOSED
    except (ssl.SSLError, ConnectionError):
        return True


def test_openssl_verifies_the_handshake_on_text_remoting_and_replication_ports(broker_factory, tmp_path, pki):
    rport = free_port()
    b = tls_broker(broker_factory, tmp_path, pki, replication={"port": rport})
    out = s_client(b.port, pki.ca, b"version\r\nquit\r\n", "-ign_eof")
    assert "Verify return code: 0 (ok)" in out, out
    assert "metaq" in out.split("Verify return code")[-1], out  # the version reply, read through TLS
    for port in (b.config["remoting"]["port"], rport):
        out = s_client(port, pki.ca)
        assert "Verify return code: 0 (ok)" in out, out
    # a client that trusts another CA does not accept the broker
    out = s_client(b.port, pki.rogue_ca)
    assert "Verify return code: 0 (ok)" not in out and "verify error" in out, out


def test_the_text_protocol_over_tls_puts_gets_pipelines_and_stats(broker_factory, tmp_path, pki):
    b = tls_broker(broker_factory, tmp_path, pki)
    with tls_client(b, pki) as c:
        _id, part, offset = c.put_ok("t-tls", b"hello over TLS", partition=0)
        assert c.get_records("t-tls", 0, offset)[0].data == b"hello over TLS"
        s = c.stats_dict()
        assert s["tls"] == "on", s
        # reads larger than a TLS record (16 KiB) and than one joined write: records sent from the maps
        bodies = [bytes([65 + i]) * (200 * 1024) for i in range(5)]
        first = c.put_ok("t-big", bodies[0], partition=1)[2]
        for body in bodies[1:]:
            c.put_ok("t-big", body, partition=1)
        got = []
        while len(got) < len(bodies):
            recs = c.get_records("t-big", 1, first + len(got), 1 << 20)
            assert isinstance(recs, list) and recs, recs
            got.extend(r.data for r in recs)
        assert got == bodies
        # 300 puts pipelined in one write: the put-burst fast path and the flush wait over TLS
        n = 300
        data = b"".join(serialize(ev.Put("t-pipe", 2, 0, b"m%d" % i, 1000 + i, metaq_checksum(b"m%d" % i)))
                        for i in range(n))
        c.send(data)
        replies = [c.read_event() for _ in range(n)]
        assert [r.code for r in replies] == [200] * n
        assert [r.opaque for r in replies] == [1000 + i for i in range(n)]
    # the remoting port over TLS answers a route query
    with RemotingClient(b.config["remoting"]["port"], ssl_context=tls_context(pki)) as rc:
        r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "t-tls"})
        assert r.code == 0 and b"brokerDatas" in r.body, r


def test_plaintext_to_a_tls_port_gets_a_clear_refusal_and_is_closed(broker_factory, tmp_path, pki):
    b = tls_broker(broker_factory, tmp_path, pki)
    with socket.create_connection(("127.0.0.1", b.port), timeout=5) as s:
        s.sendall(b"version\r\n")
        answer = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"result 400 "), answer
        assert b"this port requires TLS (security.tls.mode on)" in answer, answer
    with socket.create_connection(("127.0.0.1", b.config["remoting"]["port"]), timeout=5) as s:
        s.sendall(b"\x00\x00\x00\x10plaintext frame!")
        assert closed_by_broker(s)
    wait_for(lambda: "this port requires TLS" in b.log_text(), 5, "the refusal logged")
    with tls_client(b, pki) as c:  # still serving
        assert c.put_ok("t1", b"x")


def test_a_tls_hello_on_a_plaintext_port_is_closed_and_others_are_served(broker_factory, tmp_path, pki):
    wd = tmp_path / "plain"
    b = broker_factory(rmq_config(os.path.join(str(wd), "data")), workdir=wd)
    for port in (b.port, b.config["remoting"]["port"]):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
    wait_for(lambda: b.log_text().count("a TLS hello on a plaintext port") >= 2, 5, "both TLS hellos logged")
    with b.client() as c:
        assert c.put_ok("t1", b"plain")
        assert c.stats_dict()["tls"] == "off"


def test_permissive_mode_takes_tls_and_plaintext_on_the_same_port(broker_factory, tmp_path, pki):
    b = tls_broker(broker_factory, tmp_path, pki, mode="permissive")
    with tls_client(b, pki) as t, b.client() as p:
        _id, _p, off = t.put_ok("t-mix", b"via TLS", partition=0)
        p.put_ok("t-mix", b"via plaintext", partition=0)
        assert [r.data for r in p.get_records("t-mix", 0, off)] == [b"via TLS", b"via plaintext"]
        assert [r.data for r in t.get_records("t-mix", 0, off)] == [b"via TLS", b"via plaintext"]
        assert p.stats_dict()["tls"] == "permissive"
    # a plaintext client may open its connection and wait before its first request, as on a plaintext port
    with b.client() as idle:
        time.sleep(1.5)
        assert idle.put_ok("t-mix", b"after a pause")
    assert "Verify return code: 0 (ok)" in s_client(b.config["remoting"]["port"], pki.ca)


def test_verify_clients_takes_our_certificate_and_refuses_none_and_a_strangers(broker_factory, tmp_path, pki):
    b = tls_broker(broker_factory, tmp_path, pki, verify_clients=True)
    with tls_client(b, pki, cert=pki.client_cert, key=pki.client_key) as c:
        assert c.put_ok("t1", b"from alice's certificate", partition=0)

    def attempt(**kw):
        c = tls_client(b, pki, **kw)  # TLS 1.3: the client's side completes before the broker checks it
        try:
            return c.put("t1", b"should not land", partition=0)
        finally:
            c.close()

    assert refused(attempt)
    wait_for(lambda: "TLS handshake failed: PEER_DID_NOT_RETURN_A_CERTIFICATE" in b.log_text(), 5,
             lambda: "the missing certificate logged:\n" + b.log_text())
    time.sleep(1.1)  # one such line per port per second (connections.REFUSAL_LOG_INTERVAL_S)
    assert refused(lambda: attempt(cert=pki.rogue_cert, key=pki.rogue_key))
    wait_for(lambda: "TLS handshake failed: CERTIFICATE_VERIFY_FAILED" in b.log_text(), 5,
             lambda: "the stranger's certificate logged:\n" + b.log_text())
    log = b.log_text()
    assert "Traceback" not in log, log
    with tls_client(b, pki, cert=pki.client_cert, key=pki.client_key) as c:
        assert [r.data for r in c.get_records("t1", 0, 0)] == [b"from alice's certificate"]


def test_a_handshake_that_never_finishes_is_closed_by_the_deadline(broker_factory, tmp_path, pki):
    # the handshake deadline is limits.TLS_HANDSHAKE_TIMEOUT_S (10 s) or limits.request_timeout_s when shorter;
    # one port each, as each port logs one such line a second
    rport = free_port()
    b = tls_broker(broker_factory, tmp_path, pki, limits={"request_timeout_s": 1.0}, replication={"port": rport})
    partial = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    silent = socket.create_connection(("127.0.0.1", rport), timeout=10)
    garbage = socket.create_connection(("127.0.0.1", b.config["remoting"]["port"]), timeout=10)
    started = time.monotonic()
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01")  # a record header announcing 512 bytes, then 3 of them
    garbage.sendall(b"\x16" + b"not a TLS record at all\r\n" * 20)
    assert closed_by_broker(garbage)
    assert closed_by_broker(partial) and closed_by_broker(silent)
    elapsed = time.monotonic() - started
    assert 0.8 <= elapsed < 30.0, elapsed  # by the 1 s request deadline, not the 600 s idle timeout
    for s in (partial, silent, garbage):
        s.close()
    lines = ("on the text port: TLS handshake not finished within 1 s",
             "on the replication port: TLS handshake not finished within 1 s",  # the master speaks first there
             "on the remoting port: TLS handshake failed: WRONG_VERSION_NUMBER")
    wait_for(lambda: all(line in b.log_text() for line in lines), 5, b.log_text)
    log = b.log_text()
    assert "Traceback" not in log, log
    with tls_client(b, pki) as c:
        assert c.put_ok("t1", b"still serving")


def test_a_slave_replicates_from_its_master_over_tls(broker_factory, tmp_path, pki):
    rport = free_port()
    master = tls_broker(broker_factory, tmp_path, pki, verify_clients=True, name="m", replication={"port": rport})
    swd = tmp_path / "s"
    scfg = small_config(os.path.join(str(swd), "data"),
                        security={"tls": dict(pki.tls_config("on", verify_clients=True))})
    slave = broker_factory(scfg, workdir=swd, extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with tls_client(master, pki, cert=pki.client_cert, key=pki.client_key) as c:
        for i in range(200):
            c.put_ok("t-rep", b"record %d " % i + b"x" * 3000)

    def caught_up():
        m, s = tls_stats(master, pki), tls_stats(slave, pki)
        return s["replication_link"] == "connected" and m["log_end_position"] == s["log_end_position"]

    wait_for(caught_up, 20, lambda: "slave caught up over TLS:\n%s" % slave.log_text())
    assert tls_stats(master, pki)["replication_slaves"] == "1"
    with tls_client(slave, pki, cert=pki.client_cert, key=pki.client_key) as c:
        recs = []
        for part in range(4):
            recs.extend(r.data for r in c.get_records("t-rep", part, 0) or [])
        assert len(recs) == 200
    # a slave without TLS is refused by this master (its replication port requires TLS)
    pwd = tmp_path / "p"
    plain = broker_factory(small_config(os.path.join(str(pwd), "data")), workdir=pwd,
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "2"])
    from metaq.serving.replication.link import HELLO_TIMEOUT_S  # the slave gives up waiting for a CHALLENGE then
    wait_for(lambda: "cannot reach master" in plain.log_text(), HELLO_TIMEOUT_S + 20,
             "the plaintext slave's failure logged")
    assert plain.client().stats_dict()["replication_link"] != "connected"
    # the master speaks first on this port, so it goes straight to the TLS handshake, which a plaintext slave
    # (waiting for the master's CHALLENGE) never starts: closed at the handshake deadline (10 s), or failed
    # when the slave gives up first (its own 10 s deadline for the handshake)
    wait_for(lambda: re.search(r"on the replication port: TLS handshake (not finished|failed)", master.log_text()),
             25, "the master's refusal logged")
    assert tls_stats(master, pki)["replication_slaves"] == "1"


def test_a_slave_refuses_a_master_its_ca_did_not_sign(broker_factory, tmp_path, pki):
    rport = free_port()
    tls_broker(broker_factory, tmp_path, pki, name="m", replication={"port": rport})
    swd = tmp_path / "s"
    tls = dict(pki.tls_config("on"), ca=pki.rogue_ca)  # trusts only somebody else's CA
    slave = broker_factory(small_config(os.path.join(str(swd), "data"), security={"tls": tls}), workdir=swd,
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in slave.log_text(), 10,
             lambda: "the slave's verify failure logged:\n" + slave.log_text())
    assert "replication link to master" not in slave.log_text().replace("cannot reach", "")


@pytest.mark.parametrize("case", ["missing cert", "not PEM", "key of another certificate", "missing ca"])
def test_a_bad_certificate_file_stops_the_start_with_a_clear_message(broker_factory, tmp_path, pki, case):
    junk = tmp_path / "junk.pem"
    junk.write_text("this is not a certificate\n")
    tls = pki.tls_config("on", verify_clients=case == "missing ca")
    expected = {
        "missing cert": (dict(cert=str(tmp_path / "nope.pem")),
                         "cannot read security.tls.cert %s" % (tmp_path / "nope.pem")),
        "not PEM": (dict(cert=str(junk)), "security.tls.cert %s holds no PEM block" % junk),
        "key of another certificate": (dict(key=pki.rogue_key), "are not a usable certificate"),
        "missing ca": (dict(ca=str(tmp_path / "no-ca.pem")), "cannot read security.tls.ca"),
    }[case]
    tls.update(expected[0])
    wd = tmp_path / "b"
    b = broker_factory(small_config(os.path.join(str(wd), "data"), security={"tls": tls}), workdir=wd, start=False)
    b.start(expect_ready=False)
    assert b.wait_exit(30) == 2  # a configuration error, like every other bad setting
    log = b.log_text()
    assert "cannot start: " in log and expected[1] in log, log
    assert "Traceback" not in log, log


def test_a_permissive_master_takes_a_tls_slave_and_a_plaintext_slave(broker_factory, tmp_path, pki):
    """The replication port's master speaks first: a plaintext slave says nothing until the CHALLENGE, so a
    permissive port takes a peer silent for ``limits.TLS_DETECT_WAIT_S`` as plaintext, and a TLS hello as TLS."""
    rport = free_port()
    master = tls_broker(broker_factory, tmp_path, pki, mode="permissive", name="m", replication={"port": rport})
    with tls_client(master, pki) as c:
        for i in range(50):
            c.put_ok("t-rep", b"record %d" % i)
    slaves = []
    for sid, tls in ((1, {"tls": dict(pki.tls_config("on"), ca=pki.ca)}), (2, {})):
        wd = tmp_path / ("s%d" % sid)
        slaves.append(broker_factory(small_config(os.path.join(str(wd), "data"), security=tls), workdir=wd,
                                     extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(sid)]))
    end = tls_stats(master, pki)["log_end_position"]
    tls_slave, plain_slave = slaves
    wait_for(lambda: tls_stats(tls_slave, pki)["log_end_position"] == end, 20, tls_slave.log_text)
    wait_for(lambda: plain_slave.client().stats_dict()["log_end_position"] == end, 20, plain_slave.log_text)
    assert tls_stats(master, pki)["replication_slaves"] == "2"
