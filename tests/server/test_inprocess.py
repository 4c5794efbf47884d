"""The text dispatcher, the put path and role changes in process: a real MessageStore in a temporary
directory, the real flusher, put path, roles and dispatcher, and a fake connection. No socket is opened."""

import gevent
import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser
from metaq.clock import now_ms
from tests.harness.store import server_config
from metaq.serving.connections import ConnectionCore, ConnectionLimits
from metaq.timers.scheduler import DelayScheduler
from metaq.server.flusher import Flusher
from metaq.serving.longpoll import PartitionWaiters
from metaq.serving.putpath import PutPath, WriteGate
from metaq.server.replication.roles import Roles, read_promoted
from metaq.server.stats import BrokerStats
from metaq.server.guard import Guard
from metaq.server.text.dispatch import TextDispatcher
from metaq.transactions.text import TextTransactions
from metaq.transactions.service import TxService
from metaq.storestate import open_store
from gevent.lock import Semaphore


config = server_config


class FakeConnection:
    """What a dispatcher uses of a connection: an id, ``send``, ``spawn`` (replies of greenlets), the reads of
    replies (with no reply budget), the count of parked gets and its zero-copy sender (None: gets gathered into
    buffers, which the fake joins)."""

    zero_copy = None
    session = None  # the connection core's Session; authentication is off here

    def __init__(self, conn_id=1):
        self.conn_id = conn_id
        self.sent = []
        self.children = []
        self.closed = False
        self.parked = 0

    def send(self, data):
        if data:
            self.sent.append(b"".join(bytes(b) for b in data) if isinstance(data, list) else data)

    def read_reply(self, max_size, read):
        return read()

    def spawn(self, func, *args, on_exit=None):
        def run():
            try:
                self.send(func(*args))
            finally:
                if on_exit is not None:
                    on_exit()
        self.children.append(gevent.spawn(run))

    def join(self):
        gevent.joinall(self.children, timeout=10)


def parse(reply):
    """One wire reply (bytes or a list of buffers) as a Result/Value event."""
    if isinstance(reply, list):
        reply = b"".join(bytes(b) for b in reply)
    parser = TextParser()
    parser.receive_data(reply)
    event = parser.next_event()
    assert event is not NEED_DATA
    return event


class Parts:
    """The broker's pieces wired as ``Broker`` wires them, minus the listeners."""

    def __init__(self, cfg):
        self.config = cfg
        self.store = open_store(cfg.store_config(), now_ms())
        self.stats = BrokerStats()
        self.waiters = PartitionWaiters()
        self.gate = WriteGate()
        self.store_lock = Semaphore()  # checkpoints vs a cut, as the broker's
        self.flusher = Flusher(self.store, self.store.config, self.waiters.notify, lambda: None, self.store_lock)
        self.core = ConnectionCore(10, ConnectionLimits(60, 60))
        self.roles = Roles(cfg, self.store, self.core, self.flusher, self.waiters, self.store_lock)
        self.tx = TxService(self.store, cfg, self.flusher, self.waiters, self.stats)
        self.delay = DelayScheduler(self.store, cfg, self.flusher, self.waiters, self.gate,
                                    is_master=self.roles.slave_link is None)
        self.roles.on_change(self.delay.role_changed)
        self.path = PutPath(self.store, self.stats, self.flusher, self.waiters, self.roles, self.gate, self.delay,
                            sync_flush=cfg.store.flush == "sync")
        guard = Guard(cfg.security)
        self.dispatcher = TextDispatcher(self.store, self.stats, self.path, TextTransactions(self.tx, guard),
                                         self.roles, self.waiters, cfg,
                                         lambda item, may_see=None: b"STATS\r\nitem %s\r\nEND\r\n" % item.encode(),
                                         guard)
        self.flusher.start()

    def call(self, event, conn):
        """Dispatch one event; a reply held for the flush is sent once the log is durable up to its position."""
        handler = self.dispatcher.put if type(event) is ev.Put else self.dispatcher.handle
        reply, pos = handler(event, conn)
        if pos:
            self.flusher.wait_flushed(pos)
        return None if reply is None else parse(reply)

    def close(self):
        self.delay.stop()
        self.tx.stop()
        self.flusher.stop()
        self.store.close(now_ms())


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    yield p
    p.close()


def put(topic, partition, body, opaque):
    return ev.Put(topic, partition, 0, body, opaque, metaq_checksum(body))


