"""The official RocketMQ client (PyPI ``rocketmq==0.4.4``, C++ core) driven from a subprocess.

Used by ``bench.bench_remoting`` and the remoting tests: ``run_peer(home, *args)`` (or
``start_peer`` + ``finish_peer``) runs this file as a script and returns its JSON lines.

The C++ library keeps threads that stop the interpreter from exiting, so every
run ends with ``os._exit``; its logs go to ``$HOME/logs/rocketmq-cpp`` (the test
gives each run a HOME of its own). Output: one JSON object per line.

    produce --ns ADDR --topic T --count N [--tags X] [--delay-level L] [--prefix P] [--size B] [--keep-going]
            [--retry-for S [--retry-pause S]] [--interval S] [--orderly-keys K]
    consume --ns ADDR --topic T --group G --expect N [--subscription EXPR] [--timeout S] [--linger S] [--fail BODY]
            [--stop-after K]
            [--distinct]  (count distinct bodies toward N: redeliveries after a failover do not end it early)
            [--orderly [--work S] [--log FILE] [--stop-file PATH]]

Either may sign its requests (RocketMQ's ACL): ``--access-key AK --secret-key SK [--channel C]``. With
``--keep-going`` a failed send is reported as ``{"i": i, "error": text}`` and the run goes on. With
``--retry-for S`` a failed send is sent again (after ``--retry-pause``) until acknowledged or S seconds have
passed since its first attempt, as an application retries on top of the client's own policy; its line then
also gives ``first_t`` (its first attempt), ``failures`` and ``first_error``. ``--interval``: a pause between
messages.

``--orderly-keys K``: message i goes with ``send_orderly`` under key ``i % K`` (the client's hashing selector:
queue = key % queues), its body ``k<key>-<n>`` (n counts that key's messages), in order per key. ``--orderly``: an
orderly push consumer (``PushConsumer(orderly=True)``); each message gets a line when its handler begins (with
``"ev": "begin"`` and the pid) and one when it ends (``"ev": "end"``), the handler taking ``--work`` seconds, so
the test can check that no queue was processed by two consumers at once. ``--log FILE`` also appends every line
to FILE instead of stdout (a test reads it while the consumer runs, and after a kill -9: a pipe nobody reads
would block the handler); ``--stop-file PATH`` ends the run when PATH exists.
"""

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import threading
import time

PEER = os.path.abspath(__file__)


_COPY = []  # the --log file, when given


_EMIT_LOCK = threading.Lock()  # one line at a time, from any thread


def emit(obj, to_stdout=True):
    with _EMIT_LOCK:
        line = json.dumps(obj) + "\n"
        if to_stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
        for f in _COPY:
            f.write(line)
            f.flush()


#: The C++ client's log ($HOME/logs/rocketmq-cpp): at most this many files of this size (a consumer pulling from a
#: dead broker retries without pause and logs every attempt: ~1 MB/s).
LOG_FILES, LOG_FILE_BYTES = 2, 8 << 20


def _cap_log(client, setter):
    from rocketmq import ffi

    getattr(ffi.dll, setter)(client._handle, LOG_FILES, LOG_FILE_BYTES)


