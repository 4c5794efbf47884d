"""MQTT over WebSocket behind a reverse proxy (docs/mqtt.md "Over WebSocket"): a trusted proxy's ``X-Forwarded-For``
names the client (its rightmost hop that is no trusted proxy) for the per-address shares, the allow-list and the
logs; an untrusted peer's header is not read; a trusted proxy's header that is no list of addresses, or longer than
``FORWARDED_MAX_HOPS``, is refused 400 with the reason."""

from metaq.serving import limits as serving_limits
from metaq.client.local import free_port
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import mqtt_config
from tests.harness.websocket import BINARY, RawWs, frame

PROXY = "127.0.0.3"  # the trusted proxy (the harness's own clients come from 127.0.0.1)
SECRET = b"dev-secret-0123456789"


def start(broker_factory, tmp_path, **security):
    cfg = mqtt_config(tmp_path, ws_port=free_port())
    cfg.setdefault("limits", {})["max_connections_per_address"] = 2
    cfg.setdefault("security", {}).update(trusted_proxies=[PROXY + "/32"], **security)
    return broker_factory(cfg)


def upgrade(broker, forwarded, source=PROXY):
    """``(status, body, the RawWs)`` of an upgrade from ``source`` with ``forwarded`` as its X-Forwarded-For."""
    ws = RawWs(broker.config["mqtt"]["ws_port"], source=source)
    try:
        status, _, body = ws.upgrade(extra=["X-Forwarded-For: %s" % forwarded] if forwarded is not None else [])
    except ConnectionResetError:  # closed at the accept
        return None, b"", ws
    return status, body, ws


def connected(ws, client_id, user=None):
    """True when an MQTT CONNECT over ``ws`` (as ``user``, the acl file's when given) is accepted."""
    login = {} if user is None else {"username": user, "password": SECRET}
    ws.send(frame(BINARY, wire.encode(wire.Connect(wire.MQTT_311, client_id, **login), wire.MQTT_311)))
    got = b""
    while len(got) < 6:
        chunk = ws.sock.recv(64)
        if not chunk:
            return False
        got += chunk
    return got[:2] == b"\x82\x04" and got[2:6] == b"\x20\x02\x00\x00"


def test_a_trusted_proxys_header_names_the_client_for_its_share_the_allow_list_and_the_logs(broker_factory,
                                                                                            tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text("allow: [127.0.0.0/8, 192.0.2.0/24, 198.51.100.9]\n"
                   "users:\n  dev: {secret: %s, admin: true, allow: [192.0.2.1]}\n" % SECRET.decode())
    acl.chmod(0o600)
    b = start(broker_factory, tmp_path, acl_file=str(acl))
    held = []
    for i in range(2):  # the rightmost hop that is no trusted proxy: 192.0.2.1, not the leftmost
        status, body, ws = upgrade(b, "198.51.100.9, 192.0.2.1, %s" % PROXY)
        assert status == 101, body
        assert connected(ws, "held-%d" % i, "dev")
        held.append(ws)
    status, body, _ = upgrade(b, "192.0.2.1")  # that client's share is full, the proxy's is not
    assert status == 403 and b"too many connections from 192.0.2.1: the limit is 2 per address" in body, body
    status, body, other = upgrade(b, "192.0.2.2")  # another client behind the proxy: a share of its own
    assert status == 101 and not connected(other, "other", "dev")  # the user may not connect from 192.0.2.2
    wait_for(lambda: "user dev may not connect from 192.0.2.2" in b.log_text(), what="the refusal logged")
    status, body, _ = upgrade(b, "203.0.113.5")
    assert status == 403 and b"203.0.113.5 is not in the allow-list" in body, body
    assert "mqtt 192.0.2.2:0: " in b.log_text()  # the connection's log lines name its client


def test_an_untrusted_peers_header_is_not_read(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    held = [upgrade(b, "192.0.2.%d" % i, source="127.0.0.2") for i in range(2)]
    assert [status for status, _, _ in held] == [101, 101]
    assert all(connected(ws, "u%d" % i) for i, (_, _, ws) in enumerate(held))
    status, _, _ = upgrade(b, "192.0.2.9", source="127.0.0.2")  # counted under 127.0.0.2 all along: closed at once
    assert status is None
    wait_for(lambda: "too many connections from 127.0.0.2" in b.log_text(), what="the peer's share refused")


def test_a_trusted_proxys_malformed_or_long_header_is_refused_400(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    most = serving_limits.FORWARDED_MAX_HOPS
    for bad, why in [("not-an-ip", b"the hop 'not-an-ip' is no IP address"),
                     ("192.0.2.1,,192.0.2.2", b"the hop '' is no IP address"),
                     (", ".join(["192.0.2.1"] * (most + 1)), b"%d hops, more than %d (FORWARDED_MAX_HOPS)"
                      % (most + 1, most))]:
        status, body, _ = upgrade(b, bad)
        assert status == 400 and b"X-Forwarded-For from a trusted proxy: " + why in body, body
    status, _, ws = upgrade(b, ", ".join(["192.0.2.%d" % i for i in range(1, most)] + ["[2001:db8::7]:443"]))
    assert status == 101 and connected(ws, "at-the-limit")  # FORWARDED_MAX_HOPS hops, a bracketed IPv6 last
    assert "X-Forwarded-For from a trusted proxy: the hop 'not-an-ip' is no IP address" in b.log_text()
    status, _, ws = upgrade(b, None)  # no header: the proxy's own connection (its health check)
    assert status == 101 and connected(ws, "the-proxy")
