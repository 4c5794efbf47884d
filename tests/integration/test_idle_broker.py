"""README "Operations", an idle broker: with nothing put, the periodic checkpoints rewrite no file (they fsynced
~4 times a second before, ``strace``); the first put after the quiet is checkpointed at the next interval."""

import os
import time

from metaq.client.raw import TextClient
from metaq.store.files import CHECKPOINT_FILE, CHECKPOINT_MAGIC, KEY_CHECKPOINT_FILE, KEY_CHECKPOINT_MAGIC, DataDir
from tests.harness.broker import wait_for

INTERVAL_S = 0.2  # small_config's checkpoint_interval_ms


def stamps(broker):
    out = {}
    for name in (CHECKPOINT_FILE, KEY_CHECKPOINT_FILE):
        st = os.stat(os.path.join(broker.data_dir, name))
        out[name] = (st.st_ino, st.st_mtime_ns)
    return out


def checkpointed(broker):
    """True when the log's and the key index's checkpoints both vouch for the whole log."""
    dirs = DataDir(broker.data_dir)
    with broker.client() as c:
        end = int(c.stats_dict()["log_end_position"])
    states = [dirs.read_state(dirs.checkpoint, CHECKPOINT_MAGIC),
              dirs.read_state(dirs.key_checkpoint, KEY_CHECKPOINT_MAGIC)]
    return all(state is not None and state["position"] == end for state in states)


def settled(broker, wait_s=10.0):
    """The stamps once the put before is checkpointed (a slow disk may take a while) and two checkpoint intervals
    went by without a change."""
    wait_for(lambda: checkpointed(broker), 30, "the put before the quiet checkpointed")
    deadline = time.monotonic() + wait_s
    last = stamps(broker)
    while time.monotonic() < deadline:
        time.sleep(2 * INTERVAL_S)
        now = stamps(broker)
        if now == last:
            return now
        last = now
    raise AssertionError("the checkpoint files kept changing with nothing put")


def test_an_idle_broker_rewrites_no_checkpoint_and_a_put_is_checkpointed_at_the_next_interval(broker):
    with TextClient("127.0.0.1", broker.port) as c:
        c.put_ok("test", b"before the quiet")
        quiet = settled(broker)
        time.sleep(10 * INTERVAL_S)  # ten periodic checkpoints
        assert stamps(broker) == quiet

        c.put_ok("test", b"after the quiet")
        deadline = time.monotonic() + 10.0
        while stamps(broker)[CHECKPOINT_FILE] == quiet[CHECKPOINT_FILE] and time.monotonic() < deadline:
            time.sleep(INTERVAL_S / 4)
        assert stamps(broker)[CHECKPOINT_FILE] != quiet[CHECKPOINT_FILE]
