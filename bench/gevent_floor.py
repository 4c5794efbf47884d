"""The floor under a durable put in a gevent server: what one costs with nothing but the work itself.

    python -m bench.gevent_floor PORT DIR [inline]   (a server; ``FloorServer`` starts and stops one by its PID)

A greenlet per connection (gevent's ``StreamServer``), as the broker has: it reads what arrived, splits the
``put`` frames by their length field, copies their bodies into a preallocated 1 GiB map (wrapping at its end),
makes them durable with one ``fdatasync`` in gevent's thread pool shared by every put written meanwhile (the
first waiter leads the round, the others wait for it: the broker's group commit), then sends one ``result 200``
per put. No checksum, index, message id, statistics, limits or error handling: it trusts its client, and it is
not a broker. ``bench/bench_durable.py --floor`` measures it beside metaq and Redis in the same runs, so the
table says how much of metaq's cost per put is the runtime (greenlets, gevent's sockets, the thread hop) that
any broker written this way pays, and how much is metaq's own.

``inline`` makes the floor call ``fdatasync`` on the event loop itself, after ``gevent.idle()`` lets every
greenlet with input run first (what Redis does with ``appendfsync always``, and what metaq must not: a disk that
stalls would stall every connection). It shows what is left of the runtime's cost without the thread hop.
"""

import mmap
import os
import socket
import subprocess
import sys
import time

MAP_BYTES = 1 << 30
#: The ack of every put (the broker's reply has this form: msgId partition offset).
ACK = b"result 200 24 0\r\n2062055335790660000 0 -1"


def serve(port, directory, inline=False):
    from gevent import monkey

    monkey.patch_all()
    import gevent
    from gevent.event import Event
    from gevent.server import StreamServer

    fd = os.open(os.path.join(directory, "floor.log"), os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, MAP_BYTES)
    log = mmap.mmap(fd, MAP_BYTES)
    pool = gevent.get_hub().threadpool
    state = {"written": 0, "durable": 0, "leading": False, "done": Event()}

    def durable(upto):
        """Wait until ``upto`` bytes are synced: lead a round when none runs, else wait for the one running."""
        while state["durable"] < upto:
            if state["leading"]:
                state["done"].wait()
                continue
            state["leading"] = True
            if inline:
                gevent.idle()  # every greenlet with a put to write writes it first: they share this fdatasync
            end = state["written"]
            if inline:
                os.fdatasync(fd)
            else:
                pool.apply(os.fdatasync, (fd,))
            state["durable"], state["leading"] = end, False
            done, state["done"] = state["done"], Event()
            done.set()

    def connection(sock, _address):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            data = sock.recv(262144)
            if not data:
                return
            buf += data
            puts, pos = 0, 0
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(buf[pos:eol].split()[3])
                if eol + 2 + size > len(buf):
                    break
                at = state["written"] % MAP_BYTES
                if at + size > MAP_BYTES:
                    at = 0
                log[at:at + size] = buf[eol + 2:eol + 2 + size]
                state["written"] += size
                puts += 1
                pos = eol + 2 + size
            buf = buf[pos:]
            if puts:
                durable(state["written"])
                sock.sendall(ACK * puts)

    StreamServer(("127.0.0.1", port), connection).serve_forever()


class FloorServer:
    """The floor server as a child process on ``port`` (stopped by its PID)."""

    def __init__(self, port, directory, inline=False):
        self.port, self.directory = port, directory
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.gevent_floor", str(port), directory]
                                     + (["inline"] if inline else []),
                                     cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the floor server did not start") from None
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            os.unlink(os.path.join(self.directory, "floor.log"))
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], inline=sys.argv[3:] == ["inline"])
