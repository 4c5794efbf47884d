"""The slave's side of replication: follow a master, cut a divergent tail, append, flush, ack; hold its
committed consumer offsets (OFFSETS frames: the whole table once per link, then what changed)."""

import json
import logging
import socket
import time

import gevent

from metaq import errors
from metaq.protocol import replication as rp
from metaq.protocol.replication_topics import GROUPS_KEY, OWNERS_KEY
from metaq.clock import now_ms
from metaq.serving.putpath import BrokerWrites
from metaq.serving.replication.link import (BACKOFF_MAX_S, BACKOFF_MIN_S, CAUGHT_UP_SILENCE_S, LINK_TIMEOUT_S,
                                           authenticate, next_event, send_event)
from metaq.serving.tls import client_context
from metaq.store.replica import ReplicationRefused

log = logging.getLogger(__name__)


class SlaveLink:
    """The slave's side: keep one link to the master, agree on where the logs agree, copy its log, ACK."""

    def __init__(self, store, config, flusher, waiters, store_lock, master=None, slave_id=None,
                 on_handshake=None, on_new_topics=None, secret=None, on_cut=None, on_disk_full=None):
        """``on_handshake()``: called after each epoch handshake; ``on_cut(report)``: after a handshake cut our
        tail (``store.replica.TruncateReport``); ``on_disk_full()``: a copied chunk met a full disk (the broker's
        retention runs at once: docs/operating.md "Disk"); ``on_new_topics(topics)``: when copied
        records bring topics this broker did not know (ZooKeeper registration); ``secret``: the replication
        secret (bytes) the master must prove and this slave proves, or None (``handshake``)."""
        self.store = store
        self.writes = BrokerWrites(store)  # the master's records appended as they are
        self.secret = secret
        self.config = config
        self.flusher = flusher
        self.waiters = waiters
        self.store_lock = store_lock
        self.on_handshake = on_handshake
        self.on_new_topics = on_new_topics
        self.on_cut = on_cut
        self.on_disk_full = on_disk_full
        self.disk_full = None  # why the last copy met a full disk (DiskFull), until a copy succeeds or none is due
        rcfg = config.replication
        self.master = master or rcfg.slave_of
        host, _sep, port = self.master.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.slave_id = slave_id if slave_id is not None else rcfg.slave_id
        self.sync_flush = config.store.flush == "sync"
        self.connected = False
        self.master_end = None  # the master's replicable end, last heard
        self.master_written = None  # its written end, last heard (what "caught up" means)
        self.master_count = None  # messages in its log up to that end
        self.heard_at = None  # monotonic time the master last said anything (EPOCHS, DATA, HEARTBEAT)
        self.lost_at = None  # monotonic time the link last went down
        self.last_error = None
        self.connects = 0
        self.handshakes = 0
        self.cut_bytes = 0
        self.pending_epochs = []  # the master's entries past our end: recorded as our copy reaches them
        self.offsets_synced = False  # this link brought the master's whole consumer-offset table
        self._offsets_table = None  # the master's table while its SNAPSHOT frames arrive: key -> entry
        self._pool = gevent.get_hub().threadpool
        self._sock = None
        tls = config.security.tls  # TLS to the master (a bad certificate file stops the start here)
        self._tls = client_context(tls) if tls.mode != "off" and tls.replication else None
        self._greenlet = None
        self._stopping = False

    @property
    def lag_bytes(self):
        """The master's written end (last heard) minus ours; -1 before the first contact."""
        if self.master_written is None:
            return -1
        return max(0, self.master_written - self.store.written_position)

    @property
    def lag_messages(self):
        """Messages the master had (last heard) that we do not; -1 before the first contact."""
        if self.master_count is None:
            return -1
        return max(0, self.master_count - self.store.appended_messages())

    def caught_up(self):
        """Our log holds the master's end as last heard, and that end is the master's last: the master spoke
        within CAUGHT_UP_SILENCE_S of now (link up) or of the link's end. A link that went silent before it dropped
        (cut, blackholed) leaves a master that may have gone on acknowledging puts this slave never heard of."""
        if self.master_written is None or self.store.written_position < self.master_written or self.heard_at is None:
            return False
        until = time.monotonic() if self.connected else (self.lost_at or self.heard_at)
        return until - self.heard_at <= CAUGHT_UP_SILENCE_S

    def silence_s(self):
        """Seconds the master was silent before the link went down (or until now while it is up); None: never heard."""
        if self.heard_at is None:
            return None
        return (time.monotonic() if self.connected else (self.lost_at or self.heard_at)) - self.heard_at

    def start(self):
        self._greenlet = gevent.spawn(self._run)

    def resume(self):
        """Dial the master again after ``stop`` (a promotion refused after it stopped the link): what was heard of
        the master is kept, so ``caught_up`` still says what it said."""
        self._stopping = False
        self.start()

    def stop(self):
        self._stopping = True
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=2.0)

    def _run(self):
        delay = BACKOFF_MIN_S
        while not self._stopping:
            started = time.monotonic()
            try:
                self._session()
            except errors.Unauthenticated as exc:  # either side's proof: nothing of the master's was used
                self.last_error = str(exc)
                log.warning("replication: not following master %s: %s; retrying in %.1f s", self.master, exc, delay)
            except (OSError, errors.MetaqError) as exc:
                self.last_error = str(exc)
                if self.connected:
                    log.warning("replication link to master %s lost: %s; reconnecting", self.master, exc)
                else:
                    log.info("replication: cannot reach master %s: %s; retrying in %.1f s", self.master, exc, delay)
            finally:
                if self.connected:
                    self.lost_at = time.monotonic()
                self.connected = False
                if self._sock is not None:
                    try:
                        self._sock.close()
                    except OSError:
                        pass
                    self._sock = None
            if self._stopping:
                return
            if time.monotonic() - started > 5.0:
                delay = BACKOFF_MIN_S
            gevent.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _session(self):
        sock = self._sock = socket.create_connection((self.host, self.port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(LINK_TIMEOUT_S)
        if self._tls is not None:  # the handshake checks the master's certificate against security.tls.ca
            sock = self._sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        parser = rp.ReplicationParser()
        self._handshake(self._authenticate(sock, parser))
        sock.settimeout(LINK_TIMEOUT_S)
        store = self.store
        self.offsets_synced, self._offsets_table = False, None
        self.connected = True
        self.connects += 1
        self.last_error = None
        log.info("replication link to master %s up: slave %d resuming from position %d (epoch %d)", self.master,
                 self.slave_id, store.written_position, store.epochs.epoch)
        while not self._stopping:
            event = self._next_event(sock, parser)
            self.heard_at = time.monotonic()
            if isinstance(event, rp.Data):
                self._append(sock, event)
            elif isinstance(event, rp.Offsets):
                self._offsets(event)
            elif isinstance(event, rp.Topics):
                self._topics(event)
            elif isinstance(event, rp.Heartbeat):
                self.master_end, self.master_written, self.master_count = event
                if store.written_position >= self.master_written:
                    self.disk_full = None  # nothing left to copy: no longer refused for lack of disk
                send_event(sock, rp.Ack(self.slave_id, store.written_position, store.flushed_position))
            elif isinstance(event, rp.ErrorFrame):  # e.g. a corrupt record the master will not ship
                raise errors.Unavailable("the master ended the link (%d): %s" % (event.code, event.text))
            else:
                raise errors.RemoteProtocolError("unexpected %s from the master" % type(event).__name__, fatal=True)

    def _authenticate(self, sock, parser):
        """The master's CHALLENGE, our PROOF and HELLO, its PROOF checked (``handshake``), all within
        HELLO_TIMEOUT_S; returns the event after its PROOF (the EPOCHS). Unauthenticated when either side
        refuses: nothing the master said has been acted on."""
        store, cfg = self.store, self.config
        hello = rp.Hello(self.slave_id, cfg.broker.id, cfg.store.segment_size, store.written_position,
                         tuple(store.epochs.entries))
        return authenticate(sock, parser, self.secret, self.slave_id, hello, self._next_event, "EPOCHS")

    def _next_event(self, sock, parser, deadline=None, waiting_for=None):
        """The next event; during the handshake (``deadline``, absolute) the wait for it ends there."""
        return next_event(sock, parser, deadline, waiting_for)

    def _handshake(self, event):
        """The master's EPOCHS: cut our log where the two agree, take its epoch history."""
        if not isinstance(event, rp.Epochs):
            raise errors.RemoteProtocolError("expected EPOCHS, got %s" % type(event).__name__, fatal=True)
        store = self.store
        end, agreed = store.written_position, event.agreed_position
        if agreed > end:
            raise errors.RemoteProtocolError("the master says our logs agree up to %d, past our end %d"
                                             % (agreed, end), fatal=True)
        if agreed < end:
            self._cut(agreed, event)
        self._check_units()
        self.pending_epochs = self._pool.apply(store.epochs.adopt, (event.epochs, agreed))
        self.master_written = max(self.master_written or 0, event.master_end)
        self.heard_at = time.monotonic()  # the master said its end (a master killed before its first heartbeat)
        self.handshakes += 1
        if self.on_handshake is not None and self.on_handshake():
            log.info("replication: epoch handshake with master %s done (log end %d, epoch %d): serving reads",
                     self.master, store.written_position, store.epochs.epoch)

    def _cut(self, position, event):
        store = self.store
        ours = list(store.epochs.entries)
        self.flusher.wait_flushed(store.written_position)  # no flush of the range in flight
        with self.store_lock:  # nor a checkpoint or a segment built ahead
            report = store.truncate_log(position, now_ms())
        self.cut_bytes += report.bytes
        per_partition = ", ".join("%s-%d: %d messages" % (t, p, n) for (t, p), (n, _b) in
                                  sorted(report.partitions.items())) or "no messages"
        log.warning("replication: epoch handshake with master %s: the logs agree up to position %d; CUT our tail "
                    "of %d bytes, %d messages (%s) that the master never had (our epochs %s, the master's %s)",
                    self.master, position, report.bytes, report.records, per_partition, ours, list(event.epochs))
        if self.on_cut is not None:
            self.on_cut(report)
        self.waiters.notify_all()

    def _check_units(self):
        """Before copying on: the index units at risk that do not name their records (a write lost, as a full disk
        or a crash may leave one) rebuilt from our log (store/unitcheck.py), so that neither this slave nor it
        promoted serves an intact record as corrupt. A worker thread; no checkpoint or work ahead meanwhile."""
        with self.store_lock:
            repaired = self._pool.apply(self.store.check_units)
        if repaired:
            log.warning("replication: %d index units did not name their records: rebuilt from our commit log",
                        repaired)

    def _append(self, sock, event):
        store = self.store
        before = len(store.known_topics()) if self.on_new_topics is not None else 0
        try:
            end = self.writes.replicated(event.position, event.data, now_ms(), self.config.store.segment_size)
        except ReplicationRefused as exc:
            log.error("replication: refused a chunk at position %d: %s", event.position, exc)
            raise
        except errors.DiskFull as exc:  # what was applied stays; the next link resumes from our end
            self.disk_full = str(exc)
            if self.on_disk_full is not None:
                self.on_disk_full()
            raise
        self.disk_full = None
        if self.master_end is None or end > self.master_end:
            self.master_end = end
        if self.master_written is None or end > self.master_written:
            self.master_written = end
        while self.pending_epochs and self.pending_epochs[0][1] <= end:
            entry = self.pending_epochs.pop(0)
            self._pool.apply(store.epochs.learn, (entry,))
            log.info("replication: our copy reached epoch %d of the master (from position %d)", entry[0], entry[1])
        if self.sync_flush:
            self.flusher.wait_flushed(end)
        else:
            self.waiters.notify_all()
            if store.should_flush(now_ms()):
                self.flusher.wake()
        if self.on_new_topics is not None and len(store.known_topics()) != before:
            self.on_new_topics(store.known_topics())
        send_event(sock, rp.Ack(self.slave_id, store.written_position, store.flushed_position))

    def _topics(self, event):
        """The master's topic table becomes ours (topics/state.py ``replace_table``), and its group settings
        (groups/table.py ``replace``: an empty table from a frame without them), then its topics' owners
        (none from a frame without them): our per-user topic counts, saved by the next checkpoint, are the
        master's, so a promoted slave holds each user to its ``topics`` and ``partitions`` quotas."""
        try:
            state = json.loads(event.table.decode("utf-8"))
            state.pop(OWNERS_KEY, None)  # the frame's, not the table's (the codec checked them)
            state.pop(GROUPS_KEY, None)
            with self.store_lock:  # a deleted topic's partitions go: no checkpoint or work ahead meets them
                self.store.topics.replace_table(state)
            self.store.groups.replace(event.groups)  # the master's group settings (groups/table.py)
        except (ValueError, TypeError, KeyError, AttributeError, errors.ClientError) as exc:
            raise errors.RemoteProtocolError("bad TOPICS from the master: %s" % exc, fatal=True) from None
        self.store.replace_topic_owners(event.owners)
        log.info("replication: the master's topic table (version %d, %d topics, %d owned) taken",
                 self.store.topics.table.version, len(self.store.topics.table.entries), len(event.owners))
        if self.on_new_topics is not None:
            self.on_new_topics(self.store.known_topics())

    def _offsets(self, event):
        """The master's committed consumer offsets: its whole table replaces ours once complete (an offset only
        we held goes); a change replaces our entry. Each entry's owner comes with it (none from a frame without
        OWNERS), so our quota counts are the master's. A frame out of that order is a lie: the link ends."""
        offsets = self.store.consumer_offsets
        if not event.snapshot:
            if not self.offsets_synced:
                raise errors.RemoteProtocolError("the master sent changed consumer offsets before its whole table",
                                                 fatal=True)
            skipped = offsets.replicate(event.entries)
            if skipped:
                log.warning("replication: %d of the master's committed offsets skipped: this broker holds %d, its "
                            "limit (MAX_CONSUMER_OFFSETS)", skipped, offsets.max_entries)
            return
        if self.offsets_synced:
            raise errors.RemoteProtocolError("the master sent its whole consumer-offset table twice on one link",
                                             fatal=True)
        table = self._offsets_table if self._offsets_table is not None else {}
        for entry in event.entries:
            if entry[:3] in table:
                raise errors.RemoteProtocolError("the master's consumer-offset table names %s/%s-%d twice"
                                                 % entry[:3], fatal=True)
            table[entry[:3]] = entry
        if len(table) > offsets.max_entries:
            raise errors.RemoteProtocolError("the master's consumer-offset table has more than %d entries "
                                             "(MAX_CONSUMER_OFFSETS)" % offsets.max_entries, fatal=True)
        self._offsets_table = table
        if event.end:
            offsets.replace(list(table.values()))
            self.offsets_synced, self._offsets_table = True, None
            log.info("replication: took the master's %d committed consumer offsets", len(table))

    def stats_values(self):
        """The link's ``stats`` summary ``(key, value)`` pairs."""
        return [("replication_master", self.master),
                ("replication_slave_id", self.slave_id),
                ("replication_link", "connected" if self.connected else "down"),
                ("replication_lag_bytes", self.lag_bytes),
                ("replication_lag_messages", self.lag_messages),
                ("replication_caught_up", bool(self.caught_up())),
                ("replication_master_silence_s", -1 if self.heard_at is None else round(self.silence_s(), 1)),
                ("replication_connects", self.connects),
                ("replication_offsets_synced", bool(self.offsets_synced)),
                ("replication_cut_bytes", self.cut_bytes)]
