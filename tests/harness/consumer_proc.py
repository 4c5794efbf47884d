"""A group consumer as its own process, for end-to-end tests.

    python -m tests.harness.consumer_proc --zk HOST:PORT/chroot --group G --topic T --id ID --out FILE

Runs ``metaq.client.Consumer`` whose handler appends ``"<partition> <offset> <payload>\\n"`` to
``--out`` (flushed line by line, so a kill -9 loses at most a torn last line). Creates
``--out`` + ``.ready`` once ``start()`` returned (the first rebalance is done). SIGTERM or
SIGINT closes the consumer (commit, release, leave the group) and exits 0.
"""

import argparse
import logging
import os
import signal
import sys
import threading

from metaq.client import Consumer


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--zk", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--session-timeout", type=float, default=4.0)
    p.add_argument("--commit-interval", type=float, default=1.0)
    p.add_argument("--handler-delay", type=float, default=0.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    lock = threading.Lock()
    out = open(args.out, "a", encoding="utf-8")

    def handle(message):
        line = "%s %d %s\n" % (message.partition, message.offset, message.body.decode("utf-8"))
        with lock:
            out.write(line)
            out.flush()
        if args.handler_delay:
            stop.wait(args.handler_delay)

    workdir = os.path.dirname(os.path.abspath(args.out))
    consumer = Consumer(args.group, zk_connect=args.zk, consumer_id=args.id, session_timeout=args.session_timeout,
                        commit_interval=args.commit_interval, long_poll_ms=1000,
                        recover_dir=os.path.join(workdir, "recover-" + args.id))
    consumer.subscribe(args.topic, handle)
    consumer.start()
    with open(args.out + ".ready", "w") as f:
        f.write("%d\n" % os.getpid())
    while not stop.wait(0.5):
        pass
    consumer.close()
    with lock:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
