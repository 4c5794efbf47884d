"""The PROXY protocol header parser (metaq.protocol.proxyheader) and the trusted-proxy decision, without a network."""

import struct

import pytest

from metaq import limits
from metaq.protocol.proxyheader import V2_SIGNATURE, ProxyHeaderError, parse
from metaq.serving.proxies import TrustedProxies


def v2(command=1, family=0x11, block=None, tlvs=b""):
    if block is None:
        block = bytes([192, 0, 2, 1, 10, 0, 0, 1]) + struct.pack(">HH", 4711, 1883) if family == 0x11 else b""
    body = block + tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack(">H", len(body)) + body


def test_v1_names_the_client_and_leaves_the_rest():
    data = b"PROXY TCP4 192.0.2.1 10.0.0.1 4711 1883\r\nversion 1\r\n"
    assert parse(data) == (len(data) - len(b"version 1\r\n"), ("192.0.2.1", 4711))
    assert parse(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n")[1] == ("2001:db8::1", 1)


def test_unknown_and_local_keep_the_peers_address():
    assert parse(b"PROXY UNKNOWN\r\n") == (15, None)
    assert parse(b"PROXY UNKNOWN 1.2.3.4 x\r\nmore") == (25, None)
    header = v2(command=0, family=0x00)
    assert parse(header + b"\x10") == (len(header), None)


def test_v2_names_the_client_with_tlvs():
    header = v2(tlvs=b"\x01\x00\x02h2" + b"\x04\x00\x00")
    assert parse(header + b"\x16\x03") == (len(header), ("192.0.2.1", 4711))
    block6 = bytes(range(16)) + bytes(16) + struct.pack(">HH", 5, 6)
    assert parse(v2(family=0x21, block=block6))[1] == ("1:203:405:607:809:a0b:c0d:e0f", 5)


@pytest.mark.parametrize("whole", [b"PROXY TCP4 192.0.2.1 10.0.0.1 4711 1883\r\n", v2(tlvs=b"\x01\x00\x01x")])
def test_every_prefix_is_incomplete(whole):
    for n in range(len(whole)):
        assert parse(whole[:n]) is None


@pytest.mark.parametrize("data,why", [
    (b"CONNECT x\r\n", "no PROXY header"),
    (b"PROXY TCP4 192.0.2.1 10.0.0.1 4711\r\n", "TCP4, TCP6 or UNKNOWN"),
    (b"PROXY TCP4  192.0.2.1 10.0.0.1 4711 1883\r\n", "TCP4, TCP6 or UNKNOWN"),
    (b"PROXY TCP4 2001:db8::1 10.0.0.1 4711 1883\r\n", "not of its line's family"),
    (b"PROXY TCP4 192.0.2.300 10.0.0.1 4711 1883\r\n", "not an IP address"),
    (b"PROXY TCP4 192.0.2.1 10.0.0.1 65536 1883\r\n", "decimal number"),
    (b"PROXY TCP4 192.0.2.1 10.0.0.1 0471 1883\r\n", "decimal number"),
    (b"PROXY TCP4 192.0.2.1 10.0.0.1 4711 1883\n", "CRLF"),
    (b"PROXY " + b"x" * (limits.PROXY_V1_MAX_BYTES - 6), "longer than 107"),
    (V2_SIGNATURE + b"\x31\x11\x00\x0c", "version 3"),
    (V2_SIGNATURE + b"\x22\x11\x00\x0c", "command 2"),
    (V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4), "too short for its addresses"),
    (V2_SIGNATURE + b"\x21\x41\x00\x00", "unknown family"),
    (v2(tlvs=b"\x01\x00\x05ab"), "TLV longer"),
    (v2(tlvs=b"\x01\x00"), "TLV cut short"),
])
def test_malformed_headers_are_refused(data, why):
    with pytest.raises(ProxyHeaderError, match=why):
        parse(data)


def test_the_v2_length_bound_at_and_one_past():
    at = v2(tlvs=b"\x04" + struct.pack(">H", limits.PROXY_V2_MAX_BYTES - 16 - 12 - 3) +
            bytes(limits.PROXY_V2_MAX_BYTES - 16 - 12 - 3))
    assert len(at) == limits.PROXY_V2_MAX_BYTES and parse(at)[0] == len(at)
    past = v2(tlvs=b"\x04" + struct.pack(">H", limits.PROXY_V2_MAX_BYTES - 16 - 12 - 2) +
              bytes(limits.PROXY_V2_MAX_BYTES - 16 - 12 - 2))
    with pytest.raises(ProxyHeaderError, match="the limit is %d" % limits.PROXY_V2_MAX_BYTES):
        parse(past[:16])  # refused from its fixed part: nothing more is read


def test_the_v1_line_at_its_bound_and_one_past():
    line = b"PROXY UNKNOWN " + b"x" * (limits.PROXY_V1_MAX_BYTES - 16) + b"\r\n"
    assert len(line) == limits.PROXY_V1_MAX_BYTES and parse(line) == (len(line), None)
    with pytest.raises(ProxyHeaderError, match="longer than"):
        parse(line[:-2] + b"x\r\n")


def test_only_a_trusted_peer_names_the_client():
    proxies = TrustedProxies(["10.0.0.0/8", "fd00::/8"], ["mqtt"])
    client = ("192.0.2.1", 4711)
    assert proxies.real_address(("10.1.2.3", 5), client) == client
    assert proxies.real_address(("::ffff:10.1.2.3", 5, 0, 0), client) == client
    assert proxies.real_address(("fd00::1", 5, 0, 0), client) == client
    assert proxies.real_address(("192.0.2.9", 5), client) == ("192.0.2.9", 5)
    assert proxies.real_address(("10.1.2.3", 5), None) == ("10.1.2.3", 5)
    assert proxies.requires_header("mqtt", ("10.1.2.3", 5)) and not proxies.requires_header("text", ("10.1.2.3", 5))
    assert not proxies.requires_header("mqtt", ("192.0.2.9", 5))
    assert not TrustedProxies().trusts("127.0.0.1")


def test_the_settings_are_checked():
    from metaq.errors import ConfigError
    from metaq.server.config import read_config

    ok = read_config(None, {"security.trusted_proxies": ["10.0.0.0/8", "192.0.2.7", "fd00::/8"],
                            "security.proxy_protocol": ["mqtt", "text"]})
    assert ok.security.proxy_protocol == ["mqtt", "text"]
    at = ["10.0.%d.0/24" % i for i in range(limits.MAX_TRUSTED_PROXIES)]
    assert len(read_config(None, {"security.trusted_proxies": at}).security.trusted_proxies) == len(at)
    for overrides, why in [({"security.trusted_proxies": ["10.0.0.0/33"]}, "is not a network"),
                           ({"security.proxy_protocol": ["mqtt"]}, "proxy_protocol needs trusted_proxies"),
                           ({"security.trusted_proxies": at + ["10.1.0.0/16"]}, "at most 256"),
                           ({"security.trusted_proxies": ["10.0.0.0/8"], "security.proxy_protocol": ["replication"]},
                            "proxy_protocol")]:
        with pytest.raises(ConfigError, match=why):
            read_config(None, overrides)
