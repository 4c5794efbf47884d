"""Tag filtering in the broker: log bytes a consumer of 1 tag in 100 reads, filtered at the broker vs after the read.

    python -m bench.bench_tagfilter [--runs 5] [--messages 20000]

One real broker process per run on 127.0.0.1 (``async`` flush). A partition gets ``--messages`` 1 KiB messages put
over the text port, RocketMQ-style attributes (``T<i % 100>``, ``\\x02``, a KEYS property), so 1 message in 100
has tag ``T7``. Then, in the same run and on the same broker, each consumer reads the whole partition once:

* unfiltered (the peer): text ``get``s of 1 MiB from offset 0 to the end, the filter applied by the client after
  the read (what the metaq consumer did before);
* ``get_tags T7``: text ``get_tags`` of 1 MiB from offset 0, following each reply's next offset to the end;
* remoting pull ``T7``: PULL_MESSAGE with the TAG subscription ``T7``, 32 messages per pull, following
  ``nextBeginOffset`` to the end (our codec).

Each row is the broker's ``stats log_read_bytes`` growth over that consumer's read (bytes of whole records read
from the commit log), and the wall time; medians of ``--runs`` runs. The ratio column is the unfiltered read's
bytes divided by the row's (the same run's unfiltered read). Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, rmq_config  # noqa: E402
from metaq.client.raw import RemotingClient, pull_fields  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.message import encode_payload, iter_records  # noqa: E402
from metaq.protocol.rocketmq.bodies import decode_stored_messages  # noqa: E402
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode  # noqa: E402
from metaq.filters.wire import decode_tagged_body  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402

TOPIC = "tagbench"
MSG = 1024
WANTED = "T7"


def load(port, n):
    body = b"x" * MSG
    with socket.create_connection(("127.0.0.1", port)) as s:
        for lo in range(0, n, 1000):
            frames = []
            for i in range(lo, min(n, lo + 1000)):
                flag, data = encode_payload(body, "T%d\x02KEYS\x01k%d" % (i % 100, i))
                frames.append(serialize(ev.Put(TOPIC, 0, flag, data, i, metaq_checksum(data))))
            s.sendall(b"".join(frames))
            got = b""
            while got.count(b"result 200 ") < len(frames):
                chunk = s.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("broker closed the connection")
                got += chunk


def read_bytes(c):
    return int(c.stats_dict()["log_read_bytes"])


def unfiltered(c, end):
    offset, wanted = 0, 0
    while offset < end:
        r = c.get(TOPIC, 0, offset, 1 << 20)
        records = [rec for rec, _e in iter_records(r.body)]
        wanted += sum(1 for rec in records if rec.data[4:4 + len(WANTED) + 1] == (WANTED + "\x02").encode())
        offset += len(records)
    return wanted


def get_tags(c, end):
    offset, wanted = 0, 0
    while offset < end:
        r = c.get_tags(TOPIC, 0, offset, WANTED, 1 << 20)
        offset, records = decode_tagged_body(r.body)
        wanted += len(records)
    return wanted


def remoting_pull(rc, end):
    offset, wanted = 0, 0
    while offset < end:
        r = rc.call(RequestCode.PULL_MESSAGE, pull_fields(TOPIC, 0, offset, sub=WANTED))
        if r.code == ResponseCode.SUCCESS:
            wanted += len(decode_stored_messages(r.body))
        offset = int(r.ext_fields["nextBeginOffset"])
    return wanted


def one_run(root, n):
    wd = tempfile.mkdtemp(dir=root)
    cfg = rmq_config(os.path.join(wd, "data"), store=full_size_store(flush="async"),
                     topics=[{"name": "*", "partitions": 1}])
    b = BrokerProcess(wd, cfg).start()
    try:
        load(b.port, n)
        out = {}
        with b.client(60) as c, RemotingClient(b.config["remoting"]["port"], 60) as rc:
            for name, fn in (("unfiltered", lambda: unfiltered(c, n)), ("get_tags", lambda: get_tags(c, n)),
                             ("pull", lambda: remoting_pull(rc, n))):
                before, t = read_bytes(c), time.perf_counter()
                wanted = fn()
                out[name] = (read_bytes(c) - before, time.perf_counter() - t, wanted)
        return out
    finally:
        b.stop()
        shutil.rmtree(wd, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=20000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-tagbench-")
    try:
        runs = [one_run(root, args.messages) for _ in range(args.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("tag filtering: %d messages of 1 KiB, 1 tag in 100 wanted (%s), median of %d runs, 127.0.0.1"
          % (args.messages, WANTED, args.runs))
    print("| consumer | log bytes read | fewer than unfiltered | read time | wanted messages |")
    print("|---|---|---|---|---|")
    labels = {"unfiltered": "text `get`, filter after the read (peer)", "get_tags": "text `get_tags T7`",
              "pull": "remoting PULL, subscription `T7`"}
    for name in ("unfiltered", "get_tags", "pull"):
        nbytes = statistics.median(r[name][0] for r in runs)
        ratio = statistics.median(r["unfiltered"][0] / max(1, r[name][0]) for r in runs)
        secs = statistics.median(r[name][1] for r in runs)
        wanted = statistics.median(r[name][2] for r in runs)
        print("| %s | %s | %.0fx | %.3f s | %d |" % (labels[name], format(int(nbytes), ","), ratio, secs, wanted))


if __name__ == "__main__":
    main()
