"""The MQTT load generator the MQTT benchmarks share: raw-socket MQTT 3.1.1 in worker processes.

The same generator drives metaq and Mosquitto, so a difference between them is the broker's. It is kept cheap so
that it is not what is measured: packets are encoded once (a run's PUBLISHes are all the same size), QoS 1 PUBACKs
and QoS 0 deliveries are counted by their bytes rather than parsed, and only the latency rows parse what arrives
(the payload's first 8 bytes are the sender's ``time.monotonic_ns()``, a clock every process on the host shares).
Each role runs in a ``multiprocessing`` process of its own and answers on a pipe; ``Sink`` is a stand-in broker that
does nothing but answer, against which the generator's own ceiling is measured.

Roles (each a function run by ``spawn``): ``hold`` (connections kept open with keep-alive pings, or publishing as a
device fleet does: one message at a time, each from a connection idle since its last, or all sending half a packet
at once: ``storm``), ``subscribe``
(connections subscribed to one topic, counting or timing what arrives) and ``publish`` (connections publishing as
fast as QoS 0, or a window of unacknowledged QoS 1 PUBLISHes, allows).
"""

import multiprocessing
import os
import selectors
import socket
import struct
import time

PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"
CONNACK_LEN = 4
PUBACK_LEN = 4
SUBACK_LEN = 5


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def connect_packet(client_id, keep_alive=60, clean=True):
    body = b"\x00\x04MQTT\x04" + bytes([0x02 if clean else 0]) + struct.pack("!H", keep_alive) + _str(client_id)
    return b"\x10" + _varint(len(body)) + body


def subscribe_packet(packet_id, topic_filter, qos):
    body = struct.pack("!H", packet_id) + _str(topic_filter) + bytes([qos])
    return b"\x82" + _varint(len(body)) + body


def publish_packet(topic, payload, qos=0, packet_id=1):
    body = _str(topic) + (struct.pack("!H", packet_id) if qos else b"") + payload
    return bytes([0x30 | (qos << 1)]) + _varint(len(body)) + body


def delivered_size(topic, payload_len, qos):
    """Bytes of one PUBLISH as a subscriber receives it (fixed header, topic, packet id, payload)."""
    return len(publish_packet(topic, b"x" * payload_len, qos))


def stamped(payload_len):
    """A payload of ``payload_len`` bytes starting with now (``monotonic_ns``)."""
    return struct.pack("!Q", time.monotonic_ns()) + b"p" * (payload_len - 8)


def split_packets(buf):
    """``(packets, rest)``: the whole packets at the start of ``buf`` as ``(first byte, body)``, and what is left."""
    packets, pos, n = [], 0, len(buf)
    while pos + 2 <= n:
        mult, length, i = 1, 0, pos + 1
        while True:
            if i >= n:
                return packets, buf[pos:]
            b = buf[i]
            length += (b & 0x7F) * mult
            mult <<= 7
            i += 1
            if not b & 0x80:
                break
        if i + length > n:
            break
        packets.append((buf[pos], buf[i:i + length]))
        pos = i + length
    return packets, buf[pos:]


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(data), n))
        data += chunk
    return data


