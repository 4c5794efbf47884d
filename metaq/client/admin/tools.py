"""``metaq-admin put`` and ``metaq-admin tail``: messages in and out from a shell (docs/operating.md "Admin commands").

``put TOPIC``: each line of stdin (or ``--file``) is one message, its line end (``\\n`` or ``\\r\\n``) stripped;
``--raw`` sends the whole input as one message. Sent by the metaq ``Producer``, so brokers are found as every
client finds them (``--zk`` or ``--brokers``). Prints ``<id> <partition> <offset>`` per stored message (``--json``:
one object per line); stops at the first failure, saying the broker's error and how many were stored.

``tail TOPIC``: prints the messages of every partition (or ``--partition``) from ``--from`` (``earliest``, the
default; ``latest``; an offset; or an ISO 8601 time, found with ``offset_at``) to the end of the log; with
``--follow`` it goes on printing messages as they arrive (long polls) until Ctrl-C or SIGTERM (exit 0; both are
handled explicitly, so a tail started where SIGINT is ignored, as ``nohup … &`` leaves it, still stops on it) or
``--max``. A line
is ``<partition> <offset> <attribute|-> <keys|-> <body>``, the body as text with every byte that is not
printable UTF-8 escaped (``\\xff``, ``\\n``); ``--json`` gives one object per line with the body also in base64.
It never commits an offset.
"""

import base64
import json
import queue
import signal
import sys
import threading

from metaq import errors
from metaq.client.connection import BrokerConnection
from metaq.client.fetcher import records_of
from metaq.client.message import Message, Partition
from metaq.protocol.properties import PROP_KEYS
from metaq.client.replies import reply_error
from metaq.client.producer import Producer
from metaq.client import replay
from metaq.client.selectors import KeySelector
from metaq.protocol import events as ev

__all__ = ["AdminExit", "add_parsers", "run_put", "run_tail", "safe_text", "parse_start", "split_lines",
           "choose_partition", "ask_broker", "ask_brokers", "refused_by"]

EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
#: The group name ``tail``'s gets carry (a get names one; tail never commits an offset).
TAIL_GROUP = "metaq-admin-tail"
#: How long one of ``tail --follow``'s gets waits at the broker for a message (ms).
FOLLOW_WAIT_MS = 1000
#: Bytes one of ``tail``'s gets asks for.
TAIL_FETCH_BYTES = 1 << 20


class AdminExit(Exception):
    """A command's end with a message for stderr and an exit code (``metaq-admin``'s codes)."""

    def __init__(self, message, code=EXIT_REFUSED):
        super().__init__(message)
        self.code = code


def add_parsers(sub, time_type):
    s = sub.add_parser("put", help="put messages: each line of stdin (or --file) is one message")
    s.add_argument("topic")
    s.add_argument("--partition", metavar="P", help="this partition (b-p, or a number: that partition of the "
                   "lowest broker id); default: round robin, or by key with --key")
    s.add_argument("--key", dest="msg_key",
                   help="the messages' key (KEYS property; picks the partition unless --partition)")
    s.add_argument("--attribute", help="the messages' attribute (a MetaQ attribute: RocketMQ consumers see tags)")
    s.add_argument("--file", metavar="F", help="read this file instead of stdin")
    s.add_argument("--raw", action="store_true", help="send the whole input as one message")
    s = sub.add_parser("tail", help="print a topic's messages; --follow for new ones (never commits offsets)")
    s.add_argument("topic")
    s.add_argument("--partition", metavar="P", help="only this partition (b-p, or a number of the lowest broker)")
    s.add_argument("--from", dest="start", default="earliest", type=parse_start(time_type),
                   help="earliest (default), latest, an offset, or an ISO 8601 time (2026-11-23T09:00:00Z)")
    s.add_argument("--follow", action="store_true", help="wait for new messages until Ctrl-C or --max")
    s.add_argument("--max", type=int, metavar="N", help="stop after N messages")


