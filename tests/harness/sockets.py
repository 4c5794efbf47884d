"""Socket helpers the tests share."""

import socket


def drain(sock, timeout=0.0):
    """Every byte ``sock`` has to give now (``timeout`` 0: what is buffered; else what comes within it until a pause
    of that long), until the end of the stream or nothing more."""
    out = bytearray()
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            out += chunk
    except (BlockingIOError, socket.timeout):
        pass
    return bytes(out)
