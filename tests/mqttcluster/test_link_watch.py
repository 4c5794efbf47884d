"""A peer link that hears no frame for its timeout ends (``PeerLink._watch``: one watch a link, the reads wait
without a timer of their own); one that keeps hearing frames stays up."""

import time

import gevent
import pytest
from gevent import socket

from metaq.mqttcluster.following.link import PeerLink

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
    watch = gevent.spawn(link._watch, a, TIMEOUT_S)
    started = time.monotonic()
    assert isinstance(reader.get(timeout=5), OSError)
    took = time.monotonic() - started
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + 1.0, took
    assert link._silent
    watch.join(1)
    assert watch.dead


def test_a_link_hearing_frames_stays_up(pair):
    a, b = pair
    link = PeerLink(None, 7, "127.0.0.1:1")
    link._heard = time.monotonic()
    reader = gevent.spawn(_reader, a)
    watch = gevent.spawn(link._watch, a, TIMEOUT_S)
    try:
        for _ in range(10):  # a frame every third of the timeout: three timeouts long in all
            gevent.sleep(TIMEOUT_S / 3)
            b.sendall(b"x")
            link._heard = time.monotonic()
        assert not reader.dead and not link._silent
    finally:
        watch.kill()
        reader.kill()
