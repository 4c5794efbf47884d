"""A `sync` slave whose disk fills and empties again and again during a load, on real brokers (issue 41 point 3).

The slave's data directory is a real tmpfs; a filler file takes all but a random few hundred KiB of it for a
random moment, then goes, over and over, so that ENOSPC meets whatever the slave is doing (a segment, an index
file created or grown, by its loop or ahead of it, the key index, a checkpoint). Once the load ends and space
returns, the slave must catch up and then read exactly as its master at every offset of every partition, keep
every message the master acknowledged, and ``metaq-server --verify`` its log clean. The master is killed with
kill -9 and started again mid-way in one run.
"""

import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.broker import consume_all, wait_for
from tests.harness.replication import caught_up, stats
from tests.harness.tmpfs import tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root, pytest.mark.slow]

PARTS = [("t-a", p) for p in range(4)] + [("t-b", p) for p in range(4)]


class Toggler(threading.Thread):
    """Fills ``mount`` but for 0..400 KiB for 20-400 ms, then frees it for 0-300 ms, until stopped."""

    def __init__(self, mount, seed):
        super().__init__(daemon=True)
        self.path, self.rnd, self.stopped, self.fills = os.path.join(mount, "filler"), random.Random(seed), False, 0

    def run(self):
        while not self.stopped:
            st = os.statvfs(os.path.dirname(self.path))
            want = st.f_bavail * st.f_frsize - self.rnd.randrange(0, 400) * 1024
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if want > 0:
                    os.posix_fallocate(fd, 0, want)
                    self.fills += 1
            except OSError:
                pass
            finally:
                os.close(fd)
            time.sleep(self.rnd.uniform(0.02, 0.4))
            os.unlink(self.path)
            time.sleep(self.rnd.uniform(0.0, 0.3))


#: Most messages a load puts: the master's log stays well within the slave's tmpfs, so that once space returns
#: the slave can hold all of it (``small_config`` never frees segments early: its warn mark is 1.0).
MAX_LOAD_MESSAGES = 200_000


def pipelined_load(port, seconds, seed, most=MAX_LOAD_MESSAGES):
    """Put numbered messages, 64 in flight, for ``seconds`` (``most`` at most);
    ``{(topic, partition, offset): body}`` acknowledged."""
    rnd, acked, seq = random.Random(seed), {}, 0
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    parser, end = TextParser(max_body=1 << 20), time.monotonic() + seconds
    try:
        while time.monotonic() < end and seq < most:
            pending = {}
            for _ in range(64):
                topic, part = PARTS[seq % len(PARTS)]
                body = b"%d-%d-" % (seed, seq) + b"x" * rnd.choice([1, 10, 100, 900])
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
    except OSError:
        pass  # the master was killed
    finally:
        sock.close()
    return acked


@pytest.mark.parametrize("kill_master", [False, True])
def test_a_sync_slave_whose_disk_fills_and_empties_reads_as_its_master(broker_factory, tmp_path, kill_master):
    mount = tmp_path / "slave"
    with tmpfs(mount, "256m"):  # far more than the master's log (MAX_LOAD_MESSAGES): the filler makes it full
        rport = free_port()
        master = broker_factory(small_config(tmp_path / "m" / "data", replication={"port": rport, "mode": "sync"}),
                                workdir=tmp_path / "m")
        slave = broker_factory(small_config(mount / "data"), workdir=tmp_path / "s",  # its log off the full disk
                               extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
        toggler = Toggler(str(mount), seed=41 + kill_master)
        toggler.start()
        acked = pipelined_load(master.port, 8, seed=1)
        for more in range(2):  # a loaded machine puts less: the load goes on until the slave met a full disk
            if "No space left" in slave.log_text() or len(acked) >= MAX_LOAD_MESSAGES:
                break
            acked.update(pipelined_load(master.port, 4, seed=100 + more, most=MAX_LOAD_MESSAGES - len(acked)))
        if kill_master:
            master.kill()
            master.start()
            acked.update(pipelined_load(master.port, 4, seed=2))
        toggler.stopped = True
        toggler.join()
        assert toggler.fills > 5 and "No space left" in slave.log_text(), "the slave's disk never filled"
        assert acked, "nothing was acknowledged"

        wait_for(lambda: stats(slave)["log_end_position"] == stats(master)["log_end_position"], 60,
                 lambda: "the slave catches up once space returns: %s" % slave.log_text()[-2000:])
        caught_up(master, slave)  # its partitions answer the master's ends, not only its log
        with master.client(timeout=30) as mc, slave.client(timeout=30) as sc:
            for topic, part in PARTS:
                theirs = consume_all(mc, topic, part)
                ours = consume_all(sc, topic, part)
                assert len(ours) == len(theirs), (topic, part, len(ours), len(theirs))
                for offset, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                    assert a == b, "%s-%d offset %d differs on the slave" % (topic, part, offset)
                for (t, p, offset), body in acked.items():
                    if (t, p) == (topic, part):
                        assert ours[offset].payload == body, (topic, part, offset)
        slave.stop()
        out = subprocess.run([sys.executable, "-m", "metaq.server", "-c", slave.config_path, "--verify"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and ", 0 corrupt" in out.stdout and "torn tail" not in out.stdout, out.stdout
