"""A streaming query of metaq's Spark source in a driver process of its own (``tests/spark/stream_driver.py``), so
a test can SIGKILL it mid-batch, and what such tests read back: a streaming checkpoint's planned and committed
batches, the offsets a stream must reach."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

from metaq.protocol import events as ev
from tests.harness.broker import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def put_many(broker, topic, start, count, partitions=4):
    """Put ``count`` numbered bodies round-robin over the partitions; ``{(key, offset): body}`` of what was stored."""
    sent = {}
    with broker.client() as c:
        for i in range(start, start + count):
            body = b"msg-%06d" % i
            p = i % partitions
            offset = c.put_ok(topic, body, p)[2]
            sent[("%d-%d" % (broker.config["broker"]["id"], p), offset)] = body
    return sent


def checkpoint_state(ck):
    """``(last planned batch, its source offsets, last committed batch)`` of a streaming checkpoint (-1: none)."""
    def ids(sub):
        return [int(os.path.basename(p)) for p in glob.glob(os.path.join(ck, sub, "*"))
                if os.path.basename(p).isdigit()]

    planned, committed = ids("offsets"), ids("commits")
    last = max(planned, default=-1)
    offsets = None
    if last >= 0:
        with open(os.path.join(ck, "offsets", str(last))) as f:
            lines = f.read().splitlines()
        offsets = json.loads(lines[2]) if len(lines) > 2 else None
    return last, offsets, max(committed, default=-1)


class Driver:
    """``tests/spark/stream_driver.py`` as a child process in its own session (killed by its own PID)."""

    def __init__(self, tmp, *args):
        self.stop_file = os.path.join(str(tmp), "stop-%d" % time.monotonic_ns())
        self.log_path = self.stop_file + ".log"
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.spark.stream_driver", "--stop-file", self.stop_file,
                                      *args], cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout=120):
        open(self.stop_file, "w").close()
        rc = self.proc.wait(timeout)
        self.log.close()
        assert rc == 0, self.text()[-3000:]

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)  # the driver and its JVM: the whole session, by our child's PID
        self.proc.wait(30)
        self.log.close()


def batch_offsets(ck, batch_id):
    """The source offsets (end) of micro-batch ``batch_id`` in the checkpoint."""
    with open(os.path.join(ck, "offsets", str(batch_id))) as f:
        return json.loads(f.read().splitlines()[2])


def wait_caught_up(ck, ends, driver, timeout=180):
    """Wait until the checkpoint has committed a batch whose offsets reach ``ends`` ``{topic: {key: end}}``."""
    def done():
        assert driver.proc.poll() is None, driver.text()[-3000:]
        last, offsets, committed = checkpoint_state(ck)
        return offsets is not None and committed == last and all(
            offsets.get(t, {}).get(k, -1) >= e for t, parts in ends.items() for k, e in parts.items())
    wait_for(done, timeout, "the stream to catch up")


def ends_of(sent, topic):
    ends = {}
    for key, offset in sent:
        ends[key] = max(ends.get(key, 0), offset + 1)
    return {topic: ends}


def max_offset_request(topic, partition):
    """The text ``offset`` request for the end of ``partition`` of ``topic``."""
    return ev.Offset(topic, "g", partition, 2 ** 62, 1)
