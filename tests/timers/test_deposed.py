"""Delay levels at a deposition, in process: a real store, flusher and ``DelayScheduler``, no socket. The epoch
handshake's cut may land while the deposition's ``stop`` still saves the offsets; offsets that count a delivery the
cut took must not be written after the cut listener dropped the file, or the broker, leading again, never delivers
that message."""

import time

import gevent
from gevent.lock import Semaphore

from metaq.clock import now_ms
from tests.harness.store import server_config
from metaq.server.flusher import Flusher
from metaq.serving.longpoll import PartitionWaiters
from metaq.serving.putpath import WriteGate
from metaq.storestate import open_store
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.timers.scheduler import STATE_MAGIC, DelayScheduler

T = "orders"


class Broker:
    def __init__(self, data_dir):
        cfg = server_config(data_dir, flush="async", partitions=1, delay={"levels": "1s"})
        self.store = open_store(cfg.store_config(), now_ms())
        waiters = PartitionWaiters()
        self.lock = Semaphore()  # the broker's store lock: no checkpoint while the handshake cuts
        self.flusher = Flusher(self.store, self.store.config, waiters.notify, lambda: None, self.lock)
        self.flusher.start()
        self.delay = DelayScheduler(self.store, cfg, self.flusher, waiters, WriteGate(), is_master=True)

    def wait_delivered(self, what):
        deadline = time.monotonic() + 10
        while self.store.max_offset(T, 0) < 1:
            assert time.monotonic() < deadline, what
            gevent.sleep(0.05)

    def close(self):
        self.delay.stop()
        self.flusher.stop()
        self.store.close(now_ms())


def saved_offsets(b):
    state = b.store.dirs.read_state(b.store.dirs.delay_offsets, STATE_MAGIC)
    return state["offsets"] if state else None


def test_a_cut_during_the_depositions_stop_leaves_no_offsets_that_count_the_cut_delivery(tmp_path):
    b = Broker(tmp_path)
    try:
        b.delay.start()
        b.delay.put_delayed(T, 0, 0, b"later", 1, now_ms())
        agreed = b.store.written_position  # the entry: the new master has it, not its delivery
        b.wait_delivered("not delivered")
        deadline = time.monotonic() + 10
        while saved_offsets(b) != {"0": 1}:  # saved by the save loop after the delivery, past ``agreed``
            assert time.monotonic() < deadline, "the offsets were not saved"
            gevent.sleep(0.05)

        def handshake():  # the slave link's epoch handshake, while the deposition's stop has not finished
            with b.lock:
                report = b.store.truncate_log(agreed, now_ms())
            b.delay.log_cut(report)

        deposed = gevent.spawn(b.delay.role_changed, 1)  # stop() yields: joins its levels, saves
        cut = gevent.spawn(handshake)
        gevent.joinall([deposed, cut], timeout=10, raise_error=True)
        assert b.store.max_offset(T, 0) == 0  # the delivery went with the cut tail
        assert b.store.max_offset(SCHEDULE_TOPIC, 0) == 1  # the entry stays
        b.delay.role_changed(None)  # leads again before any other master delivered it
        b.wait_delivered("the delayed message was never delivered again")
        gevent.sleep(0.3)
        assert b.store.max_offset(T, 0) == 1  # once
    finally:
        b.close()


def test_a_second_role_change_during_the_depositions_stop_keeps_the_saved_offsets(tmp_path):
    """ha: auto: the leadership greenlet deposes (``wait_for_master``) and the election greenlet follows the new
    master while that stop still yields: the second role change must not empty the levels whose offsets the stop
    saves, or the broker, leading again, delivers every retained delayed message a second time."""
    b = Broker(tmp_path)
    try:
        b.delay.start()
        b.delay.put_delayed(T, 0, 0, b"later", 1, now_ms())
        b.wait_delivered("not delivered")
        b.store.put("other", 0, 0, b"traffic", now_ms())  # the log moves on: the stop's save writes its position
        gevent.joinall([gevent.spawn(b.delay.role_changed, 1), gevent.spawn(b.delay.role_changed, 1)], timeout=10,
                       raise_error=True)
        assert saved_offsets(b) == {"0": 1}
        b.delay.role_changed(None)  # leads again, no cut: its log holds the delivery
        gevent.sleep(1.5)
        assert b.store.max_offset(T, 0) == 1  # not delivered again
    finally:
        b.close()