def open_connections(port, n, prefix, keep_alive=60, sources=None, batch=256, host="127.0.0.1", clean=True,
                     present=None):
    """``n`` connected sockets, each past its CONNACK (``batch`` CONNECTs in flight at once; ``clean``: their Clean
    Session flag); spread over the source addresses ``sources`` when given (a broker caps connections per address).
    ``present``: a list each CONNACK's Session Present flag is appended to. Raises on a refused CONNECT."""
    socks = []
    for start in range(0, n, batch):
        group = []
        for i in range(start, min(n, start + batch)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if sources:
                s.bind((sources[i % len(sources)], 0))
            s.connect((host, port))
            s.sendall(connect_packet("%s-%d" % (prefix, i), keep_alive, clean))
            group.append(s)
        for s in group:
            ack = recv_exact(s, CONNACK_LEN)
            if ack[0] != 0x20 or ack[3] != 0:
                raise ConnectionError("CONNACK refused: %r" % ack)
            if present is not None:
                present.append(ack[2] & 1)
        socks.extend(group)
    return socks


def _cpu():
    t = os.times()
    return t.user + t.system


# -- roles: each runs in its own process, told what to do on ``pipe`` ---------------------------------------------


def _send_each(socks, data):
    """Send ``data`` on each of ``socks``; how many took it (a socket the broker closed does not)."""
    sent = 0
    for s in socks:
        try:
            s.send(data)
            sent += 1
        except OSError:
            pass
    return sent


def _ready(sel, timeout):
    """One wait on the held sockets: ``(socket, bytes)`` of each readable one; ``b""`` for one the broker closed,
    which is no longer watched."""
    out = []
    for key, _ in sel.select(timeout=timeout):
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        if not data:
            sel.unregister(key.fileobj)
        out.append((key.fileobj, data))
    return out


def hold(pipe, port, n, prefix, keep_alive, sources, clean=True):
    """Open ``n`` connections (reply: seconds it took), then on ``("ping", seconds, every)`` send a PINGREQ on each
    every ``every`` seconds for ``seconds`` (reply: pings sent, PINGRESPs received, connections the broker closed),
    on ``("fleet", rate, count, topic, payload_len)`` publish ``count`` QoS 1 messages at ``rate`` a second, each
    from the next connection in turn (``fleet``), on ``("devices", seconds, topic, payload_len)`` have every
    connection publish QoS 1 messages one at a time, the next once the last is acknowledged (``devices``), on
    ``("storm", gap, wait)`` send a PINGREQ's first byte on every one at once and its second ``gap`` seconds later
    (``storm``: two replies), then on ``("closed", seconds)`` how many the broker closed within ``seconds``
    (reply), then on ``"close"`` close them. ``clean``: the CONNECTs' Clean Session flag; without it the first reply
    is ``(seconds, how many CONNACKs said Session Present)``."""
    started = time.perf_counter()
    present = []
    socks = open_connections(port, n, prefix, keep_alive, sources, clean=clean, present=present)
    took = time.perf_counter() - started
    pipe.send(took if clean else (took, sum(present)))
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    while True:
        cmd = pipe.recv()
        if cmd == "close":
            break
        if cmd[0] == "fleet":
            pipe.send(fleet(socks, sel, *cmd[1:]))
            continue
        if cmd[0] == "devices":
            pipe.send(devices(socks, sel, *cmd[1:]))
            continue
        if cmd[0] == "storm":
            pipe.send(storm(socks, sel, pipe, *cmd[1:]))
            continue
        if cmd[0] == "closed":
            closed, end = 0, time.monotonic() + cmd[1]
            while time.monotonic() < end:
                closed += sum(1 for _s, data in _ready(sel, 0.05) if not data)
            pipe.send(closed)
            continue
        _, seconds, every = cmd
        sent = answered = closed = 0
        end = time.monotonic() + seconds
        next_round = time.monotonic()
        while time.monotonic() < end:
            if time.monotonic() >= next_round:
                sent += _send_each(socks, PINGREQ)
                next_round += every
            for _s, data in _ready(sel, 0.05):
                closed += not data
                answered += data.count(PINGRESP)
        deadline = time.monotonic() + 5
        while answered < sent - closed and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.05):
                data = key.fileobj.recv(4096)
                answered += data.count(PINGRESP)
        pipe.send((sent, answered, closed))
    for s in socks:
        s.close()


def fleet(socks, sel, rate, count, topic, payload_len):
    """A device fleet's traffic over held connections: ``count`` QoS 1 PUBLISHes at ``rate`` a second, each from the
    next connection in turn (so each arrives alone, on a connection idle since its last); returns ``(acknowledged,
    [send to PUBACK, ns])``."""
    packet = publish_packet(topic, b"f" * payload_len, 1)
    sent_at = {}
    acked = []
    started = time.monotonic()
    i = 0
    deadline = started + count / rate + 10
    while (i < count or sent_at) and time.monotonic() < deadline:
        due = started + i / rate
        while i < count and time.monotonic() >= due:
            s = socks[i % len(socks)]
            try:
                s.send(packet)
                sent_at[s] = time.monotonic_ns()
            except OSError:
                pass
            i += 1
            due = started + i / rate
        for s, data in _ready(sel, max(0.0, min(0.01, due - time.monotonic()))):
            t0 = sent_at.pop(s, None)
            if t0 is not None and data.startswith(b"\x40\x02"):
                acked.append(time.monotonic_ns() - t0)
    return len(acked), acked