def test_put_is_acknowledged_after_its_flush_and_read_back(parts):
    conn = FakeConnection()
    handler_reply, pos = parts.dispatcher.put(put("orders", 1, b"hello", 5), conn)
    assert pos > 0 and parts.store.flushed_position < pos  # sync mode: the ack waits for this flush position
    parts.flusher.wait_flushed(pos)
    r = parse(handler_reply)
    assert (r.code, r.opaque) == (200, 5)
    _msg_id, partition, offset = r.body.split()
    assert (partition, offset) == (b"1", b"0")
    got = parts.call(ev.Get("orders", "g", 1, 0, 1 << 16, 6), conn)
    assert type(got) is ev.Value and got.opaque == 6 and got.body.endswith(b"hello")
    assert parts.stats.cmd_put == 1


def test_a_bad_checksum_is_refused_and_nothing_is_stored(parts):
    conn = FakeConnection()
    r = parts.call(ev.Put("orders", 0, 0, b"hello", 9, 12345), conn)
    assert r.code == 400 and b"Checksum failure" in r.body and r.opaque == 9
    assert parts.store.max_offset("orders", 0) == 0


def test_a_refused_disk_refuses_puts_until_the_gate_reopens(parts):
    conn = FakeConnection()
    parts.gate.disk_full("disk usage 97% is above the danger mark")
    r = parts.call(put("orders", 0, b"x", 1), conn)
    assert r.code == 507 and b"danger mark" in r.body  # DiskFull: its own documented code
    assert parts.store.max_offset("orders", 0) == 0
    parts.gate.refresh()  # the next disk check: no disk state, no flush failure
    assert parts.call(put("orders", 0, b"x", 2), conn).code == 200
    assert parts.store.max_offset("orders", 0) == 1


def test_a_long_poll_is_answered_by_the_next_put(parts):
    waiting, producer = FakeConnection(1), FakeConnection(2)
    reply, pos = parts.dispatcher.handle(ev.Get("orders", "g", 0, 0, 1 << 16, 3, max_wait_ms=5000), waiting)
    assert reply is None and pos == 0 and waiting.children  # parked on its own greenlet
    gevent.sleep(0.05)
    assert waiting.sent == []
    assert parts.call(put("orders", 0, b"wake up", 4), producer).code == 200
    waiting.join()
    r = parse(waiting.sent[0])
    assert type(r) is ev.Value and r.opaque == 3 and r.body.endswith(b"wake up")


def test_a_parked_poll_answers_404_when_the_waiters_close(parts):
    conn = FakeConnection()
    parts.dispatcher.handle(ev.Get("orders", "g", 0, 0, 1 << 16, 8, max_wait_ms=60000), conn)
    gevent.sleep(0.05)
    parts.waiters.close()  # the broker stops
    conn.join()
    assert parse(conn.sent[0]).code == 404


def test_stats_and_version_go_through_their_collaborators(parts):
    conn = FakeConnection()
    assert parts.call(ev.Stats("topics", 1), conn).body == b"STATS\r\nitem topics\r\nEND\r\n"
    assert parts.call(ev.Version(2), conn).code == 200


def test_a_slave_refuses_puts_and_a_forced_promotion_makes_it_a_master(tmp_path):
    cfg = config(tmp_path / "data", replication={"role": "slave", "slave_of": "127.0.0.1:1", "slave_id": 1})
    p = Parts(cfg)
    try:
        conn = FakeConnection()
        assert p.roles.role == "slave" and p.roles.slave_link is not None
        r = p.call(put("orders", 0, b"x", 1), conn)
        assert r.code == 503 and b"replication slave of 127.0.0.1:1" in r.body
        assert not p.delay.enabled  # a slave does not deliver delayed messages
        refused = p.call(ev.Promote(False, 2), conn)  # never heard from its master: not caught up
        assert refused is None
        conn.join()
        r = parse(conn.sent.pop())
        assert r.code == 503 and b"not caught up" in r.body and p.roles.role == "slave"
        assert p.call(ev.Promote(True, 3), conn) is None
        conn.join()
        r = parse(conn.sent.pop())
        assert r.code == 200 and b"promoted: broker 7 is now the master" in r.body and b"FORCED" in r.body
        assert p.roles.role == "master" and p.roles.slave_link is None
        assert read_promoted(p.store)["former_master"] == "127.0.0.1:1"
        assert p.delay.enabled  # the role change reached the delay scheduler
        r = p.call(put("orders", 0, b"after", 4), conn)
        assert r.code == 200 and p.store.max_offset("orders", 0) == 1
    finally:
        p.close()


def test_the_async_put_path_makes_a_put_visible_at_once(tmp_path):
    p = Parts(config(tmp_path / "data", flush="async"))
    try:
        conn = FakeConnection()
        reply, pos = p.dispatcher.put(put("orders", 0, b"now", 1), conn)
        assert pos == 0 and parse(reply).code == 200
        assert p.call(ev.Get("orders", "g", 0, 0, 1 << 16, 2), conn).body.endswith(b"now")
    finally:
        p.close()


