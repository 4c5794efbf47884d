"""A peer link that hears nothing for its timeout ends (``PeerLink._watch``: one watch a link, the reads wait
without a timer of their own); one that keeps hearing frames, or the bytes of a frame slow to come, stays up."""

import time
from types import SimpleNamespace

import gevent
import pytest
from gevent import socket

from metaq.mqttcluster.following.link import PeerLink
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.protocol.replication import ReplicationParser

TIMEOUT_S = 0.3


def _reader(sock):
    """Read ``sock`` until it fails; the exception it failed with."""
    try:
        while sock.recv(16):
            pass
    except OSError as exc:
        return exc
    return None


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_silent_link_ends_past_its_timeout(pair):
    a, _b = pair
    link = PeerLink(None, 7, "127.0.0.1:1")
    link._heard = time.monotonic()
    reader = gevent.spawn(_reader, a)
    watch = gevent.spawn(link._watch, a, ReplicationParser(), TIMEOUT_S)
    started = time.monotonic()
    assert isinstance(reader.get(timeout=5), OSError)
    took = time.monotonic() - started
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S * 1.25 + 1.0, took
    assert link._silent
    watch.join(1)
    assert watch.dead


def test_a_link_hearing_frames_stays_up(pair):
    a, b = pair
    link = PeerLink(None, 7, "127.0.0.1:1")
    link._heard = time.monotonic()
    reader = gevent.spawn(_reader, a)
    watch = gevent.spawn(link._watch, a, ReplicationParser(), TIMEOUT_S)
    try:
        for _ in range(10):  # a frame every third of the timeout: three timeouts long in all
            gevent.sleep(TIMEOUT_S / 3)
            b.sendall(b"x")
            link._heard = time.monotonic()
        assert not reader.dead and not link._silent
    finally:
        watch.kill()
        reader.kill()


def test_a_link_receiving_a_frame_slowly_stays_up(pair):
    a, _b = pair
    link = PeerLink(None, 7, "127.0.0.1:1")
    link._heard = time.monotonic()  # no frame whole after this: only its bytes coming
    parser = ReplicationParser()
    reader = gevent.spawn(_reader, a)
    watch = gevent.spawn(link._watch, a, parser, TIMEOUT_S)
    try:
        for _ in range(10):  # a frame's bytes a third of the timeout apart: three timeouts long in all
            gevent.sleep(TIMEOUT_S / 3)
            parser.receive_data(b"M")
        assert not reader.dead and not link._silent
        watch.join(TIMEOUT_S * 2)  # then nothing more: it ends
        assert link._silent and isinstance(reader.get(timeout=1), OSError)
    finally:
        watch.kill()
        reader.kill()


def test_the_links_lost_count_keeps_those_of_peers_no_longer_followed():
    """``mqtt_cluster_links_lost`` only grows: a peer that left the members takes its link's ends with it into the
    count, and a link stopped here (the peer left) is not counted as lost."""
    port = SimpleNamespace(subscribed_filters=lambda: iter(()),
                           topics=SimpleNamespace(topics_for=lambda f: ((), False)))
    cluster = MqttCluster(0, None, None, port, None, lambda: True)
    stopped = []
    cluster.links[1] = SimpleNamespace(address="127.0.0.1:1", lost=2, connected=False, state=lambda: "down",
                                       stop=lambda: stopped.append(1))
    cluster.links[2] = SimpleNamespace(address="127.0.0.1:2", lost=1, connected=True, state=lambda: "up")
    assert dict(cluster.summary_values())["mqtt_cluster_links_lost"] == 3
    cluster._set_links({2: "127.0.0.1:2"})  # broker 1 left
    assert stopped == [1] and dict(cluster.summary_values())["mqtt_cluster_links_lost"] == 3
    link = PeerLink(cluster, 3, "127.0.0.1:1")
    link.connected = True
    link._session = lambda: (link.stop(), (_ for _ in ()).throw(OSError("closed here")))
    link._run()
    assert link.lost == 0
