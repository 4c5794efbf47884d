"""A device's plain read stored and acknowledged in one step, and a burst's PUBACKs written from the reader's turn
(docs/mqtt.md): the publisher's hot path, compiled with Cython where it is built (``metaq.native``), this source
itself elsewhere.

``plain_turn`` is what ``publishes.Publishes.read`` does with a read that holds whole packets and nothing buffered
before it; ``pubacks_now`` is how it, and ``acks.Acknowledgements.pubacks``, write PUBACKs that may go at once. Both
work through the public methods and attributes of the objects they are given; the bytes are split and the PUBACKs
made by the wire's parsers (``wire.read_publishes``).
"""

from os import write as _write

from metaq.mqtt.wire import Publish, read_publishes
from metaq.serving.putpath import ACK_NOW

_new = object.__new__


def entries_of(split):
    """The burst's entries of the plain PUBLISHes ``wire.plain_publishes`` split (its plain values): ``(metaq topic,
    partition, flag, record data, Publish, name)`` each, the ``Publish`` made as its frozen ``__init__`` would make
    it, without its per-field ``object.__setattr__``."""
    out = []
    for topic, partition, flag, data, name, payload, qos, dup, packet_id in split:
        p = _new(Publish)
        d = p.__dict__
        d["topic"] = name
        d["payload"] = payload
        d["qos"] = qos
        d["retain"] = False
        d["dup"] = dup
        d["packet_id"] = packet_id
        d["properties"] = {}
        out.append((topic, partition, flag, data, p, name))
    return out


def pubacks_now(acks, conn, data):
    """Write a burst's PUBACKs ``data`` (``Acknowledgements.pubacks``' bytes, acknowledged at once) from the reader's
    turn when they may go now: nothing queued before them and no writer (``acks.pending`` 0), so they keep their
    place. By the socket's descriptor while packets may be written that way (``conn.direct_fd``), one write that
    never waits: a part written leaves the rest to the connection (``conn.keep_unsent``: written before anything
    else) and an empty entry queued (``acks.queue(b"")``) so the writer finishes it; a full buffer writes nothing; a
    failed write closes the connection (``conn.send_failed``). Otherwise (TLS, a writer inside a packet, something
    unsent, closed) through ``conn.try_send``. When some went, ``acks.unacked`` is lowered by the PUBACKs and
    ``acks.sent`` set: True. False: none went, the caller queues them (``acks.queue_pubacks``)."""
    if acks.pending or not data:
        return False
    size = len(data)
    fd = conn.direct_fd
    if fd >= 0:
        try:
            n = _write(fd, data)  # the descriptor is non-blocking; the interpreter ignores SIGPIPE (EPIPE instead)
        except BlockingIOError:
            return False
        except OSError as exc:
            conn.send_failed(exc.errno)
            return False
        if 0 < n < size:
            conn.keep_unsent(data[n:])
    else:
        n = conn.try_send(data) or 0
    if n <= 0:
        return False
    acks.unacked -= size >> 2
    if n < size:
        acks.queue(b"")  # the writer writes what the connection keeps first
    sent = acks.sent
    if sent is not None:
        sent.set()
    return True


def plain_turn(port, path, acks, conn, client_id, most, most_bytes, data, v5, max_packet, plans, decided, room,
               now):
    """A device's read ``data``, holding whole packets with nothing buffered before it, stored and acknowledged in one
    step when it is all plain PUBLISHes (``Publishes.read``): split and staged with their PUBACKs
    (``wire.read_publishes``, at most ``most`` of them and ``most_bytes``; ``entries_of``), the QoS 1 ones
    added to ``acks.unacked``; when they are the whole read, their burst frames (``port.frames_of``) appended by the
    put path's burst writer (``path.append_burst``), each run counted (``path.counted``), the put path's
    ``burst_written`` of now called with the delivery (``port.serving.serve``, given ``client_id``) and the PUBACKs
    written at once when they may be (the mode ACK_NOW: ``pubacks_now``), else queued (``acks.queue_pubacks``) with
    the wait the mode asks (the store's ``log_cuts`` read before the wake, which may yield): True. None: the read does
    not begin with a plain PUBLISH (nothing taken). Else ``(entries, how many at QoS 1, their records' bytes,
    PUBACKs, next pos, taken)`` for the caller's general path: other bytes follow from ``next pos``, a record is one
    the burst writer does not take, or the burst writer stopped short (``taken``: ``(frames, src, frames written,
    log end, keys, runs)``, the runs counted; else None)."""
    split, pos, qos1, nbytes, pubacks = read_publishes(data, 0, v5, max_packet, plans, decided, room, most,
                                                       most_bytes)
    if not split:
        return None
    entries = entries_of(split)
    acks.unacked += qos1
    if pos < len(data):
        return entries, qos1, nbytes, pubacks, pos, None
    frames, src, general, _names = port.frames_of(entries, port.burst_largest)
    if general:
        return entries, qos1, nbytes, pubacks, pos, None
    took, runs = path.append_burst(frames, src, now)
    keys = set()
    for run in runs:
        key = run.key
        path.counted(key[0], run.count, run.body_bytes)
        keys.add(key)
    log_end = runs[-1].log_end if runs else 0
    if took < len(entries):
        return entries, qos1, nbytes, pubacks, pos, (frames, src, took, log_end, keys, runs)
    cuts = port.store.log_cuts  # nothing yielded since the writes: the wait, if any, begins after the wake
    mode = path.burst_written(keys, now, None, port.serving.serve, (keys, entries, runs, client_id, now))
    if pubacks:
        if mode == ACK_NOW:
            if not pubacks_now(acks, conn, pubacks):
                acks.queue_pubacks(pubacks)
        else:
            acks.queue_pubacks(pubacks, (keys, log_end, now, cuts))
    return True
