"""Issue 71 point 2: behind a trusted reverse proxy the PROXY header (v1, v2) names the client for the per-address
limits, the logs and ``stats``, on the text and the MQTT port; an untrusted peer's header is never read; a bad,
oversized or trickled header closes the connection, counted (``proxy_refused``) and logged."""

import socket
import ssl
import struct
import time

from metaq.auth import limits as auth_limits
from metaq.client.local import small_config
from metaq.protocol.proxyheader import V2_SIGNATURE
from tests.harness.broker import wait_for
from tests.harness.mqtt import mqtt_port, with_mqtt
from tests.harness.pki import Pki

PROXY = "127.0.0.3"  # the trusted proxy's address (the harness's own client, from 127.0.0.1, is served directly)
CONNECT = bytes([0x10, 13, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 30, 0, 1]) + b"d"  # MQTT 3.1.1, client id "d"


def v1(host, port=4711):
    return b"PROXY TCP4 %s 127.0.0.1 %d 1883\r\n" % (host.encode(), port)


def v2(host, command=1):
    block = socket.inet_aton(host) + socket.inet_aton("127.0.0.1") + struct.pack(">HH", 4711, 1883)
    body = block + b"\x04\x00\x03abc"  # a TLV the broker skips
    return V2_SIGNATURE + bytes([0x20 | command, 0x11]) + struct.pack(">H", len(body)) + body


def proxied(port, header, source=PROXY):
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    s.sendall(header)
    return s


def ask(s, line):
    """One text-port line and the first reply bytes (b"" once the broker closed)."""
    s.sendall(line)
    try:
        return s.recv(4096)
    except ConnectionResetError:
        return b""


def closed(s, timeout=5):
    s.settimeout(timeout)
    try:
        return s.recv(4096) == b""
    except ConnectionResetError:
        return True


def start(broker_factory, tmp_path, **limits):
    config = with_mqtt(small_config(tmp_path / "data", limits={"max_connections_per_address": 2, **limits},
                                    security={"trusted_proxies": [PROXY + "/32"],
                                              "proxy_protocol": ["text", "mqtt"]}))
    return broker_factory(config)


def summary(broker):
    with broker.client() as c:
        return c.stats_dict()


def test_each_claimed_client_gets_its_own_share_on_both_ports(broker_factory, tmp_path):
    broker = start(broker_factory, tmp_path)
    held = [proxied(broker.port, v1("192.0.2.1")), proxied(broker.port, v2("192.0.2.1"))]
    for s in held:
        assert ask(s, b"version 1\r\n").startswith(b"result 200")
    third = proxied(broker.port, v1("192.0.2.1"))
    assert b"too many connections from 192.0.2.1: the limit is 2 per address" in third.recv(4096)
    # Another client behind the same proxy has a share of its own, on the MQTT port too.
    other = proxied(mqtt_port(broker), v2("192.0.2.2") + CONNECT)
    assert other.recv(4) == b"\x20\x02\x00\x00"
    mqtt_third = proxied(mqtt_port(broker), v1("192.0.2.1") + CONNECT)
    assert closed(mqtt_third)
    wait_for(lambda: "too many connections from 192.0.2.1" in broker.log_text(), what="the refusal logged")
    for s in held + [third, other, mqtt_third]:
        s.close()


def test_untrusted_peers_header_is_not_read(broker_factory, tmp_path):
    broker = start(broker_factory, tmp_path)
    s = proxied(broker.port, v1("192.0.2.1"), source="127.0.0.2")
    assert ask(s, b"version 1\r\n").startswith(b"result 400")  # "PROXY ..." is no command of the text port
    s.close()
    held = [proxied(broker.port, b"", source="127.0.0.2") for _ in range(2)]
    for h in held:
        assert ask(h, b"version 1\r\n").startswith(b"result 200")  # served as 127.0.0.2, which holds its share
    third = proxied(broker.port, v1("192.0.2.7"), source="127.0.0.2")
    assert b"too many connections from 127.0.0.2" in third.recv(4096)
    for h in held + [third]:
        h.close()


