"""The load of a history-checked run (issue 17 point 5): producers and a consumer group of the real client
library in ZooKeeper mode, every acknowledgement, failure and delivery recorded into a ``History``
(tests/harness/history.py); and the brokers' logs read back for ``check``.

``Workload(history, zk_connect, topic)``: ``producers`` threads, each with its own ``metaq.client.Producer``,
send unique msg_ids (``<name>-<seq>``) as bodies, one at a time (``send`` returns once the producer's own
retries are over: the SendResult's partition/offset is the acknowledged position, a failure is recorded
with its error), and ``consumers`` members of one group (``metaq.client.Consumer``) record every delivery.
``start()`` starts the producers, waits for a first acknowledgement (so the topic exists in ZooKeeper),
then the consumers; ``stop_producers()``; ``wait_delivered()``; ``close()``. ``offset_store="broker"`` keeps the
group's offsets in the brokers (``read_offsets`` reads each member's table back).

Positions are ``(topic, partition, offset)`` within one broker id (a master and its slaves): a run checks
one broker id group; an acknowledgement from another broker id is recorded as a failure saying so.

``read_logs({name: BrokerProcess}, topics)`` reads every partition of each broker from offset 0 into
``{name: {(topic, partition, offset): msg_id}}``; ``read_lag(master, slave)`` reads the message lag and
the time of the reading, to record with a fault.
"""

import os
import threading
import time

from metaq.client import Consumer, Message, Producer
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.message import decode_payload, iter_records
from tests.harness.history import Ack, Fail

__all__ = ["Workload", "read_logs", "read_lag", "read_offsets"]

#: A producer thread sends at most this many messages (a run that forgets to stop ends anyway).
MAX_MESSAGES_PER_PRODUCER = 200_000
#: A workload has at most this many producers and consumers each.
MAX_CLIENTS = 32
#: read_logs follows at most this many 301 replies per partition.
MAX_MOVES = 8


class Workload:
    """Producers and a consumer group over ZooKeeper recording into ``history``; see the module docstring."""

    def __init__(self, history, zk_connect, topic, producers=3, consumers=1, group="g-history", workdir=None,
                 broker_id=None, pace_s=0.0, send_timeout=2.0, retry_deadline=15.0, zk_session_timeout=4.0,
                 max_messages=MAX_MESSAGES_PER_PRODUCER, offset_store=None):
        for name, value in (("producers", producers), ("consumers", consumers)):
            if not isinstance(value, int) or not 0 <= value <= MAX_CLIENTS:
                raise ValueError("%s must be an int in 0..%d, got %r" % (name, MAX_CLIENTS, value))
        if not isinstance(pace_s, (int, float)) or pace_s < 0:
            raise ValueError("pace_s must be a number of seconds >= 0, got %r" % (pace_s,))
        if not isinstance(max_messages, int) or not 0 < max_messages <= MAX_MESSAGES_PER_PRODUCER:
            raise ValueError("max_messages must be in 1..%d, got %r" % (MAX_MESSAGES_PER_PRODUCER, max_messages))
        self.history, self.zk_connect, self.topic, self.group = history, zk_connect, topic, group
        self.n_producers, self.n_consumers = producers, consumers
        self.workdir = str(workdir) if workdir is not None else None
        self.broker_id, self.pace_s = broker_id, pace_s
        self.send_timeout, self.retry_deadline = send_timeout, retry_deadline
        self.zk_session_timeout, self.max_messages = zk_session_timeout, max_messages
        self.offset_store = offset_store  # the consumers' (None: the client's default, ZooKeeper)
        self.errors = []  # exceptions that ended a producer thread or a consumer's start/close
        self.consumers = []
        self._stop = threading.Event()
        self._threads = []

    # -- running ------------------------------------------------------------------------------

    def start(self, first_ack_timeout=30.0):
        """Producers first; consumers once the topic has an acknowledged message (it is in ZooKeeper then)."""
        for i in range(self.n_producers):
            t = threading.Thread(target=self._produce, args=("p%d" % (i + 1),), name="history-p%d" % (i + 1),
                                 daemon=True)
            self._threads.append(t)
            t.start()
        if self.n_consumers:
            self.wait_acks(1, first_ack_timeout)
            self.start_consumers()
        return self

    def start_consumers(self):
        for i in range(self.n_consumers):
            name = "c%d" % (i + 1)
            recover = os.path.join(self.workdir, "recover-" + name) if self.workdir else None
            consumer = Consumer(self.group, zk_connect=self.zk_connect, consumer_id=name, long_poll_ms=300,
                                commit_interval=0.5, session_timeout=self.zk_session_timeout,
                                recover_dir=recover, recover_interval=1.0, offset_store=self.offset_store)
            consumer.subscribe(self.topic, self._handler(name))
            consumer.start()
            self.consumers.append(consumer)

    def _handler(self, name):
        history = self.history

        def handle(message):
            history.deliver(name, message.topic, message.partition.partition, message.offset,
                            message.body.decode("utf-8", "replace") or "<empty body>", time.monotonic())
        return handle

    def _produce(self, name):
        try:
            producer = Producer(zk_connect=self.zk_connect, send_timeout=self.send_timeout,
                                retry_deadline=self.retry_deadline, zk_session_timeout=self.zk_session_timeout)
        except Exception as exc:
            self.errors.append("%s: no producer: %r" % (name, exc))
            return
        try:
            seq = 0
            while not self._stop.is_set() and seq < self.max_messages:
                msg_id = "%s-%07d" % (name, seq)
                seq += 1
                result = producer.send(Message(self.topic, msg_id.encode()))
                t = time.monotonic()
                if not result.success:
                    self.history.fail(name, msg_id, t, "%s: %s" % (type(result.error).__name__, result.error))
                elif self.broker_id is not None and result.partition.broker_id != self.broker_id:
                    self.history.fail(name, msg_id, t, "acknowledged by broker id %d at %s-%d@%d, not %d" % (
                        result.partition.broker_id, self.topic, result.partition.partition, result.offset,
                        self.broker_id))
                else:
                    self.history.ack(name, self.topic, result.partition.partition, result.offset, msg_id, t)
                if self.pace_s:
                    self._stop.wait(self.pace_s)
        except Exception as exc:
            self.errors.append("%s: %r" % (name, exc))
        finally:
            producer.close()

    def stop_producers(self, timeout=None):
        """Stop sending; each producer finishes the send in progress (its retries included) and closes."""
        self._stop.set()
        limit = timeout if timeout is not None else self.retry_deadline + self.send_timeout + 10.0
        deadline = time.monotonic() + limit
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise AssertionError("producers still sending after %.0f s: %s" % (limit, ", ".join(alive)))
        return time.monotonic()

    def wait_delivered(self, timeout=60.0, quiet=None):
        """Wait until every acknowledged msg_id was delivered, or ``quiet`` s pass with no new delivery (default:
        the whole ``timeout``). Returns the acknowledged msg_ids not delivered (the checker says which matter)."""
        deadline = time.monotonic() + timeout
        seen, since = -1, time.monotonic()
        while True:
            deliveries = self.history.delivered_ids()
            missing = self.history.acked_ids() - deliveries
            now = time.monotonic()
            if not missing or now >= deadline or (quiet is not None and now - since >= quiet):
                return missing
            if len(deliveries) != seen:
                seen, since = len(deliveries), now
            time.sleep(0.1)

    def close(self):
        """Stop the producers (if still running) and close the consumers (they commit and leave the group);
        what went wrong is in ``errors``."""
        try:
            self.stop_producers()
        except AssertionError as exc:
            self.errors.append(str(exc))
        for consumer in self.consumers:
            try:
                consumer.close()
            except Exception as exc:
                self.errors.append("consumer close: %r" % (exc,))
        self.consumers = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- reading the history as it grows -------------------------------------------------------

    def acks(self, since=None):
        """How many acknowledgements were recorded (after monotonic time ``since``)."""
        return sum(1 for e in self.history.events(Ack) if since is None or e.t > since)

    def wait_acks(self, n, timeout=30.0, since=None):
        """Wait for ``n`` acknowledgements (after ``since``); AssertionError with the last failures otherwise."""
        deadline = time.monotonic() + timeout
        while self.acks(since) < n:
            if time.monotonic() >= deadline:
                raise AssertionError("not %d acknowledgements within %.0f s (got %d; last failures: %s; errors: %s)"
                                     % (n, timeout, self.acks(since), self.history.events(Fail)[-3:], self.errors))
            time.sleep(0.05)


