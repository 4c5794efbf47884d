"""Build a small cluster with consumer groups in every state and write the lag report (the README picture).

    .venv/bin/python -m tests.harness.spark_demo /tmp/demo-report [--image docs/spark-report.png]

Starts a ZooKeeper and three brokers on 127.0.0.1 (the test harness), takes eleven snapshots
one (simulated) minute apart while groups commit in known patterns, kills broker 3 before the
last one, runs the report and prints where it is. Everything it started is stopped at the end.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from kazoo.client import KazooClient

from metaq.protocol import events as ev
from metaq.client.local import BrokerProcess, small_config
from tests.harness.broker import wait_for
from tests.harness.zookeeper import ZooKeeperProcess

STEPS = 10


def start_broker(root, zk, broker_id):
    wd = os.path.join(root, "b%d" % broker_id)
    os.makedirs(wd)
    cfg = small_config(os.path.join(wd, "data"), zk={"connect": zk},
                       topics=[{"name": "orders", "partitions": 2}, {"name": "*", "partitions": 1}])
    cfg["broker"]["id"] = broker_id
    return BrokerProcess(wd, cfg).start()


def commit(zk, group, topic, part, value):
    path = "/meta/consumers/%s/offsets/%s/%s" % (group, topic, part)
    if zk.exists(path):
        zk.set(path, value.encode())
    else:
        zk.create(path, value.encode(), makepath=True)


def step(zk, clients, i, ends):
    for b in (1, 2):
        for p in (0, 1):
            for _ in range(30 if i == 0 else 12 + (i % 3) * 4):
                ends[(b, p)] = clients[b].put_ok("orders", b"order", p)[2] + 1
    for _ in range(20 if i == 0 else 6):
        clients[3].put_ok("audit", b"event", 0)
    commit(zk, "billing", "orders", "1-0", "%d-%d" % (1000 + i, ends[(1, 0)]))
    commit(zk, "billing", "orders", "2-0", "%d-%d" % (2000 + i, ends[(2, 0)] - (i % 2) * 3))
    commit(zk, "search-index", "orders", "1-1", str(10 + 9 * i))
    commit(zk, "search-index", "orders", "2-1", str(10 + 13 * i))
    if i < 4:
        commit(zk, "mailer", "orders", "1-1", "-1-%d" % (20 + 8 * i))
    commit(zk, "replay", "orders", "2-0", "77-%d" % (10 + 8 * i if i < 6 else 12 + 6 * (i - 6)))
    c = clients[2]
    assert c.call(ev.CommitOffset("fraud-check", "orders", 1, 25, c.opaque())).code == 200
    commit(zk, "audit-etl", "audit", "3-0", "5-%d" % (15 + 5 * i))
    time.sleep(0.01)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--image", help="copy the page picture (overview.png) here")
    args = parser.parse_args(argv)
    from metaq.spark.collector import collect_snapshot, write_snapshot
    from metaq.spark.report import Progress, run_report

    root = tempfile.mkdtemp(prefix="metaq-demo-")
    zk_proc = ZooKeeperProcess(os.path.join(root, "zk")).start()
    brokers = {}
    try:
        for broker_id in (1, 2, 3):
            brokers[broker_id] = start_broker(root, zk_proc.connect, broker_id)
        zk = KazooClient(hosts=zk_proc.connect)
        zk.start(15)
        wait_for(lambda: zk.exists("/meta/brokers/ids/3/master"), what="brokers registered")
        zk.create("/meta/consumers/search-index/owners/orders/1-1", b"search-index_10.0.0.7-4242", makepath=True,
                  ephemeral=True)
        clients = {bid: b.client() for bid, b in brokers.items()}
        history = os.path.join(args.out, "history")
        shutil.rmtree(history, ignore_errors=True)
        base = time.time() - 60 * STEPS
        ends = {}
        for i in range(STEPS):
            step(zk, clients, i, ends)
            write_snapshot(collect_snapshot(zk_proc.connect, clock=lambda i=i: base + 60 * i), history)
        for c in clients.values():
            c.close()
        brokers[3].kill()
        write_snapshot(collect_snapshot(zk_proc.connect, clock=lambda: base + 60 * STEPS, timeout=2), history)
        zk.stop()
        report, problems = run_report(args.out, collect=False, progress=Progress(6))
        from metaq.spark.render import console_text

        print(console_text(report))
        if args.image:
            shutil.copyfile(os.path.join(args.out, "overview.png"), args.image)
        print("report: %s" % os.path.join(args.out, "report.html"))
    finally:
        for b in brokers.values():
            b.kill()
        zk_proc.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
