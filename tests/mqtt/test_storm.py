"""A storm of half packets: every parked MQTT connection sends the first byte of a packet at once, then nothing for a
while. Each wakes and holds a greenlet while it waits inside its packet; as a client sees it, the broker still
answers another client promptly, answers each connection once its packet is whole, closes none before its request
deadline and closes at that deadline each one that never finishes. What bounds it: the connection cap (and one
address's share of it) bounds how many can be held so, the request deadline how long."""

import selectors
import time

from metaq.mqtt import wire
from tests.harness.mqtt import Raw, mqtt_config

#: Connections in the storm: well under the connection cap a 1,024-descriptor limit gives (1024 - FD_RESERVE).
STORM = 400
#: The broker's request deadline in this test (``limits.request_timeout_s``).
REQUEST_S = 3.0
#: The most a held connection may add to the broker's heap (anonymous RSS, above parked) in this test: a few times
#: what a greenlet waiting in its socket costs; a read buffer held per connection (``RECV_BYTES``) would be far past.
HELD_KIB_MAX = 32
#: How long another client's request may take while the storm wakes its connections.
PROMPT_S = 1.0
PINGREQ, PINGRESP = b"\xc0\x00", b"\xd0\x00"


def _anon_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon for %d" % pid)


def _closed_now(sock):
    """True when the broker closed ``sock`` (read without waiting); raises if it sent bytes instead."""
    sock.setblocking(False)
    try:
        data = sock.recv(16)
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)
    assert not data, "the broker sent %r before the packet was whole" % data
    return True


def test_a_storm_of_half_packets_is_answered_when_whole_and_closed_only_at_its_deadline(broker_factory, tmp_path):
    cfg = mqtt_config(tmp_path)
    cfg.setdefault("limits", {}).update(request_timeout_s=REQUEST_S, max_connections_per_address=STORM + 16)
    b = broker_factory(cfg)
    conns = []
    for i in range(STORM):
        c = Raw(b, wire.MQTT_311)
        assert c.connect("storm-%d" % i, keep_alive=60).reason_code == 0
        conns.append(c.sock)
    probe = Raw(b, wire.MQTT_311)
    assert probe.connect("probe", keep_alive=60).reason_code == 0
    text = b.client()
    time.sleep(0.5)  # every one idle past MQTT_PARK_AFTER_S: parked
    parked_kib = _anon_kib(b.proc.pid)

    for s in conns:
        s.sendall(PINGREQ[:1])
    first_sent = time.monotonic()
    slowest = 0.0
    while time.monotonic() < first_sent + REQUEST_S / 2:  # another client, while the storm takes the loop
        t = time.monotonic()
        assert int(text.stats_dict()["mqtt_connections"]) == STORM + 1
        probe.send(wire.PingReq())
        assert probe.read() == wire.PingResp()
        slowest = max(slowest, time.monotonic() - t)
        time.sleep(0.05)
    assert slowest < PROMPT_S, slowest
    held_kib = _anon_kib(b.proc.pid) - parked_kib
    assert held_kib < HELD_KIB_MAX * STORM, held_kib / STORM
    assert not any(_closed_now(s) for s in conns)  # none closed, none answered: each still inside its packet

    finishing, silent = conns[::2], conns[1::2]
    for s in finishing:
        s.sendall(PINGREQ[1:])
    for s in finishing:
        s.settimeout(10)
        assert s.recv(2) == PINGRESP
    assert time.monotonic() < first_sent + REQUEST_S  # (so the PINGRESPs above came before the deadline)

    sel = selectors.DefaultSelector()
    for s in silent:
        sel.register(s, selectors.EVENT_READ)
    closed_at = []
    while len(closed_at) < len(silent) and time.monotonic() < first_sent + REQUEST_S + 10:
        for key, _ in sel.select(timeout=0.1):
            assert _closed_now(key.fileobj)
            closed_at.append(time.monotonic() - first_sent)
            sel.unregister(key.fileobj)
    assert len(closed_at) == len(silent)
    assert REQUEST_S - 0.1 <= min(closed_at) and max(closed_at) < REQUEST_S + 5, (min(closed_at), max(closed_at))
    assert ": a partial request for 3 s; closing" in b.log_text()  # (one line each, up to the log's flood limit)

    for s in finishing:  # the ones answered went back to idle (parked) and are served again
        s.sendall(PINGREQ)
    for s in finishing:
        assert s.recv(2) == PINGRESP
    assert int(text.stats_dict()["mqtt_connections"]) == len(finishing) + 1
    text.close()