def test_stats_transactions_lists_a_decision_by_hand(parts):
    """A heuristic outcome has no begin time: ``stats transactions`` shows ``begun_ms -`` (it answered 500)."""
    from metaq.protocol import stats as codec
    from metaq.server.stats import transaction_rows
    from tests.harness.tx import xid

    manager, x = parts.tx.manager, xid(1)
    manager.begin(x, None, 0, now_ms())
    manager.put(x, None, "orders", 0, 0, b"decided", metaq_checksum(b"decided"), now_ms())
    manager.prepare(x, None, now_ms())
    parts.tx.complete_commit(parts.tx.decided_by_hand(x.key, True))
    (info,) = manager.in_doubt()
    body = codec.encode_transactions(transaction_rows([info]))
    assert body == (b"STATS\r\n%s heuristic-commit puts 0 bytes 0 begun_ms - prepared_ms %d timeout_s 0\r\nEND\r\n"
                    % (x.key.encode(), info.prepared_ms))  # prepared_ms: when it was decided
    (row,) = codec.parse_transactions(body)
    assert (row.key, row.state, row.begun_ms) == (x.key, "heuristic-commit", None)


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_put_acknowledged_later_than_its_write_is_refused_when_the_log_was_cut_below_it_meanwhile(tmp_path, flush):
    """A put's acknowledgement may wait in another greenlet than its write (a queued burst, a sync-replication wait,
    an MQTT acknowledgement writer): given the log's truncations read at the write (``since``), a cut before its end
    in between refuses it (503, written, not acknowledged) even when the log grew past its position again; a put
    below the cut is acknowledged. With either flush mode (``async``: the check after the replication wait)."""
    from metaq.errors import Unavailable

    p = Parts(config(tmp_path / "data", flush=flush))
    try:
        now = now_ms()
        kept = p.path.append("orders", 0, 0, b"kept", now)
        gone = p.path.append("orders", 0, 0, b"the deposed master's", now)
        cuts = p.store.log_cuts
        with p.store_lock:  # no checkpoint meanwhile, as the slave link's cut
            p.store.truncate_log(kept.log_end, now)
        while p.store.written_position <= gone.log_end:
            p.store.put("orders", 0, 0, b"the new master's", now)
        with pytest.raises(Unavailable, match="cut back before position %d" % gone.log_end):
            p.path.durable("orders", gone.partition, gone.log_end, now, cuts)
        p.path.durable("orders", kept.partition, kept.log_end, now, cuts)
    finally:
        p.close()


def test_a_delayed_message_delivered_in_a_cut_tail_is_delivered_again_once_the_broker_leads_again(tmp_path):
    """A master delivers a due delayed message and saves its offsets; deposed, its tail (the delivery) is cut by
    the epoch handshake, the schedule entry itself being in the new master's history. Led again before that master
    delivered it, it must deliver it, once: its saved offsets counted a delivery its log no longer holds."""
    import time

    p = Parts(config(tmp_path / "data", delay={"levels": "1s"}))
    try:
        p.delay.start()
        p.path.append("orders", 0, 0, b"later", now_ms(), delay_level=1)
        agreed = p.store.written_position  # the entry: the new master has it
        deadline = time.monotonic() + 10
        while p.store.max_offset("orders", 0) < 1:
            assert time.monotonic() < deadline, "not delivered"
            gevent.sleep(0.05)
        p.delay.role_changed(1)  # deposed: the scheduler stops and saves its offsets (the entry delivered)
        with p.store_lock:  # no checkpoint meanwhile, as the slave link's cut
            report = p.store.truncate_log(agreed, now_ms())
        p.delay.log_cut(report)  # what the slave link's handshake tells its listeners (Roles.on_cut)
        assert p.store.max_offset("orders", 0) == 0  # the delivery went with the cut tail
        p.delay.role_changed(None)  # leads again
        deadline = time.monotonic() + 10
        while p.store.max_offset("orders", 0) < 1:
            assert time.monotonic() < deadline, "the delayed message was never delivered again"
            gevent.sleep(0.05)
        gevent.sleep(0.3)
        assert p.store.max_offset("orders", 0) == 1  # once
    finally:
        p.close()


def test_the_write_paths_objects_call_their_methods_by_name(tmp_path):
    """Every call on the write path names what runs: no object of it as the broker wires it (the store, the
    waiters, the put path and its writes) holds an instance attribute in place of a method of its class. One whose
    module runs compiled with its class declared (a C struct, ``.pxd``) has no instance dict to hold one."""
    p = Parts(config(tmp_path / "data", flush="async"))
    try:
        for obj in (p.store, p.waiters, p.path, p.path.writes):
            shadowed = [name for name in getattr(obj, "__dict__", ()) if callable(getattr(type(obj), name, None))]
            assert shadowed == [], type(obj).__name__
    finally:
        p.close()
