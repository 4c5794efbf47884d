"""POP at a deposition, in process: a real store, roles, put path and ``PopService``, no socket. The acknowledgements
of a loop turn are written at the turn's end (``AckBatch``): a broker deposed within that turn must not write them
into its log (no longer a master's) nor answer them done."""

import gevent
from gevent.lock import Semaphore

from metaq import errors
from metaq.pop.service import PopService
from metaq.protocol.journaltopic import POP_TOPIC
from metaq.clock import now_ms
from tests.harness.store import server_config
from metaq.serving.connections import ConnectionCore, ConnectionLimits
from metaq.server.flusher import Flusher
from metaq.serving.longpoll import PartitionWaiters
from metaq.serving.putpath import PutPath, WriteGate
from metaq.server.replication.roles import Roles
from metaq.server.stats import BrokerStats
from metaq.storestate import open_store

G, T = "workers", "orders"


class Broker:
    """A master's store, roles, put path and POP service wired as ``Broker`` wires them, minus the listeners."""

    def __init__(self, data_dir):
        cfg = server_config(data_dir, flush="async", partitions=1)
        self.store = open_store(cfg.store_config(), now_ms())
        waiters, gate = PartitionWaiters(), WriteGate()
        flusher = Flusher(self.store, self.store.config, waiters.notify, lambda: None)
        self.roles = Roles(cfg, self.store, ConnectionCore(10, ConnectionLimits(60, 60)), flusher, waiters,
                           Semaphore())
        self.path = PutPath(self.store, BrokerStats(), flusher, waiters, self.roles, gate)
        gate.on_change = self.path.changed
        self.roles.on_change(self.path.changed)
        self.pop = PopService(self.store, self.path)
        self.roles.on_change(self.pop.role_changed)

    def depose(self):
        """What the election or a rejoin does: this broker becomes a slave of another master (its link not started:
        the epoch handshake that would cut the tail is the test's to make)."""
        self.roles.set_role("slave", self.roles.make_slave_link("127.0.0.1:1", 1))

    def close(self):
        self.store.close(now_ms())


def test_an_ack_whose_turn_ends_after_a_deposition_is_refused_and_not_written(tmp_path):
    b = Broker(tmp_path)
    try:
        b.store.put(T, 0, 0, b"job", now_ms())
        [got] = b.pop.receive(G, T, 1, 60_000)
        agreed = b.store.written_position  # the new master's log holds the delivery, nothing after it
        acker = gevent.spawn(b.pop.ack, G, T, [got.handle])  # runs first: checked writable, its record pending
        deposer = gevent.spawn(b.depose)  # deposed before the turn's end writes the record
        gevent.joinall([acker, deposer], timeout=5, raise_error=False)
        assert deposer.successful()
        assert isinstance(acker.exception, errors.Unavailable), acker.value  # not answered done
        assert b.store.written_position == agreed  # nothing written into a slave's log
        assert b.store.max_offset(POP_TOPIC, 0) == 1  # the delivery record alone
        # the state is the log's: the message is still in flight (it comes back to the group when its time is up)
        [(group, state, _flight)] = b.pop.state.message_states(T, 0, got.offset)
        assert (group, state) == (G, "in_flight")
    finally:
        b.close()


def test_acks_refused_while_leading_are_undone_at_the_deposition(tmp_path):
    """A turn's acks refused at its end on a broker still master (its disk full since they were made) stay applied
    while it leads; deposed, its state is the log's again: the message is in flight, as the new master has it."""
    b = Broker(tmp_path)
    try:
        b.store.put(T, 0, 0, b"job", now_ms())
        [got] = b.pop.receive(G, T, 1, 60_000)
        acker = gevent.spawn(b.pop.ack, G, T, [got.handle])
        filler = gevent.spawn(b.path.gate.disk_full, "the disk is full")  # refuses writes before the turn's end
        gevent.joinall([acker, filler], timeout=5, raise_error=False)
        assert isinstance(acker.exception, errors.DiskFull), acker.value
        assert b.store.max_offset(POP_TOPIC, 0) == 1
        [(_group, state, _flight)] = b.pop.state.message_states(T, 0, got.offset)
        assert state == "done"  # applied when made: a receive of the same turn saw it done
        b.depose()
        [(_group, state, _flight)] = b.pop.state.message_states(T, 0, got.offset)
        assert state == "in_flight"
    finally:
        b.close()


def test_an_ack_in_a_turn_without_a_deposition_is_written_and_answered(tmp_path):
    b = Broker(tmp_path)
    try:
        b.store.put(T, 0, 0, b"job", now_ms())
        [got] = b.pop.receive(G, T, 1, 60_000)
        before = b.store.written_position
        assert b.pop.ack(G, T, [got.handle]) == [None]
        assert b.store.written_position > before
        [(_group, state, _flight)] = b.pop.state.message_states(T, 0, got.offset)
        assert state == "done"
    finally:
        b.close()
