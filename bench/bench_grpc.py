"""RocketMQ 5 gRPC benchmark: sends, POP receives and offset pulls over gRPC beside the remoting port's.

    python -m bench.bench_grpc [--runs 3] [--messages 20000] [--in-flight 16] [--receivers 8] [--own-core]

One real broker process per run on 127.0.0.1 (``async`` flush, so the figures are protocol and broker costs, not
fsync latency), with its gRPC and remoting ports, topics of 4 partitions, 1 KiB messages, medians of ``--runs``
runs, every row of a run against the same broker:

* send: gRPC SendMessage, one message a call, ``--in-flight`` calls outstanding at once on one channel (grpcio's
  futures from one thread); peer: remoting SEND_MESSAGE_V2 through our codec, the same number outstanding on one
  connection (pipelined);
* POP receive + ack: ``--receivers`` threads over one channel, each a loop of ReceiveMessage (batch 32, no long
  poll) then one AckMessage of what it got, until the backlog is drained; peer: remoting PULL of 32 (offset reads,
  nothing acknowledged), one request outstanding per partition on one connection;
* offset pulls: gRPC PullMessage of 32, a thread per partition over one channel; peers: remoting PULL of 32 as
  above, and text ``get``s of 32 KiB, one at a time over the 4 partitions;
* POP beside offset pulls over gRPC itself: ReceiveMessage + AckMessage against PullMessage.

The client is one Python process on the same machine: the ``client µs/msg`` columns are its CPU time (all threads,
grpcio's included) per message, and a last line gives the broker process's too, to tell a client-bound row from a
broker-bound one. Both run on every core this process may use, so a busy client (grpcio's threads in the gRPC rows,
far busier than the remoting rows' clients) preempts the broker it measures; ``--own-core`` runs the broker on a
core of its own (the last this process may use) and the client on the others, as on machines of their own. The
``target:`` lines put the broker's CPU per message of a gRPC row against its remoting peer's in the same run, beside
issue 57's bound (``TARGETS``). Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.configs import full_size_store  # noqa: E402
from bench.run import cpu_seconds, pin  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, rmq_config  # noqa: E402
from metaq.client.raw import RemotingClient, TextClient, pull_fields  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.message import iter_records  # noqa: E402
from metaq.protocol.rocketmq.bodies import encode_properties  # noqa: E402
from metaq.protocol.rocketmq.remoting import RequestCode  # noqa: E402

MSG = 1024
PARTS = 4
BATCH = 32
SERVICE = "/apache.rocketmq.v2.MessagingService/"
METADATA = (("x-mq-client-id", "bench@1@1@grpc"),)


def start(root, name):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    # the send row opens one stream a message on one connection: more than the flood budget's default lets a
    # client open in its window, which is not what is measured here
    grpc = {"port": free_port(), "max_new_streams": 1 << 20}
    cfg = rmq_config(os.path.join(wd, "data"), store=full_size_store(flush="async"), grpc=grpc,
                     topics=[{"name": "*", "partitions": PARTS}])
    return BrokerProcess(wd, cfg).start()


class Grpc:
    """The MessagingService calls the rows make, over one grpcio channel."""

    def __init__(self, port):
        import grpc

        from metaq.rmq5 import messages_pb2 as pb
        self.pb = pb
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        ser = lambda m: m.SerializeToString()  # noqa: E731
        self.send = self.channel.unary_unary(SERVICE + "SendMessage", request_serializer=ser,
                                             response_deserializer=pb.SendMessageResponse.FromString)
        self.receive = self.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=ser,
                                                 response_deserializer=pb.ReceiveMessageResponse.FromString)
        self.ack = self.channel.unary_unary(SERVICE + "AckMessage", request_serializer=ser,
                                            response_deserializer=pb.AckMessageResponse.FromString)
        self.pull = self.channel.unary_stream(SERVICE + "PullMessage", request_serializer=ser,
                                              response_deserializer=pb.PullMessageResponse.FromString)

    def message(self, topic):
        pb = self.pb
        m = pb.Message(topic=pb.Resource(name=topic), body=b"g" * MSG)
        m.system_properties.message_id = uuid.uuid4().hex.upper()
        m.system_properties.message_type = pb.NORMAL
        return m

    def close(self):
        self.channel.close()


def timed(broker_pid, fn, *args):
    """``(messages, seconds, client CPU seconds, broker CPU seconds)`` of ``fn(*args)``, which returns its message
    count."""
    cpu, bcpu, t = time.process_time(), cpu_seconds(broker_pid), time.perf_counter()
    n = fn(*args)
    return n, time.perf_counter() - t, time.process_time() - cpu, cpu_seconds(broker_pid) - bcpu


def grpc_send(g, topic, n, in_flight):
    requests = [g.pb.SendMessageRequest(messages=[g.message(topic)]) for _ in range(n)]
    window = []
    for r in requests:
        if len(window) >= in_flight:
            assert window.pop(0).result().status.code == g.pb.OK
        window.append(g.send.future(r, metadata=METADATA, timeout=30))
    for f in window:
        assert f.result().status.code == g.pb.OK
    return n


def remoting_send(b, topic, n, in_flight):
    body = b"r" * MSG
    props = encode_properties({})
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        window = []
        for i in range(n):
            if len(window) >= in_flight:
                assert rc.response(window.pop(0), 30).code == 0
            ext = {"a": "PG", "b": topic, "c": "TBW102", "d": PARTS, "e": i % PARTS, "f": 0,
                   "g": int(time.time() * 1000), "h": 0, "i": props, "j": 0, "k": "false", "m": "false"}
            window.append(rc.request(RequestCode.SEND_MESSAGE_V2, ext, body))
        for opaque in window:
            assert rc.response(opaque, 30).code == 0
    return n


def grpc_receive_ack(g, topic, n, receivers):
    pb = g.pb
    got = [0]
    lock = threading.Lock()

    def loop():
        empty = 0
        while True:
            with lock:
                if got[0] >= n:
                    return
            request = pb.ReceiveMessageRequest(group=pb.Resource(name="pop"), batch_size=BATCH,
                                               message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
            request.invisible_duration.FromSeconds(60)
            request.long_polling_timeout.FromMilliseconds(0)
            handles = [r.message.system_properties.receipt_handle
                       for r in g.receive(request, metadata=METADATA, timeout=30)
                       if r.WhichOneof("content") == "message"]
            if not handles:
                empty += 1
                if empty > 50:
                    return
                continue
            g.ack(pb.AckMessageRequest(group=pb.Resource(name="pop"), topic=pb.Resource(name=topic),
                                       entries=[pb.AckMessageEntry(receipt_handle=h) for h in handles]),
                  metadata=METADATA, timeout=30)
            with lock:
                got[0] += len(handles)

    with ThreadPoolExecutor(receivers) as pool:
        for f in [pool.submit(loop) for _ in range(receivers)]:
            f.result()
    return got[0]


def grpc_pull(g, topic):
    pb = g.pb

    def queue(q):
        offset, got = 0, 0
        while True:
            request = pb.PullMessageRequest(group=pb.Resource(name="offsets"), offset=offset, batch_size=BATCH,
                                            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=q))
            request.long_polling_timeout.FromMilliseconds(0)
            responses = list(g.pull(request, metadata=METADATA, timeout=30))
            count = sum(1 for r in responses if r.WhichOneof("content") == "message")
            if not count:
                return got
            got += count
            offset = responses[-1].next_offset

    with ThreadPoolExecutor(PARTS) as pool:
        return sum(pool.map(queue, range(PARTS)))


def remoting_pull(b, topic):
    got = 0
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        offsets = {q: 0 for q in range(PARTS)}
        waiting = {rc.request(RequestCode.PULL_MESSAGE, pull_fields(topic, q, 0, group="codec", sys_flag=4)): q
                   for q in range(PARTS)}
        while waiting:
            opaque = next(iter(waiting))
            q = waiting.pop(opaque)
            r = rc.response(opaque, 30)
            if r.code != 0:
                continue
            nxt = int(r.ext_fields["nextBeginOffset"])
            got += nxt - offsets[q]
            offsets[q] = nxt
            waiting[rc.request(RequestCode.PULL_MESSAGE, pull_fields(topic, q, nxt, group="codec", sys_flag=4))] = q
    return got


def text_get(b, topic):
    got = 0
    with TextClient("127.0.0.1", b.port) as c:
        for part in range(PARTS):
            offset = 0
            while True:
                r = c.get(topic, part, offset, max_size=BATCH * (MSG + 20))
                if not isinstance(r, ev.Value):
                    break
                count = sum(1 for _ in iter_records(r.body, verify=False))
                got += count
                offset += count
    return got


ROWS = (
    # key, name, peer key, peer name
    ("gsend", "send: gRPC SendMessage, {f} in flight", "rsend", "remoting SEND_MESSAGE_V2, {f} in flight"),
    ("gpop", "POP: gRPC ReceiveMessage 32 + AckMessage, {r} thr", "rpull", "remoting PULL 32, 4 in flight"),
    ("gpull", "offset: gRPC PullMessage 32, 4 threads", "rpull", "remoting PULL 32, 4 in flight"),
    ("gpull2", "offset: gRPC PullMessage 32, 4 threads", "tget", "text get 32 KiB, one at a time"),
    ("gpop2", "POP: gRPC ReceiveMessage 32 + AckMessage, {r} thr", "gpull", "gRPC PullMessage 32, 4 threads"),
)


#: Issue 57's targets, broker CPU per message against the peer of the same run: (name, row, peer row, at most).
TARGETS = (
    ("broker CPU, gRPC SendMessage / remoting SEND_MESSAGE_V2", "gsend", "rsend", 1.5),
    ("broker CPU, gRPC ReceiveMessage + AckMessage / remoting PULL", "gpop", "rpull", 2.0),
)


def cores(own):
    """``(broker's cores, client's cores)`` when ``own`` (and two cores or more): the last core for the broker, the
    others for the client; else None, both on every core."""
    mine = sorted(os.sched_getaffinity(0))
    if not own or len(mine) < 2:
        return None
    return {mine[-1]}, set(mine[:-1])


def run(args):
    split = cores(args.own_core)
    if split is not None:  # before grpcio's threads exist: threads made later inherit their maker's cores
        pin(os.getpid(), split[1])
    root = tempfile.mkdtemp(prefix="metaq-bench-grpc-", dir=args.dir)
    rates = {k: [] for k in ("gsend", "rsend", "gpop", "gpull", "rpull", "tget")}
    cpu = {k: [] for k in rates}
    bcpu = {k: [] for k in rates}
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            if split is not None:
                pin(b.proc.pid, split[0])
            g = Grpc(b.config["grpc"]["port"])
            n = args.messages
            try:
                for key, fn, fargs in (
                        ("gsend", grpc_send, (g, "gq", n, args.in_flight)),
                        ("rsend", remoting_send, (b, "rq", n, args.in_flight)),
                        ("gpull", grpc_pull, (g, "gq")),
                        ("rpull", remoting_pull, (b, "rq")),
                        ("tget", text_get, (b, "rq")),
                        ("gpop", grpc_receive_ack, (g, "gq", n, args.receivers))):
                    got, seconds, used, bused = timed(b.proc.pid, fn, *fargs)
                    if got != n:
                        print("warning: %s moved %d of %d messages" % (key, got, n), file=sys.stderr)
                    rates[key].append(got / seconds)
                    cpu[key].append(used / max(1, got) * 1e6)
                    bcpu[key].append(bused / max(1, got) * 1e6)
            finally:
                g.close()
                b.stop()
                shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    med_bcpu = {k: statistics.median(v) for k, v in bcpu.items()}
    print()
    print("metaq gRPC benchmark: %d x 1 KiB messages, 4 partitions, async flush, median of %d runs, broker and "
          "client on 127.0.0.1, %s" % (args.messages, args.runs, "sharing every core" if split is None else
                                       "the broker on core %s, the client on %s" % (
                                           min(split[0]), ",".join(map(str, sorted(split[1]))))))
    head = "%-50s %10s  %-6s %9s  %-40s %10s %9s %7s" % ("measurement", "metaq", "unit", "client", "peer", "peer",
                                                        "client", "ratio")
    print(head)
    print("%-50s %10s  %-6s %9s  %-40s %10s %9s %7s" % ("", "", "", "µs/msg", "", "", "µs/msg", ""))
    print("-" * len(head))
    for key, name, peer, peer_name in ROWS:
        ours = key.rstrip("2")
        fill = dict(f=args.in_flight, r=args.receivers)
        print("%-50s %10s  %-6s %9.0f  %-40s %10s %9.0f %6.2fx" % (
            name.format(**fill), "{:,.0f}".format(med[ours]), "msgs/s", med_cpu[ours], peer_name.format(**fill),
            "{:,.0f}".format(med[peer]), med_cpu[peer], med[ours] / med[peer]))
    print("ratio: metaq row / peer (> 1: the gRPC row is faster)")
    for name, ours, peer, target in TARGETS:
        ratio = med_bcpu[ours] / max(1e-9, med_bcpu[peer])
        print("target: %-62s %5.2fx (target %.1fx: %s)" % (name, ratio, target,
                                                            "met" if ratio <= target else "not yet"))
    print("CPU µs/msg (client / broker): " + "; ".join("%s %.0f / %.0f" % (k, med_cpu[k], med_bcpu[k]) for k in rates))
    print("runs (msgs/s): " + "; ".join("%s %s" % (k, ", ".join("{:,.0f}".format(x) for x in v))
                                        for k, v in rates.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=16, help="sends outstanding at once (both protocols)")
    ap.add_argument("--receivers", type=int, default=8, help="gRPC ReceiveMessage threads")
    ap.add_argument("--own-core", action="store_true",
                    help="the broker on a core of its own, the client on the others (default: both on every core)")
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