# -- reading brokers ---------------------------------------------------------------------------------------------

def _stats(broker):
    with broker.client() as c:
        return c.stats_dict()


def read_lag(master, slave):
    """``(lag_messages, lag_t)``: the master's message count less the slave's, and the time just before the
    master's count was read (everything acknowledged before ``lag_t`` is in that count; the slave holds a
    prefix of the master's log, so at most ``lag_messages`` of those can be missing on it)."""
    on_slave = int(_stats(slave)["total_messages"])
    lag_t = time.monotonic()
    on_master = int(_stats(master)["total_messages"])
    return max(0, on_master - on_slave), lag_t


def read_partition(client, topic, partition):
    """``{(topic, partition, offset): msg_id}`` of one partition, from offset 0 (301s followed) to its end."""
    out, offset, moves = {}, 0, 0
    while True:
        r = client.get(topic, partition, offset, 1 << 20)
        if isinstance(r, ev.Result):
            if r.code == 404:
                return out
            if r.code == 301 and moves < MAX_MOVES:
                moves += 1
                offset = int(r.body)
                continue
            raise AssertionError("get %s-%d@%d: %s" % (topic, partition, offset, r))
        records = [rec for rec, _end in iter_records(r.body)]
        if not records:
            raise AssertionError("get %s-%d@%d: a reply with no whole record" % (topic, partition, offset))
        for rec in records:
            _attribute, body = decode_payload(rec.flag, rec.data)
            out[(topic, partition, offset)] = bytes(body).decode("utf-8", "replace") or "<empty body>"
            offset += 1


def read_logs(brokers, topics=None):
    """``{name: {(topic, partition, offset): msg_id}}`` of each running broker in ``{name: BrokerProcess}``, every
    partition its ``stats offsets`` lists (only ``topics`` when given) read from offset 0."""
    logs = {}
    for name, broker in brokers.items():
        log = {}
        with broker.client() as c:
            rows = stats_codec.parse_offsets(c.stats("offsets").encode())
            for row in rows:
                if topics is None or row.topic in topics:
                    log.update(read_partition(c, row.topic, row.partition))
        logs[name] = log
    return logs


def read_offsets(broker, topics=None):
    """``{(group, topic, partition): committed offset}`` of one broker's offset table (``stats groups``), only
    ``topics`` when given."""
    with broker.client() as c:
        rows = stats_codec.parse("groups", c.stats("groups").encode())
    return {(r.group, r.topic, r.partition): r.offset for r in rows if topics is None or r.topic in topics}
