"""Create, alter, delete and list topics in the store (the table: table.py; per-topic retention: retention.py).

``MessageStore.topics`` is a ``TopicOps``. Each change checks everything first (nothing is changed on a refusal),
writes the table (BLOCKING: an fsync; the server runs it under the store lock, off the event loop), then changes
the store. ``finish_open`` is the other half of that order: at open it creates the partitions the table names and
removes what is left of a deleted topic, so a crash between the table and the store leaves nothing inconsistent.

Delete: the topic's partitions stop being served at once (puts and gets answer "no such topic"), its index files
are removed; its records stay in the shared commit log until retention deletes their segments (other topics'
records share them). The table keeps a tombstone with each partition's next offset: a re-created topic starts
there, so its offsets never meet an offset of the deleted one (a consumer's old committed offset is below the new
topic's first offset and moves to it).
"""

import logging
import os
import shutil

from metaq.errors import ClientError, TopicLimit, UnknownTopic
from metaq.protocol.priority import level_topic
from metaq.store.files import fsync_dir
from metaq.topics.table import check_name, parse_settings

log = logging.getLogger(__name__)


def _call(fn):
    return fn()


def _remove_tree(path):
    shutil.rmtree(path)
    fsync_dir(os.path.dirname(path))


class TopicOps:
    def __init__(self, dirs, catalog, partitions, quota, forget_writer):
        """``partitions``: the store's Partitions (partitions.py); ``forget_writer(name)``: drop the store's caches of
        the topic."""
        self.dirs = dirs
        self.catalog = catalog
        self.table = catalog.table
        self.partitions = partitions
        self.quota = quota
        self.forget_writer = forget_writer
        self.guarded = set()  # names whose reads must ask the catalog: read-protected or deleted
        #: runs a BLOCKING step (the table's fsync, removing a deleted topic's files); the server gives one that
        #: runs it in a worker thread while the event loop goes on. In-memory changes stay on the caller's thread.
        self.run_blocking = _call

    # -- open ----------------------------------------------------------------

    def finish_open(self):
        """After recovery: drop deleted topics' partitions, make table topics' partitions, adopt the data dir."""
        for topic in list(self.table.deleted):
            if topic not in self.table.entries:
                self._drop(topic)
        for s in self.table.entries.values():
            self._hold(s)
        counts = {}
        for topic, partition in self.partitions.keys():
            counts[topic] = max(counts.get(topic, 0), partition + 1)
        for line in self.catalog.adopt_data_dir(counts):
            log.warning("%s", line)
        self._refresh_guarded()

    # -- changes -------------------------------------------------------------

    def create(self, name, values):
        """Create ``name`` with ``values`` (``{setting: value}``); returns its TopicSettings. ClientError if bad."""
        check_name(name, "create")
        if name in self.table.entries:
            raise ClientError("topic %s exists (its settings: metaq-admin topics list; change them with topics "
                              "alter)" % name)
        s = parse_settings(dict({"partitions": 1}, **values))
        s.name = name
        held = self.partitions.of(name)
        if held and name not in self.table.deleted:
            raise ClientError("topic %s already holds messages (%d partitions): use topics alter to put it in the "
                              "table" % (name, len(held)))
        self._check_quota(name, s.partitions)
        before = self.table.deleted.pop(name, None)
        s.base_offsets = {p: o for p, o in (before or {}).items() if o}
        self.table.entries[name] = s

        def undo():
            self.table.entries.pop(name)
            if before is not None:
                self.table.deleted[name] = before
        self._save(undo)
        self._hold(s)
        self._refresh_guarded()
        log.info("topic %s created: %s", name, s.describe())
        return s

    def alter(self, name, values):
        """Change ``name``'s settings (a topic of the table, or one the config or data dir gives: it joins the
        table). Fewer partitions are refused: their messages would be stranded."""
        check_name(name, "alter")
        old = self.table.entries.get(name)
        if old is None:
            count = self.catalog.partitions_of(name)  # UnknownTopic for a deleted name or one nothing accepts
            held = max([p + 1 for p in self.partitions.of(name)] or [0])
            if not held and name not in self.catalog.config.exact_names and name not in self.catalog.from_data_dir:
                raise UnknownTopic("no such topic %s: create it with metaq-admin topics create" % name)
            base = parse_settings({"partitions": max(count, held)})
            base.name = name
        else:
            base = old
        s = parse_settings(values, base)
        if s.partitions < base.partitions:
            raise ClientError("topic %s has %d partitions: fewer (%d) would strand the messages of partitions %d.."
                              "%d; partitions can only grow" % (name, base.partitions, s.partitions, s.partitions,
                                                                base.partitions - 1))
        self._check_quota(name, s.partitions)
        self.table.entries[name] = s
        self._save(lambda: self.table.entries.__setitem__(name, old) if old else self.table.entries.pop(name))
        self._hold(s)
        if not s.writable:
            for level in range(s.priorities or 1):
                self._evict_writers(level_topic(name, level))
        self._refresh_guarded()
        log.info("topic %s altered: %s", name, s.describe())
        return s

    def delete(self, name):
        """Delete ``name``: no longer served or written, its index files removed; returns the tombstone offsets."""
        check_name(name, "delete")
        if self.catalog.priority_settings(name) is not None:
            raise ClientError("topic %s has priorities: deleting a priority topic is not supported yet (its levels' "
                              "offsets would start again at 0 when it is re-created); alter it to perm=- to retire "
                              "it" % name)
        held = {p: ix.max for p, ix in self.partitions.of(name).items()}
        if name not in self.table.entries and not held and name not in self.catalog.config.exact_names:
            raise UnknownTopic("no such topic %s: nothing to delete" % name)
        old = self.table.entries.pop(name, None)
        base = dict(old.base_offsets) if old else {}
        before = self.table.deleted.get(name)
        self.table.deleted[name] = {p: max(o, base.get(p, 0)) for p, o in held.items()}
        for p, o in base.items():
            self.table.deleted[name].setdefault(p, o)

        def undo():
            if old is not None:
                self.table.entries[name] = old
            if before is None:
                self.table.deleted.pop(name)
            else:
                self.table.deleted[name] = before
        # No put may land while the table is saved (the server's run_blocking yields to other greenlets): with its
        # writers gone the next put asks the catalog, which already says deleted. A put let through here would be
        # acknowledged at an offset past the tombstone, which the re-created topic would then use again.
        self._evict_writers(name)
        self._save(undo)
        self.catalog.from_data_dir.pop(name, None)
        self._drop(name)
        self._refresh_guarded()
        log.info("topic %s deleted: its partitions are no longer served; its records stay in the commit log until "
                 "retention deletes their segments", name)
        return self.table.deleted[name]

    def replace_table(self, state):
        """A slave: take the master's table (its JSON) as ours, and apply it as ``finish_open`` does."""
        old = self.table.to_json()
        self.table.apply_json(state)
        version = self.table.version
        try:
            self.table.version -= 1
            self.run_blocking(self.table.save)  # back to the master's version
        except BaseException:
            self.table.apply_json(old)
            raise
        assert self.table.version == version
        for topic in list(self.table.deleted):
            if topic not in self.table.entries:
                self._drop(topic)
        for s in self.table.entries.values():
            self._hold(s)
            if not s.writable:
                for level in range(s.priorities or 1):
                    self._evict_writers(level_topic(s.name, level))
        self._refresh_guarded()

    def level_owner(self, topic):
        """The TopicSettings of the priority topic whose level ``topic`` is (``<t>%P<k>``), or None."""
        return self.catalog.level_owner(topic)

    def settings_of(self, topic):
        """The table's TopicSettings of ``topic``, or None (a topic the config or the data dir gives)."""
        return self.table.entries.get(topic)

    def describe(self):
        """Every known topic: ``{name, partitions, perm, ordered, retention_hours, retention_bytes, source}``."""
        rows = {}
        for name, s in self.table.entries.items():
            rows[name] = dict(s.describe(), source="table")
        names = set(self.catalog.config.exact_names) | self.partitions.topics()
        for name in sorted(names - set(rows) - set(self.table.deleted)):
            if self.catalog.level_owner(name) is not None:
                continue  # a priority level: shown as its topic's "priorities"
            try:
                count = self.catalog.partitions_of(name)
            except (UnknownTopic, ClientError):
                continue
            source = "data dir" if name in self.catalog.from_data_dir else "config"
            rows[name] = {"name": name, "partitions": count, "perm": "rw", "ordered": False,
                          "retention_hours": None, "retention_bytes": None, "priorities": 0,
                          "priority_max_wait_ms": None, "source": source}
        return [rows[n] for n in sorted(rows)]

    # -- helpers -------------------------------------------------------------

    def _save(self, undo):
        try:
            self.run_blocking(self.table.save)
        except BaseException:
            undo()
            raise

    def _check_quota(self, name, partitions):
        held = self.partitions.of(name)
        new = sum(1 for p in range(partitions) if p not in held)
        if not new:
            return
        q = self.quota
        if not held and q.topics >= q.max_topics:
            raise TopicLimit("topic %s is not created: the broker holds %d topics, its limit (limits.max_topics)"
                             % (name, q.topics))
        if q.partitions + new > q.max_partitions:
            raise TopicLimit("topic %s needs %d more partitions: the broker holds %d of its limit %d "
                             "(limits.max_partitions)" % (name, new, q.partitions, q.max_partitions))

    def _hold(self, s):
        for n in range(s.partitions):
            p = self.partitions.make(s.name, n)
            base = s.base_offsets.get(n, 0)
            if p.max < base:  # a re-created topic starts past the deleted one's offsets
                p.min = p.max = p.visible = base
            elif p.min < base:
                p.min = base

    def _evict_writers(self, name):
        self.partitions.evict_writers(name)
        self.forget_writer(name)

    def _drop(self, name):
        """Close and remove every partition of ``name`` (BLOCKING: unlinks and directory fsyncs)."""
        self._evict_writers(name)
        self.partitions.drop(name)
        topic_dir = os.path.dirname(self.dirs.partition_dir(name, 0))
        if os.path.isdir(topic_dir):
            self.run_blocking(lambda: _remove_tree(topic_dir))

    def _refresh_guarded(self):
        self.guarded.clear()
        self.guarded.update(n for n, s in self.table.entries.items() if not s.readable)
        self.guarded.update(level_topic(n, k) for n, s in self.table.entries.items() if not s.readable
                            for k in range(1, s.priorities))
        self.guarded.update(n for n in self.table.deleted if n not in self.table.entries)