def test_bad_oversized_and_trickled_headers_are_closed_and_counted(broker_factory, tmp_path):
    broker = start(broker_factory, tmp_path, request_timeout_s=1.5)
    bad = [b"PROXY TCP4 192.0.2.1 127.0.0.1 4711\r\nversion 1\r\n",  # a field missing
           b"PROXY UNKNOWN " + b"x" * 200 + b"\r\n",  # past 107 bytes
           V2_SIGNATURE + b"\x21\x11\xff\xff",  # 64 KiB announced
           b"version 1\r\n"]  # no header at all from a trusted proxy
    for header in bad:
        assert closed(proxied(broker.port, header))
    started = time.monotonic()
    trickled = proxied(broker.port, b"PROXY TCP4 ")
    for b in b"192.0.2.1 127.0":
        try:
            trickled.send(bytes([b]))
        except OSError:
            break
        time.sleep(0.2)
    assert closed(trickled) and time.monotonic() - started < 4.5
    wait_for(lambda: summary(broker)["proxy_refused"] == "5", what="five refusals counted")
    assert "closed, for its PROXY header, a connection from 127.0.0.3 on the text port" in broker.log_text()
    # The proxy's own health check (v2 LOCAL) is served under the proxy's address; the port still works.
    check = proxied(broker.port, v2("0.0.0.0", command=0))
    assert ask(check, b"version 1\r\n").startswith(b"result 200")
    check.close()


def connect(user, secret):
    """An MQTT 3.1.1 CONNECT with a user name and password."""
    payload = b"".join(struct.pack(">H", len(f)) + f for f in (b"d", user, secret))
    body = b"\x00\x04MQTT\x04\xc2\x00\x1e" + payload
    return bytes([0x10, len(body)]) + body


def test_the_allow_lists_see_the_client_behind_the_proxy(broker_factory, tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text('allow: [127.0.0.0/8, 192.0.2.0/24]\n'
                   'users:\n  dev: {secret: "dev-secret-0123456789", admin: true, allow: [192.0.2.1]}\n')
    acl.chmod(0o600)
    config = with_mqtt(small_config(tmp_path / "data", security={"acl_file": str(acl), "trusted_proxies": [PROXY],
                                                                  "proxy_protocol": ["mqtt"]}))
    broker = broker_factory(config)
    login = connect(b"dev", b"dev-secret-0123456789")
    allowed = proxied(mqtt_port(broker), v2("192.0.2.1") + login)
    assert allowed.recv(4) == b"\x20\x02\x00\x00"
    elsewhere = proxied(mqtt_port(broker), v1("192.0.2.2") + login)  # the user may not connect from there
    assert elsewhere.recv(4)[:3] == b"\x20\x02\x00" and closed(elsewhere)
    outside = proxied(mqtt_port(broker), v1("198.51.100.1") + login)  # not in the broker's allow-list
    assert closed(outside)
    wait_for(lambda: "address 198.51.100.1 is not in the allow-list" in broker.log_text(), what="the refusal logged")
    assert "user dev may not connect from 192.0.2.2" in broker.log_text()
    for s in (allowed, elsewhere, outside):
        s.close()


def test_the_header_comes_before_the_tls_hello(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    config = small_config(tmp_path / "data", limits={"max_connections_per_address": 1},
                          security={"tls": pki.tls_config("on", False), "trusted_proxies": [PROXY],
                                    "proxy_protocol": ["text"]})
    broker = broker_factory(config)
    ctx = ssl.create_default_context(cafile=pki.ca)
    first = ctx.wrap_socket(proxied(broker.port, v2("192.0.2.1")), server_hostname="127.0.0.1")
    assert ask(first, b"version 1\r\n").startswith(b"result 200")
    second = proxied(broker.port, v1("192.0.2.1"))  # its client's share is taken: closed before its handshake
    assert closed(second)
    wait_for(lambda: "too many connections from 192.0.2.1" in broker.log_text(), what="the refusal logged")
    other = ctx.wrap_socket(proxied(broker.port, v1("192.0.2.2")), server_hostname="127.0.0.1")
    assert ask(other, b"version 1\r\n").startswith(b"result 200")
    for s in (first, second, other):
        s.close()


def test_failed_logins_slow_the_client_behind_the_proxy_not_its_neighbours(broker_factory, tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text('users:\n  dev: {secret: "dev-secret-0123456789", admin: true}\n')
    acl.chmod(0o600)
    config = with_mqtt(small_config(tmp_path / "data", security={"acl_file": str(acl), "trusted_proxies": [PROXY],
                                                                  "proxy_protocol": ["mqtt"]}))
    broker = broker_factory(config)
    wrong = connect(b"dev", b"not-the-secret-at-all")

    def refused_after(client):
        started = time.monotonic()
        s = proxied(mqtt_port(broker), v1(client) + wrong)
        assert s.recv(4)[:3] == b"\x20\x02\x00"
        s.close()
        return time.monotonic() - started

    assert all(refused_after("192.0.2.1") < 0.5 for _ in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY))
    assert refused_after("192.0.2.1") >= auth_limits.AUTH_FAILURE_DELAY_S * 0.9  # this client is slowed
    assert refused_after("198.51.100.7") < 0.5  # another client behind the same proxy is not
