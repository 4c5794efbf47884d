"""Issue 53 point 9 with real processes: a `sync` group of three whose one slave fills its disk during the load,
the master killed, the disk grown, the group settled: the slave serves every offset, none as a corrupt record.

Each member keeps its data on a tmpfs of its own (1 MiB segments, 1024-unit index files); the master's and one
slave's are grown once the master is elected, the other slave's stays at 6 MiB and fills mid-load. The load puts
small messages to four partitions (each crossing a dozen index files) until that slave met a full disk; then the
master is killed (kill -9), the full slave's tmpfs is grown to 2 GiB and the group must elect a master, be
followed by both others and hold them in sync. Every member must then read as the new master at every offset of
every partition, every acknowledged message included, and none answer 512 (corrupt record, commit-log position 0
at the first offset of an index file, as the full slave once did). The lost write behind that, a file built ahead
whose name a worker step during its rename gave to another, is met far more often where the worker runs without
pause: tests/store/test_prepared_handoff.py (at will) and tests/store/test_slave_units_disk_full.py (a loop).
"""

import random
import socket
import subprocess
import time

import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.broker import consume_all, wait_for
from tests.harness.ha import SESSION_MS, Group
from tests.harness.replication import partition_ends
from tests.harness.tmpfs import tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root, pytest.mark.slow]

PARTS = [("tj", p) for p in range(4)]
#: Index units per file: the slave crosses dozens of file boundaries before its disk fills.
UNITS = 1024
#: Most messages a run puts: the slave's 6 MiB fill long before.
MOST = 120_000


def pipelined_load(port, seconds, seed):
    """Numbered messages to PARTS, 64 in flight, for ``seconds`` (at most MOST); ``{(topic, part, offset): body}``
    of those acknowledged."""
    rnd, acked, seq = random.Random(seed), {}, 0
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    parser, end = TextParser(max_body=1 << 20), time.monotonic() + seconds
    try:
        while time.monotonic() < end and seq < MOST:
            pending = {}
            for _ in range(64):
                topic, part = PARTS[seq % len(PARTS)]
                body = b"%d-%d-" % (seed, seq) + b"x" * rnd.choice([1, 10, 40])
                pending[seq] = (topic, body)
                sock.sendall(serialize(ev.Put(topic, part, 0, body, seq, metaq_checksum(body))))
                seq += 1
            while pending:
                event = parser.next_event()
                if event is NEED_DATA:
                    data = sock.recv(1 << 16)
                    if not data:
                        return acked
                    parser.receive_data(data)
                    continue
                if event is CLOSED:
                    return acked
                topic, body = pending.pop(event.opaque)
                if event.code == 200:
                    _mid, part, offset = (int(x) for x in event.body.split())
                    acked[(topic, part, offset)] = body
    finally:
        sock.close()
    return acked


def remount(path, size):
    subprocess.run(["mount", "-o", "remount,size=%s" % size, str(path)], check=True)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_full_slave_of_a_sync_group_serves_every_offset_after_the_master_is_killed(broker_factory, tmp_path,
                                                                                     zk_connect, seed):
    mounts = [tmp_path / ("m%d" % i) / "data" for i in range(3)]
    with tmpfs(mounts[0], "6m"), tmpfs(mounts[1], "6m"), tmpfs(mounts[2], "6m"):
        g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync",
                  sections={"store": {"index_file_units": UNITS}})
        first = g.healthy(30)
        full = [i for i in range(3) if i != first][seed % 2]
        for i in range(3):
            if i != full:
                remount(mounts[i], "2g")
        acked = {}
        for round_ in range(6):  # until the slave met its full disk (a loaded machine puts less a second)
            acked.update(pipelined_load(g.members[first].port, 5, seed * 10 + round_))
            if "No space left" in g.members[full].log_text() or "disk usage" in g.members[full].log_text():
                break
        assert acked, "nothing was acknowledged"
        assert "No space left" in g.members[full].log_text() or "disk usage" in g.members[full].log_text(), \
            "the slave's disk never filled"
        g.members[first].kill()
        remount(mounts[full], "2g")
        g.members[first].start()
        master = g.healthy(SESSION_MS / 1000.0 * 3 + 60)
        theirs = partition_ends(g.members[master])
        wait_for(lambda: all(partition_ends(b) == theirs for b in g.members), 60,
                 lambda: "every member at the master's ends %s: %s" % (theirs, [partition_ends(b) for b in g.members]))
        with g.members[master].client(timeout=30) as mc:
            expected = {key: consume_all(mc, *key) for key in PARTS}
        for (topic, part, offset), body in acked.items():
            assert expected[(topic, part)][offset].payload == body, (topic, part, offset)
        for i, b in enumerate(g.members):
            with b.client(timeout=30) as c:
                for key in PARTS:
                    ours = consume_all(c, *key)  # a 512 anywhere raises, naming it
                    assert len(ours) == len(expected[key]), (i, key, len(ours), len(expected[key]))
                    for offset, (a, e) in enumerate(zip(ours, expected[key], strict=True)):
                        assert a == e, "member %d: %s-%d offset %d differs from the master's" % ((i,) + key + (offset,))
        assert "corrupt record" not in g.members[full].log_text()
        for b in g.members:  # before their disks go
            b.stop()