def parse_start(time_type):
    """``--from``'s type: ``("earliest"|"latest", None)``, ``("offset", n)`` or ``("time", ms)``."""
    def parse(text):
        if text in ("earliest", "latest"):
            return text, None
        if text.isascii() and text.isdigit():
            return "offset", int(text)
        return "time", time_type(text)
    return parse


def split_lines(data):
    """The messages of ``put``'s input: one per line, the line end stripped (no empty last message)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def safe_text(body):
    """``body`` as one line of text: printable UTF-8 as it is, every other byte or character escaped."""
    text = bytes(body).decode("utf-8", "backslashreplace")
    out = []
    for c in text:
        if c == "\\" or c.isprintable():
            out.append(c)
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def choose_partition(view, text):
    """A ``Partition`` from ``b-p`` or a plain number (of the lowest broker id)."""
    try:
        if "-" in text:
            return Partition.parse(text)
        if not view.brokers:
            raise AdminExit("no broker to put the partition number %s on" % text, EXIT_UNREACHABLE)
        return Partition(min(view.brokers), int(text))
    except ValueError:
        raise AdminExit("--partition %r: give b-p (0-1) or a number" % text, EXIT_USAGE) from None


# -- asking the brokers in turn -----------------------------------------------------------


def refused_by(bid, reply):
    """The usual words for a broker's refusal (``ask_broker``'s default ``refused``)."""
    return "broker %d refused: %s" % (bid, reply_error(reply))


def ask_broker(view, bid, event, timeout, refused=refused_by, missing=None):
    """Broker ``bid``'s 200 reply to ``event``, or None when it is not there: the broker could not be reached (the
    reason is added to ``view.problems``, so the command exits 1) or it answered 404, "not here" (its reason is
    added to ``missing`` when given, for the command's "no broker has it" message). Any other answer is a refusal
    the user must see: AdminExit (exit 3) with ``refused(bid, reply)``'s words, each command keeping its own."""
    url = view.brokers[bid]
    try:
        reply = view.conn(url).call(event, timeout=timeout)
    except errors.MetaqError as exc:
        view.problems.append("%s: %s" % (url, exc))
        return None
    if reply.code == 404:
        if missing is not None:
            missing.append("broker %d: %s" % (bid, bytes(reply.body).decode("utf-8", "replace")))
        return None
    if reply.code != 200:
        raise AdminExit(refused(bid, reply), EXIT_REFUSED)
    return reply


def ask_brokers(view, event, timeout, refused=refused_by, missing=None):
    """Ask every broker of ``view`` in broker id order, yielding ``(bid, reply)`` for each that has it (200);
    a caller wanting one answer stops at the first, one gathering stops at none. What is not there, unreachable
    or refused is handled as ``ask_broker`` says: the one "ask the brokers until one has it" loop of the admin
    commands (dead letters, trace, a RocketMQ 5 client's commands)."""
    for bid in sorted(view.brokers):
        reply = ask_broker(view, bid, event, timeout, refused, missing)
        if reply is not None:
            yield bid, reply


# -- put ---------------------------------------------------------------------------------


def run_put(view, args, brokers, zk):
    if args.file:
        try:
            with open(args.file, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise AdminExit("cannot read %s: %s" % (args.file, exc), EXIT_USAGE) from None
    else:
        data = sys.stdin.buffer.read()
    bodies = [data] if args.raw else split_lines(data)
    selector = None
    if args.partition is not None:
        fixed = choose_partition(view, args.partition)
        selector = lambda topic, partitions, message: fixed  # noqa: E731
    elif args.msg_key is not None:
        selector = KeySelector()
    kwargs = {"zk_connect": zk, "zk_root": args.zk_root} if zk else {"brokers": brokers}
    try:
        producer = Producer(selector=selector, security=view.security, send_timeout=args.timeout,
                            retry_deadline=args.timeout * 2, **kwargs)
    except errors.MetaqError as exc:
        raise AdminExit("cannot start a producer: %s" % exc, EXIT_UNREACHABLE) from None
    stored = 0
    try:
        for n, body in enumerate(bodies, 1):
            result = producer.send(Message(args.topic, body, args.attribute, key=args.msg_key))
            if not result.success:
                err = result.error
                code = EXIT_REFUSED if isinstance(err, errors.ClientError) else EXIT_UNREACHABLE
                raise AdminExit("put %s: message %d of %d failed: %s; %d of %d stored"
                                % (args.topic, n, len(bodies), err, stored, len(bodies)), code)
            stored += 1
            if args.json:
                print(json.dumps({"id": result.msg_id, "partition": str(result.partition), "offset": result.offset}))
            else:
                print("%d %s %d" % (result.msg_id, result.partition, result.offset))
            sys.stdout.flush()
    finally:
        producer.close()
    return EXIT_OK


# -- tail --------------------------------------------------------------------------------


def _start_offset(view, topic, bid, p, mn, mx, start):
    kind, value = start
    if kind == "earliest":
        return mn
    if kind == "latest":
        return mx
    if kind == "offset":
        return min(max(value, mn), mx)
    return replay.offset_at(view.conn(view.brokers[bid]), topic, p, value, view.timeout)


def _line(msg, as_json):
    keys = msg.properties.get(PROP_KEYS)
    if as_json:
        return json.dumps({"topic": msg.topic, "partition": str(msg.partition), "offset": msg.offset, "id": msg.id,
                           "attribute": msg.attribute, "keys": keys, "properties": msg.properties,
                           "body": safe_text(msg.body), "body_base64": base64.b64encode(msg.body).decode("ascii")})
    return "%s %d %s %s %s" % (msg.partition, msg.offset, safe_text((msg.attribute or "-").encode("utf-8")),
                               safe_text((keys or "-").encode("utf-8")), safe_text(msg.body))


class _PartitionReader(threading.Thread):
    """Reads one partition from ``offset``: to ``end`` and, following, on; messages go to ``out``."""

    def __init__(self, url, security, timeout, topic, part, offset, end, follow, out, stop):
        super().__init__(daemon=True, name="tail-%s" % (part,))
        self.conn = BrokerConnection(url, connect_timeout=timeout, request_timeout=timeout + FOLLOW_WAIT_MS / 1000.0,
                                     heartbeat_interval=0, security=security)
        self.topic, self.part, self.offset, self.end = topic, part, offset, end
        self.follow, self.out, self.stop = follow, out, stop

    def run(self):
        try:
            caught_up = False
            while not self.stop.is_set():
                at_end = self.offset >= self.end
                if at_end and not caught_up:
                    caught_up = True
                    self.out.put(("caught-up", self.part))
                if at_end and not self.follow:
                    return
                wait = FOLLOW_WAIT_MS if at_end else None
                reply = self.conn.call(ev.Get(self.topic, TAIL_GROUP, self.part.partition, self.offset,
                                              TAIL_FETCH_BYTES, 0, wait), timeout=self.conn.request_timeout)
                try:
                    records = records_of(reply, "get %s %s %d" % (self.topic, self.part, self.offset))
                except errors.Moved as exc:
                    self.offset = exc.offset
                    continue
                for i, rec in enumerate(records):
                    self.out.put(("message", Message.from_record(self.topic, self.part, self.offset + i, rec)))
                self.offset += len(records)
                if not records and not at_end:  # the end moved back (a cut): take what the broker says
                    self.end = self.offset
        except errors.MetaqError as exc:
            self.out.put(("error", ("%s %s: %s" % (self.topic, self.part, exc), isinstance(exc, errors.ClientError))))
        finally:
            self.out.put(("done", self.part))
            self.conn.close()


def topic_partitions(view, topic):
    """``[(broker id, partition, min, max)]`` of every partition of ``topic``, those without data yet included
    (``stats offsets`` lists those with data, ``stats topics`` the configured count)."""
    rows = {(bid, p): (bid, p, mn, mx) for bid, t, p, mn, mx in view.partitions() if t == topic}
    for bid, url in sorted(view.brokers.items()):
        for r in view.stats_of(url, "topics") or ():
            if r.topic == topic and r.partitions:
                for p in range(r.partitions):
                    rows.setdefault((bid, p), (bid, p, 0, 0))
    return sorted(rows.values())


def _refusal_of(view, topic, partition=0):
    """Raise the broker's refusal of a get of ``topic`` (403 when the user may not subscribe to it, which ``stats``
    hides by leaving the topic out): called when ``stats`` shows nothing, so that tail says why."""
    for bid, url in sorted(view.brokers.items()):
        try:
            reply = view.conn(url).call(ev.Get(topic, TAIL_GROUP, partition, 0, 1, 0, None), timeout=view.timeout)
            records_of(reply, "get %s %d-%d" % (topic, bid, partition))
        except (errors.Forbidden, errors.Unauthenticated):
            raise
        except errors.MetaqError:
            continue


def _stop_on_signals():
    """SIGINT and SIGTERM end a following tail (KeyboardInterrupt in the main thread), whatever their disposition
    was at start: a process started in the background without job control inherits SIGINT ignored."""
    def stop(_signum, _frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def _tail_rows(view, args):
    """The ``(broker id, partition, min, max)`` rows a tail reads: the topic's, or the one ``--partition`` names;
    AdminExit (with the broker's own refusal when it gives one) when there is none."""
    rows = topic_partitions(view, args.topic)
    if args.partition is not None:
        wanted = choose_partition(view, args.partition)
        rows = [r for r in rows if (r[0], r[1]) == (wanted.broker_id, wanted.partition)]
        if not rows:
            _refusal_of(view, args.topic, wanted.partition)
            raise AdminExit("topic %s has no partition %s on the brokers asked" % (args.topic, wanted))
    if not rows:
        _refusal_of(view, args.topic)
        raise AdminExit("no broker has messages of topic %s (see `metaq-admin topics`)" % args.topic)
    return rows


def _tail_exit(failed):
    """The exit status of a tail whose readers reported ``failed`` (``(problem, refused)`` each), said on stderr."""
    for problem, _refused in failed:
        print("metaq-admin: %s" % problem, file=sys.stderr)
    if any(refused for _problem, refused in failed):
        return EXIT_REFUSED
    return EXIT_UNREACHABLE if failed else EXIT_OK


def run_tail(view, args):
    rows = _tail_rows(view, args)
    out, stop = queue.Queue(), threading.Event()
    readers = []
    for bid, p, mn, mx in sorted(rows):
        start = _start_offset(view, args.topic, bid, p, mn, mx, args.start)
        readers.append(_PartitionReader(view.brokers[bid], view.security, view.timeout, args.topic,
                                        Partition(bid, p), start, mx, args.follow, out, stop))
    if args.follow and threading.current_thread() is threading.main_thread():
        _stop_on_signals()
    for r in readers:
        r.start()
    printed, running, waiting, failed = 0, len(readers), len(readers), []
    try:
        while running and (args.max is None or printed < args.max):
            try:
                kind, value = out.get(timeout=0.5)
            except queue.Empty:
                continue
            if kind == "message":
                print(_line(value, args.json), flush=True)
                printed += 1
            elif kind == "caught-up":
                waiting -= 1
                if waiting == 0 and args.follow:
                    print("metaq-admin: following %s (%d partitions); Ctrl-C to stop" % (args.topic, len(readers)),
                          file=sys.stderr, flush=True)
            elif kind == "error":
                failed.append(value)
            else:
                running -= 1
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
    return _tail_exit(failed)
