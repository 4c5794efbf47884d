"""text/connection.py ``_deferred_flushed``: a lone put's replies, written by the greenlet that ended their flush
round (``Flusher.on_flushed``), never block it: a client that does not read gets the rest from a greenlet of its
own, and a reply being sent meanwhile keeps its turn. No broker: a connection's state over a real socket pair."""

import socket
import threading
from types import SimpleNamespace

import gevent
import gevent.event
import gevent.lock
import gevent.socket

from metaq.server.text.connection import Connection


def connection_over(sock):
    """The state ``_deferred_flushed`` uses, on ``sock`` (a gevent socket), one put's replies outstanding."""
    c = object.__new__(Connection)
    c.sock, c.closed, c.peer, c.tls, c.zero_copy = sock, False, "test", False, None
    c._write_lock = gevent.lock.Semaphore()
    c._pending, c._deferred = 1, gevent.event.Event()
    c._idle, c._room = gevent.event.Event(), gevent.event.Event()
    c.front = SimpleNamespace(dispatcher=SimpleNamespace(ack_refusal=lambda: None))
    return c


def full_pair():
    """``(sender, receiver)``: a socket pair whose sender's buffers are full (the receiver never read)."""
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        while True:
            a.send(b"f" * 65536)
    except BlockingIOError:
        pass
    return gevent.socket.socket(fileno=a.detach()), b


def test_a_client_that_does_not_read_never_blocks_the_round_that_answers_it():
    sender, receiver = full_pair()
    c = connection_over(sender)
    deferred = c._deferred
    acks = [b"result 200 %d 0 %d %d\r\n" % (k, k, k) for k in range(2000)]
    with gevent.Timeout(1):  # the round's greenlet returns at once, the socket taking nothing
        c._deferred_flushed(acks, [], None)
    assert not deferred.is_set() and c._pending == 1  # still outstanding: a later burst waits behind it
    tail, got = b"".join(acks), bytearray()

    def read():  # the client reads at last: the filler, then every ack, in order
        while not got.endswith(tail):
            got.extend(receiver.recv(1 << 20))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with gevent.Timeout(10):
        deferred.wait()  # the rest went from its own greenlet
    reader.join(10)
    assert bytes(got).lstrip(b"f") == tail and c._pending == 0 and c._idle.is_set()


def test_while_another_reply_is_being_sent_the_acks_wait_their_turn_in_a_greenlet():
    a, b = socket.socketpair()
    c = connection_over(gevent.socket.socket(fileno=a.detach()))
    deferred = c._deferred
    c._write_lock.acquire()  # a long poll's reply is being written
    with gevent.Timeout(1):
        c._deferred_flushed([b"result 200 1 0 0 1\r\n"], [], None)
    gevent.sleep(0.01)
    assert not deferred.is_set()  # not written across the other reply
    c._write_lock.release()
    with gevent.Timeout(10):
        deferred.wait()
    assert b.recv(100) == b"result 200 1 0 0 1\r\n"
