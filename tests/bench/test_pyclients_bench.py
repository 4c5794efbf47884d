"""bench/bench_pyclients.py runs end to end at tiny sizes: every row of its table is filled from real servers
(Redis and NATS JetStream where they and their Python clients are installed), and every message the paced
producers sent reached the long-polling consumers (the script raises otherwise). Figures are not checked: nothing
here is timed."""

import re
import shutil

import pytest

from bench import bench_pyclients
from bench.nats_jetstream import nats_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = ("py put 100 B: send_many 1,000/call", "py put 100 B: batching Producer",
        "py read 100 B: iter_batches / XRANGE / pull", "py put 1 KiB: send_many 1,000/call",
        "py put 1 KiB: batching Producer", "py read 1 KiB: iter_batches / XRANGE / pull",
        "e2e latency p50 at 200 msgs/s offered", "e2e latency p99 at 200 msgs/s offered")


def test_every_row_is_filled_and_every_paced_message_arrives(capsys):
    bench_pyclients.main(["--runs", "1", "--messages", "1000", "--latency-seconds", "0.5", "--rates", "200"])
    out = capsys.readouterr().out
    peers = []
    if bench_pyclients.clients_available():
        peers = [name for name, there in (("redis streams", shutil.which("redis-server")),
                                          ("nats jetstream", nats_available())) if there]
    head = next(x for x in out.splitlines() if x.startswith("measurement"))
    assert all(p in head for p in peers)
    for row in ROWS:
        line = next(x for x in out.splitlines() if x.startswith(row))
        figures = re.findall(r"\d[\d,]*\.?\d*", line[len(row):])
        assert "nan" not in line and len(figures) >= 1 + 2 * len(peers), line
    reached = re.search(r"offered 200 msgs/s, the paced producer reached: (.*)", out).group(1)
    assert reached.startswith("metaq ") and len(reached.split(", ")) == 1 + len(peers)
