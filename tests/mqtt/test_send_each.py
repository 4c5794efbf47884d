"""``send_each`` (mqtt/fanout.py and the C helper): the fan-out reader's one call that writes a run of PUBLISHes to
many sockets, none waited for. A socket that takes everything is not reported; one that takes part, or nothing (full),
or fails is reported with what it took or its error, and the others are written all the same. The built function
and its pure-Python twin give the same results on the same sockets."""

import errno
import os
import socket

import pytest

from metaq.mqtt.fanout import _SEND_IOV_MAX, send_each_py
from tests.harness.sockets import drain

try:
    from metaq.native._bytes import send_each as send_each_c
except ImportError:
    send_each_c = None

SENDERS = [pytest.param(send_each_py, id="python")] + (
    [pytest.param(send_each_c, id="built")] if send_each_c is not None else [])

PACKETS = (b"\x30\x0c\x00\x03a/bfirst", b"\x30\x0d\x00\x03a/bsecond", b"\x30\x0c\x00\x03a/bthird")
WHOLE = b"".join(PACKETS)
NOT_OPEN = 1_000_000  # past any descriptor limit: never an open file


def pair(sndbuf=None):
    """A connected pair, the sending end non-blocking (as the broker's gevent sockets are)."""
    a, b = socket.socketpair()
    if sndbuf:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    a.setblocking(False)
    return a, b


def fill(sock):
    """Write to ``sock`` until its buffer is full."""
    try:
        while True:
            sock.send(b"f" * 65536)
    except BlockingIOError:
        pass


@pytest.mark.parametrize("send_each", SENDERS)
def test_every_socket_that_takes_everything_gets_the_packets_whole_in_order_and_is_not_reported(send_each):
    pairs = [pair() for _ in range(5)]
    assert send_each(PACKETS, [a.fileno() for a, _ in pairs]) == []
    assert send_each([PACKETS[0]], [a.fileno() for a, _ in pairs]) == []
    for a, b in pairs:
        assert drain(b) == WHOLE + PACKETS[0]
        a.close()
        b.close()
    assert send_each(PACKETS, []) == []


@pytest.mark.parametrize("send_each", SENDERS)
def test_a_full_a_partial_and_a_closed_socket_are_reported_and_do_not_stop_the_others(send_each):
    good1, full, partial, closed, good2 = (pair(4096) for _ in range(5))
    fill(full[0])
    big = [b"p" * 60000, b"q" * 60000, b"r" * 60000]  # past what a 4 KiB send buffer takes at once
    closed[1].close()
    fds = [good1[0].fileno(), full[0].fileno(), closed[0].fileno(), good2[0].fileno()]
    assert send_each(PACKETS, fds) == [(1, 0), (2, -errno.EPIPE)]
    assert drain(good1[1]) == WHOLE and drain(good2[1]) == WHOLE
    short = send_each(big, [partial[0].fileno(), good1[0].fileno()])
    assert len(short) == 2 and [i for i, _ in short] == [0, 1]
    for (_i, took), (_a, b) in zip(short, (partial, good1), strict=True):
        assert 0 < took < sum(map(len, big))
        assert drain(b) == b"".join(big)[:took]  # what it took is the run's beginning
    for a, b in (good1, full, partial, good2):
        a.close()
        b.close()
    closed[0].close()


@pytest.mark.skipif(send_each_c is None, reason="metaq.native._bytes was not built")
def test_the_built_send_each_equals_the_python_twin():
    outcomes = []
    for send_each in (send_each_py, send_each_c):
        socks = [pair(4096) for _ in range(4)]
        fill(socks[1][0])
        socks[2][1].close()
        runs = [send_each(PACKETS, [a.fileno() for a, _ in socks]),
                send_each([b"x" * 50000, b"y" * 50000], [socks[0][0].fileno(), socks[3][0].fileno()]),
                send_each([b"z"], [socks[0][0].fileno()])]
        r, w = os.pipe()  # a descriptor that is no socket, one that is not open
        runs.append(send_each(PACKETS, [w, NOT_OPEN, socks[3][0].fileno()]))
        os.close(r)
        os.close(w)
        received = [drain(socks[i][1]) for i in (0, 1, 3)]
        outcomes.append((runs, received))
        for a, b in socks:
            a.close()
            b.close()
    assert outcomes[0] == outcomes[1]
    runs = outcomes[0][0]
    assert runs[0] == [(1, 0), (2, -errno.EPIPE)]
    assert [i for i, _ in runs[1]] == [0, 1] and all(0 < took < 100000 for _, took in runs[1])
    assert runs[3] == [(0, -errno.ENOTSOCK), (1, -errno.EBADF), (2, 0)]


@pytest.mark.parametrize("send_each", SENDERS)
def test_a_run_of_as_many_packets_as_one_sendmsg_takes_and_one_past(send_each):
    a, b = pair()
    assert send_each([b"%d," % i for i in range(_SEND_IOV_MAX)], [a.fileno()]) == []
    assert drain(b) == b"".join(b"%d," % i for i in range(_SEND_IOV_MAX))
    with pytest.raises(ValueError):
        send_each([b"a"] * (_SEND_IOV_MAX + 1), [a.fileno()])
    assert drain(b) == b""
    a.close()
    b.close()