def devices(socks, sel, seconds, topic, payload_len):
    """Every held connection a device publishing QoS 1 messages one at a time for ``seconds``: its next PUBLISH only
    once the last is acknowledged, so each arrives alone in a read however busy the broker is (the fleet's
    one-message turn at the broker's saturation); returns the messages acknowledged."""
    packet = publish_packet(topic, b"d" * payload_len, 1)
    _send_each(socks, packet)
    acked = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s, data in _ready(sel, 0.05):
            if data:
                acked += len(data) // PUBACK_LEN
                try:
                    s.send(packet)
                except OSError:
                    pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _ready(sel, 0.05):
        pass  # the last round's PUBACKs, not counted: the window is over
    return acked


def storm(socks, sel, pipe, gap, wait):
    """Every held connection sends the first byte of a PINGREQ at once (then nothing: the broker holds each one
    inside a packet), the count sent going on ``pipe`` at once; ``gap`` seconds later each still open sends the
    second byte. Returns ``(first bytes sent, second bytes sent, PINGRESPs received within wait s of the second,
    connections the broker closed before the second byte, closed after it, seconds from the second byte to the
    last PINGRESP, anything the broker sent before the second byte)``."""
    first = _send_each(socks, PINGREQ[:1])
    pipe.send(first)
    live = set(socks)
    early = early_bytes = 0
    end = time.monotonic() + gap
    while time.monotonic() < end:
        for s, data in _ready(sel, max(0.0, min(0.2, end - time.monotonic()))):
            if not data:
                early += 1
                live.discard(s)
            early_bytes += len(data)
    started = time.monotonic()
    second = _send_each([s for s in socks if s in live], PINGREQ[1:])
    answered = late = 0
    last = started
    deadline = started + wait
    while answered + late < second and time.monotonic() < deadline:
        for _s, data in _ready(sel, 0.05):
            if not data:
                late += 1
                continue
            got = data.count(PINGRESP)
            if got:
                answered += got
                last = time.monotonic()
    return first, second, answered, early, late, last - started, early_bytes


def subscribe(pipe, port, n, prefix, topic, qos, sources, packet_size):
    """Open ``n`` connections subscribed to ``topic`` at ``qos`` (reply: ``"ready"``), then on ``("count", messages,
    timeout)`` wait until each connection received ``messages`` PUBLISHes of ``packet_size`` bytes (counted by bytes;
    QoS 1 ones acknowledged) or ``timeout`` (reply: ``(deliveries, seconds from the command to the last, cpu s)``);
    on ``("time", messages, timeout)`` parse each PUBLISH and reply ``(latencies ns, cpu s)``: now minus the
    payload's stamp, one per delivery; ``"close"`` ends."""
    socks, sel = _subscribed(port, n, prefix, topic, qos, sources)
    pipe.send("ready")
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while True:
        cmd = pipe.recv()
        if cmd == "close":
            break
        mode, messages, timeout = cmd
        cpu0 = _cpu()
        started = time.perf_counter()
        last = started
        want = messages * packet_size
        waiting = n
        lat = []
        for key in sel.get_map().values():
            key.data[0] = 0
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                state = key.data
                s = key.fileobj
                try:
                    got = s.recv_into(buf)
                except BlockingIOError:
                    continue
                if not got:
                    continue
                now = time.monotonic_ns()
                before = state[0]
                if mode == "count":
                    state[0] += got
                    if qos:
                        _ack_by_size(s, buf, got, before, packet_size)
                else:
                    _time_packets(s, state, bytes(view[:got]), now, packet_size, lat)
                if before < want <= state[0]:
                    waiting -= 1
                    last = time.perf_counter()
        delivered = sum(min(k.data[0], want) for k in sel.get_map().values()) // packet_size
        pipe.send((delivered, last - started, _cpu() - cpu0) if mode == "count" else (lat, _cpu() - cpu0))
    for s in socks:
        s.close()


def _subscribed(port, n, prefix, topic, qos, sources):
    """``(sockets, selector)``: ``n`` connections subscribed to ``topic`` at ``qos`` (each SUBACK checked), made
    non-blocking and registered with ``[bytes received, partial packet]`` as their data."""
    socks = open_connections(port, n, prefix, 600, sources)
    for s in socks:
        s.sendall(subscribe_packet(1, topic, qos))
    for s in socks:
        ack = recv_exact(s, SUBACK_LEN)
        if ack[0] != 0x90 or ack[4] > 2:
            raise ConnectionError("SUBACK refused: %r" % ack)
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, [0, b""])  # bytes received, partial packet (timed mode)
    return socks, sel