def sized_body(prefix, i, size):
    """A body of ``size`` bytes that names its message (``<prefix>-<i> `` repeated): distinct, and compressible
    as most real bodies are (the C++ client compresses bodies over 4 KiB)."""
    seed = "%s-%d " % (prefix, i)
    return (seed * (size // len(seed) + 1))[:size]


def m_body(args, i):
    return "%s-%d" % (args.prefix, i) if not args.size else sized_body(args.prefix, i, args.size)


def produce(args):
    from rocketmq.client import Message, Producer

    p = Producer(args.group or "PG_TEST")
    _cap_log(p, "SetProducerLogFileNumAndSize")
    p.set_namesrv_addr(args.ns)
    if args.size > 128 << 10:  # the C++ client refuses bodies over 128 KiB unless told otherwise
        p.set_max_message_size(4 << 20)
    if args.access_key is not None:
        p.set_session_credentials(args.access_key, args.secret_key, args.channel)
    p.start()
    started = time.time()
    for i in range(args.count):
        m = Message(args.topic)
        key = i % args.orderly_keys if args.orderly_keys else None
        m.set_keys("%s-key-%d" % (args.prefix, i) if key is None else "k%d" % key)
        if args.tags:
            m.set_tags(args.tags)
        if args.delay_level:
            m.set_delay_time_level(args.delay_level)
        m.set_property("seq", str(i))
        for item in args.property or ():  # e.g. TIMER_DELAY_MS=1500 (README "Any delivery time")
            name, _eq, value = item.partition("=")
            m.set_property(name, value)
        m.set_body(m_body(args, i) if key is None else "k%d-%d" % (key, i // args.orderly_keys))
        first_t, failures, first_error = time.time(), 0, None
        while True:
            try:
                r = p.send_sync(m) if key is None else p.send_orderly(m, key)
                break
            except Exception as exc:  # noqa: BLE001 - retried, or reported as a line
                failures += 1
                first_error = first_error or str(exc)
                if args.retry_for and time.time() - first_t < args.retry_for:
                    time.sleep(args.retry_pause)
                    continue
                if not args.keep_going:
                    raise
                emit({"i": i, "error": str(exc), "first_t": first_t, "failures": failures, "t": time.time()})
                r = None
                break
        if r is not None and not args.quiet:
            line = {"i": i, "status": int(r.status), "msg_id": r.msg_id, "offset": r.offset, "t": time.time()}
            if args.retry_for:
                line.update(body=m_body(args, i), first_t=first_t, failures=failures, first_error=first_error)
            emit(line)
        if args.interval:
            time.sleep(args.interval)
    emit({"done": True, "seconds": time.time() - started})
    p.shutdown()


def consume(args):
    from rocketmq.client import PushConsumer

    got = []
    times = []  # first and latest arrival
    lock = threading.Lock()
    stop_after = args.stop_after

    def on_message(msg):
        body = msg.body.decode()
        if args.digest:  # large bodies: their length and SHA-256 instead of the bytes
            body = "%d:%s" % (len(msg.body), hashlib.sha256(msg.body).hexdigest())
        if not args.quiet:
            line = {"body": body, "tags": msg.tags.decode(), "keys": msg.keys.decode(), "id": msg.id,
                    "topic": msg.topic, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
                    "reconsume_times": msg.reconsume_times, "seq": msg.get_property("seq").decode(),
                    "t": time.time()}
            if args.orderly:
                line.update(ev="begin", pid=os.getpid())
            emit(line, not args.log)
        if args.work:
            time.sleep(args.work)
        if args.orderly:
            emit({"ev": "end", "queue_id": msg.queue_id, "queue_offset": msg.queue_offset, "pid": os.getpid(),
                  "t": time.time()}, not args.log)
        if args.fail and body == args.fail:
            raise RuntimeError("handler refuses %s" % body)
        with lock:
            got.append(body)
            now = time.time()
            if times:
                times[1] = now
            else:
                times.extend((now, now))

    c = PushConsumer(args.group, orderly=args.orderly)
    _cap_log(c, "SetPushConsumerLogFileNumAndSize")
    c.set_namesrv_addr(args.ns)
    if args.access_key is not None:
        c.set_session_credentials(args.access_key, args.secret_key, args.channel)
    c.subscribe(args.topic, on_message, args.subscription)
    c.start()
    started = time.time()
    emit({"started": True})
    deadline = started + args.timeout
    target = stop_after or args.expect
    while time.time() < deadline:
        if args.stop_file and os.path.exists(args.stop_file):
            break
        with lock:
            if (len(set(got)) if args.distinct else len(got)) >= target:
                break
        time.sleep(0.02)
    with lock:
        count = len(got)
    emit({"received": count, "seconds": time.time() - started, "first_t": times[0] if times else None,
          "last_t": times[1] if times else None})
    if args.linger:
        time.sleep(args.linger)
    c.shutdown()
    emit({"done": True})


def peer_env(home):
    os.makedirs(str(home), exist_ok=True)
    env = dict(os.environ, HOME=str(home))
    return env


def start_peer(home, *args):
    """Start this script with ``args`` (HOME: ``home``); returns the Popen (stdout: JSON lines)."""
    proc = subprocess.Popen([sys.executable, PEER] + [str(a) for a in args], env=peer_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.peer_home = str(home)
    return proc


#: A failed peer's report quotes at most this many of its client log's last warning and error lines.
LOG_TAIL_LINES = 30


def client_log_tail(home, lines=LOG_TAIL_LINES):
    """The last ``lines`` warning and error lines of the C++ client's log under ``home``: the client names the
    broker's refusal or its own timeout there, and reports only "No route info of this topic" to its caller."""
    if not home:
        return "(not kept: the peer was not started by start_peer)"
    kept = []
    for path in sorted(glob.glob(os.path.join(str(home), "logs", "rocketmq-cpp", "*"))):
        with open(path, errors="replace") as f:
            kept.extend(line.rstrip() for line in f if "(warning)" in line or "(error)" in line)
    return "\n".join(kept[-lines:])


def finish_peer(proc, timeout=90.0):
    """Wait for a peer; returns its JSON lines (fails the test, with its stderr, if it did not exit 0)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError("RocketMQ peer did not finish in %.0f s:\n%s\n%s\nits client's log:\n%s"
                             % (timeout, out[-2000:], err[-2000:], client_log_tail(getattr(proc, "peer_home", ""))))\
            from None
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 and not _aborted_in_its_own_shutdown(proc.returncode, err, lines):
        raise AssertionError("RocketMQ peer failed (%s):\n%s\nits client's log:\n%s"
                             % (proc.returncode, err[-4000:], client_log_tail(getattr(proc, "peer_home", ""))))
    return lines


def _aborted_in_its_own_shutdown(code, err, lines):
    """The C++ client (rocketmq-client-cpp under PyPI's rocketmq 0.4.4) now and then aborts in a producer's
    ``shutdown``, its thread pool interrupted (``terminate called after throwing an instance of
    'boost::thread_interrupted'``, SIGABRT): a known defect of that library, after every send was made and reported
    (the producer emits ``done`` before it shuts down; a consumer only after, so its crash still fails)."""
    return code == -6 and "boost::thread_interrupted" in err and bool(lines) and lines[-1].get("done") is True


#: ``produce``'s arguments for a producer that sends again what failed, as an application does, for a test that checks
#: where messages go rather than the first send's fate: the C++ core (built with GCC 4.8, whose
#: ``timed_mutex::try_lock_for`` returns at once when contended) fails a send with 'No route info of this topic' when
#: its heartbeat thread is opening a broker's connection at that instant (rocketmq-client-cpp issues 224 and 456),
#: most often with several brokers to open at start.
APP_RETRIES = ("--retry-for", 20, "--retry-pause", 0.2)


def run_peer(home, *args, timeout=90.0):
    return finish_peer(start_peer(home, *args), timeout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("produce", "consume"))
    ap.add_argument("--ns", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--tags")
    ap.add_argument("--subscription", default="*", help="consume: the TAG expression (\"A || B\")")
    ap.add_argument("--prefix", default="m")
    ap.add_argument("--size", type=int, default=0, help="bodies of this many bytes instead of '<prefix>-<i>'")
    ap.add_argument("--delay-level", type=int, default=0)
    ap.add_argument("--property", action="append", help="produce: NAME=VALUE set on every message (repeatable)")
    ap.add_argument("--expect", type=int, default=0)
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--distinct", action="store_true")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--fail")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--digest", action="store_true", help="consume: report bodies as '<length>:<sha256>'")
    ap.add_argument("--keep-going", action="store_true")
    ap.add_argument("--retry-for", type=float, default=0.0)
    ap.add_argument("--retry-pause", type=float, default=0.2)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--orderly-keys", type=int, default=0)
    ap.add_argument("--orderly", action="store_true")
    ap.add_argument("--work", type=float, default=0.0)
    ap.add_argument("--log")
    ap.add_argument("--stop-file")
    ap.add_argument("--access-key")
    ap.add_argument("--secret-key", default="")
    ap.add_argument("--channel", default="metaq")
    args = ap.parse_args()
    if args.log:
        _COPY.append(open(args.log, "a"))
    code = 0
    try:
        (produce if args.mode == "produce" else consume)(args)
    except BaseException:  # noqa: BLE001 - report, then leave without waiting for the C++ threads
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