def _time_packets(sock, state, data, now, packet_size, lat):
    """Timed mode: each whole PUBLISH in ``state``'s partial packet plus ``data`` adds ``now`` minus its payload's
    stamp to ``lat`` and ``packet_size`` to the bytes received; QoS 1 ones are acknowledged."""
    packets, state[1] = split_packets(state[1] + data)
    acks = []
    for first, body in packets:
        if first >> 4 != 3:
            continue
        tlen = struct.unpack_from("!H", body)[0]
        at = 2 + tlen
        if first & 0x06:
            acks.append(b"\x40\x02" + body[at:at + 2])
            at += 2
        lat.append(now - struct.unpack_from("!Q", body, at)[0])
        state[0] += packet_size
    if acks:
        sock.sendall(b"".join(acks))


def _ack_by_size(sock, buf, got, before, packet_size):
    """PUBACK each QoS 1 PUBLISH whose header starts in the ``got`` bytes just read (every PUBLISH is
    ``packet_size`` long: its packet id sits at a known place)."""
    acks = []
    first = -before % packet_size
    for at in range(first, got, packet_size):
        fixed = 2 if buf[at + 1] < 0x80 else 3
        tlen = (buf[at + fixed] << 8) | buf[at + fixed + 1]
        pid = at + fixed + 2 + tlen
        if pid + 2 <= got:
            acks.append(b"\x40\x02" + bytes(buf[pid:pid + 2]))
        else:  # the packet id straddles reads: rare; a 0 id is still counted by a QoS 1 broker
            acks.append(b"\x40\x02\x00\x01")
    if acks:
        sock.sendall(b"".join(acks))


def publish(pipe, port, n, prefix, topic, qos, payload_len, sources):
    """Open ``n`` publishing connections (reply: ``"ready"``); on ``("go", messages each, window)`` publish from all
    at once, QoS 0 ending with a PINGREQ whose PINGRESP says the broker handled them all, QoS 1 keeping at most
    ``window`` unacknowledged per connection (reply: ``(seconds, cpu s)``); on ``("stamped", messages, gap s)`` send
    that many stamped PUBLISHes from the first connection, ``gap`` apart (reply: ``"sent"``); ``"close"`` ends."""
    socks = open_connections(port, n, prefix, 600, sources)
    payload = b"p" * payload_len
    pids = [publish_packet(topic, payload, qos, pid) for pid in range(1, 65536)] if qos else None
    p0 = publish_packet(topic, payload, 0)
    pipe.send("ready")
    while True:
        cmd = pipe.recv()
        if cmd == "close":
            break
        if cmd[0] == "stamped":
            _, messages, gap = cmd
            s = socks[0]
            for i in range(messages):
                s.sendall(publish_packet(topic, stamped(payload_len), qos, i % 65535 + 1))
                if qos:
                    recv_exact(s, PUBACK_LEN)
                time.sleep(gap)
            pipe.send("sent")
            continue
        _, messages, window = cmd
        cpu0 = _cpu()
        started = time.perf_counter()
        if qos == 0:
            chunk = p0 * min(messages, 256)
            for s in socks:
                s.setblocking(True)
            left = [messages] * n
            while any(left):
                for i, s in enumerate(socks):
                    if left[i]:
                        k = min(left[i], 256)
                        s.sendall(chunk if k == 256 else p0 * k)
                        left[i] -= k
            for s in socks:
                s.sendall(PINGREQ)
            for s in socks:
                if recv_exact(s, 2) != PINGRESP:
                    raise ConnectionError("expected PINGRESP")
        else:
            _publish_qos1(socks, pids, messages, window)
        pipe.send((time.perf_counter() - started, _cpu() - cpu0))
    for s in socks:
        s.close()


def _publish_qos1(socks, pids, messages, window):
    sel = selectors.DefaultSelector()
    state = {}
    for s in socks:
        s.setblocking(True)
        k = min(window, messages)
        s.sendall(b"".join(pids[:k]))
        state[s] = [k, 0, b""]  # sent, acknowledged, partial PUBACK bytes
        sel.register(s, selectors.EVENT_READ)
    open_ = len(socks)
    while open_:
        for key, _ in sel.select(timeout=5):
            s = key.fileobj
            st = state[s]
            data = st[2] + s.recv(65536)
            if not data:
                raise ConnectionError("broker closed a publisher")
            whole = len(data) // PUBACK_LEN
            st[2] = data[whole * PUBACK_LEN:]
            st[1] += whole
            if st[1] >= messages:
                sel.unregister(s)
                open_ -= 1
                continue
            k = min(messages - st[0], window - (st[0] - st[1]))
            if k > 0:
                base = st[0]
                s.sendall(b"".join(pids[(base + j) % 65535] for j in range(k)))
                st[0] += k


def stamped_round(subs, pub, messages, gap, settled=None, by_worker=False, ready=()):
    """One timed round of the ``subscribe`` workers ``subs`` and the ``publish`` worker ``pub`` (each ``(process,
    pipe)``; those in ``ready`` already said so): once all are ready and 2 s settled (then ``settled()``, when
    given, e.g. to read the broker's memory), ``pub`` sends ``messages`` stamped PUBLISHes ``gap`` seconds apart
    while each subscriber times what arrives; returns every delivery's latency (ns), a list per subscribe worker
    when ``by_worker``, and ends the workers."""
    try:
        for worker in subs + [pub]:
            if worker not in ready and worker[1].recv() != "ready":
                raise RuntimeError("a generator did not connect")
        time.sleep(2)
        if settled is not None:
            settled()
        for _, pipe in subs:
            pipe.send(("time", messages, 30 + 5 * messages))
        pub[1].send(("stamped", messages, gap))
        pub[1].recv()
        lat = [pipe.recv()[0] for _, pipe in subs]
        for _, pipe in subs + [pub]:
            pipe.send("close")
    finally:
        for proc, _ in subs + [pub]:
            proc.join(30)
    return lat if by_worker else [x for each in lat for x in each]


def spawn(role, *args):
    """Start ``role(pipe, *args)`` in a process of its own; returns ``(process, pipe)``."""
    here, there = multiprocessing.Pipe()
    p = multiprocessing.get_context("fork").Process(target=role, args=(there,) + args, daemon=True)
    p.start()
    return p, here


# -- the generator's ceiling: a stand-in broker that only answers ------------------------------------------------


def _sink(pipe, qos, packet_size):
    """Answer every CONNECT with CONNACK, every SUBSCRIBE with SUBACK, count PUBLISHes of ``packet_size`` bytes by
    their bytes and answer QoS 1 ones with PUBACKs, and a stream that ends with PINGREQ with PINGRESP; on the pipe's
    ``("push", messages)`` send ``messages`` QoS 0 PUBLISHes of ``packet_size`` to every subscribed connection."""
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1024)
    lsock.setblocking(False)
    pipe.send(lsock.getsockname()[1])
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, "listen")
    sel.register(pipe, selectors.EVENT_READ, "pipe")
    subscribers = []
    buf = bytearray(1 << 20)
    while True:
        for key, _ in sel.select(timeout=1):
            if key.data == "listen":
                c, _ = lsock.accept()
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(c, selectors.EVENT_READ, [0, False])  # publish bytes counted, connected
                continue
            if key.data == "pipe":
                cmd = pipe.recv()
                if cmd == "close":
                    return
                packet = publish_packet("bench/t", b"p" * (packet_size - len(publish_packet("bench/t", b"", 0))))
                block = packet * 256
                for c in subscribers:
                    c.setblocking(True)
                for start in range(0, cmd[1], 256):
                    k = min(256, cmd[1] - start)
                    for c in subscribers:
                        c.sendall(block if k == 256 else packet * k)
                pipe.send("pushed")
                continue
            c, st = key.fileobj, key.data
            got = c.recv_into(buf)
            if not got:
                sel.unregister(c)
                c.close()
                continue
            if not st[1]:
                st[1] = True
                c.sendall(b"\x20\x02\x00\x00")
                continue
            if buf[0] == 0x82 and got < 64 and not st[0]:
                subscribers.append(c)
                c.sendall(b"\x90\x03" + bytes(buf[2:4]) + b"\x00")
                continue
            before = st[0]
            st[0] += got
            if qos:
                acks = st[0] // packet_size - before // packet_size
                if acks:
                    c.sendall(b"\x40\x02\x00\x01" * acks)
            elif st[0] % packet_size == 2 and bytes(buf[got - 2:got]) == PINGREQ:
                st[0] -= 2
                c.sendall(PINGRESP)


class Sink:
    """The stand-in broker in a process of its own, for PUBLISHes of ``packet_size`` bytes at ``qos`` (``port``;
    ``push(messages)``; ``stop()``)."""

    def __init__(self, packet_size, qos=0):
        self.proc, self.pipe = spawn(_sink, qos, packet_size)
        self.port = self.pipe.recv()

    def push(self, messages):
        self.pipe.send(("push", messages))
        self.pipe.recv()

    def stop(self):
        self.pipe.send("close")
        self.proc.join(5)
