"""Where a consumer group keeps its offsets: ZooKeeper, the broker, or a local file.

Every store has the same small interface:

    load(topic, partition) -> int | None     the next offset the group will read, None if never committed
    commit({(topic, partition): (offset, msg_id)})   write the entries that changed since the last commit
    close()

``partition`` is a :class:`metaq.client.message.Partition` (or anything whose ``str()`` is
``"<brokerId>-<partition>"`` and that has ``broker_id`` / ``partition``). ``offset`` is the
next offset to read (one past the last consumed message); ``msg_id`` is the id of the last
consumed message, or -1 when unknown.

* :class:`ZkOffsetStore` — MetaQ's layout (reference §4): the persistent node
  ``<root>/consumers/<group>/offsets/<topic>/<brokerId>-<p>`` holds ``"<msgId>-<offset>"``;
  the legacy plain ``"<offset>"`` is read too.
* :class:`BrokerOffsetStore` — the broker's consumer-offset store (``commit_offset`` /
  ``query_offset``), for groups without ZooKeeper. It keeps the offset only, not the msg id.
* :class:`LocalFileOffsetStore` — a JSON file (group → topic → ``"b-p"`` →
  ``{"offset", "msg_id"}``), replaced atomically; for broadcast consumers.
"""

import fcntl
import json
import logging
import os
import tempfile
import threading
import time

from metaq import errors
from metaq.limits import validate_group
from metaq.protocol import events as ev
from metaq.client.replies import reply_error

log = logging.getLogger(__name__)

__all__ = [
    "OffsetStore",
    "ZkOffsetStore",
    "BrokerOffsetStore",
    "LocalFileOffsetStore",
    "parse_zk_offset",
    "format_zk_offset",
]


def parse_zk_offset(text):
    """Parse an offsets node value into ``(offset, msg_id)``.

    ``"<msgId>-<offset>"`` (MetaQ 1.4+; msgId may be negative, so the split is at the *last*
    ``-``: ``"-1-42"`` is msgId -1, offset 42) or the legacy plain ``"<offset>"`` (msg_id -1).
    Raises ValueError for anything else (``"--5-42"``, ``"5--42"``, ``"-42"``, a negative
    offset, empty text).
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    text = text.strip()
    cut = text.rfind("-")
    try:
        if cut <= 0:  # no '-', or only a leading sign: the legacy plain offset
            offset, msg_id = int(text), -1
        else:
            msg_id, offset = _strict_int(text[:cut]), _strict_int(text[cut + 1 :])
    except ValueError:
        raise ValueError("not an offset value: %r (expected '<msgId>-<offset>' or '<offset>')" % text) from None
    if offset < 0:
        raise ValueError("negative offset in %r" % text)
    return offset, msg_id


def _strict_int(s):
    """int() of a plain decimal with an optional single leading '-' (no spaces, no '+', no '_')."""
    body = s[1:] if s.startswith("-") else s
    if not body.isdigit() or not body.isascii():
        raise ValueError(s)
    return int(s)


def format_zk_offset(offset, msg_id):
    """``"<msgId>-<offset>"`` as MetaQ writes it (msg_id None becomes -1)."""
    return "%d-%d" % (-1 if msg_id is None else msg_id, offset)


def _partition_key(partition):
    return str(partition)


class OffsetStore:
    """Base class: remembers what was last written so ``commit`` skips unchanged partitions."""

    def __init__(self):
        self._written = {}  # (topic, "b-p") -> (offset, msg_id)
        self._lock = threading.Lock()  # guards _written
        self._commit_lock = threading.Lock()  # one commit at a time: writes never reorder

    def load(self, topic, partition):
        """The stored next offset of ``(topic, partition)``, or None when the group never committed one."""
        entry = self.load_entry(topic, partition)
        return None if entry is None else entry[0]

    def load_entry(self, topic, partition):
        """``(offset, msg_id)`` as stored, or None."""
        entry = self._read(topic, partition)
        if entry is not None:
            with self._lock:
                self._written[(topic, _partition_key(partition))] = entry
        return entry

    def commit(self, offsets):
        """Write every ``(topic, partition) -> (offset, msg_id)`` that differs from the last write.

        Returns the number of entries written. Raises the store's error when a write fails
        (the entries not written are retried by the next commit).
        """
        with self._commit_lock:
            with self._lock:
                changed = {}
                for (topic, partition), (offset, msg_id) in offsets.items():
                    value = (int(offset), -1 if msg_id is None else int(msg_id))
                    if self._written.get((topic, _partition_key(partition))) != value:
                        changed[(topic, partition)] = value
            if not changed:
                return 0
            self._write(changed)
            with self._lock:
                for (topic, partition), value in changed.items():
                    self._written[(topic, _partition_key(partition))] = value
            return len(changed)

    def close(self):
        """Release what the store holds (the ZooKeeper client and the pool belong to the caller)."""

    def _read(self, topic, partition):
        raise NotImplementedError

    def _write(self, changed):
        raise NotImplementedError


class ZkOffsetStore(OffsetStore):
    """Offsets in ZooKeeper: ``<root>/consumers/<group>/offsets/<topic>/<brokerId>-<p>`` = ``"<msgId>-<offset>"``.

    ``zk`` is a started KazooClient (owned by the caller). Nodes are persistent, so offsets
    outlive every consumer of the group.
    """

    def __init__(self, zk, root, group):
        super().__init__()
        self.zk = zk
        self.group = validate_group(group)
        self.base = "%s/consumers/%s/offsets" % (root.rstrip("/"), group)

    def path(self, topic, partition):
        """The offsets node of ``(topic, partition)``."""
        return "%s/%s/%s" % (self.base, topic, _partition_key(partition))

    def _read(self, topic, partition):
        from kazoo.exceptions import NoNodeError

        path = self.path(topic, partition)
        try:
            data, _stat = self.zk.get(path)
        except NoNodeError:
            return None
        try:
            return parse_zk_offset(data)
        except ValueError as exc:
            log.error("ignoring the unreadable offset at %s: %s", path, exc)
            return None

    def _write(self, changed):
        from kazoo.exceptions import NoNodeError

        for (topic, partition), (offset, msg_id) in changed.items():
            path = self.path(topic, partition)
            data = format_zk_offset(offset, msg_id).encode("utf-8")
            try:
                self.zk.set(path, data)
            except NoNodeError:
                self.zk.create(path, data, makepath=True)


class BrokerOffsetStore(OffsetStore):
    """Offsets in the broker that owns the partition (``commit_offset`` / ``query_offset``).

    ``pool`` is a :class:`metaq.client.connection.ConnectionPool`; ``url_of(broker_id)`` gives
    the url of that broker (None when it is unknown: the load or commit fails with
    ConnectionLost). The broker keeps the offset only; the msg id is remembered in memory.

    Only a partition's master takes commits: a broker that is not (a slave, a deposed master, a member waiting
    for an election) answers ``NOT_MASTER``, naming the master when it knows it (``ha: auto``). The commit is
    then sent once to that master (the cluster view may not have seen the failover yet); a refusal that names
    no master is raised like any failed commit, and the next commit tries again.
    """

    def __init__(self, pool, url_of, group, timeout=10.0):
        super().__init__()
        self.pool = pool
        self.url_of = url_of
        self.group = validate_group(group)
        self.timeout = timeout

    def _connection(self, partition):
        url = self.url_of(partition.broker_id)
        if not url:
            raise errors.ConnectionLost("no known url for broker %d" % partition.broker_id)
        return self.pool.get(url)

    def _read(self, topic, partition):
        conn = self._connection(partition)
        reply = conn.call(ev.QueryOffset(self.group, topic, partition.partition, 0), timeout=self.timeout)
        if reply.code == 404:
            return None
        if reply.code != 200:
            raise reply_error(reply, "query_offset %s %s %s" % (self.group, topic, partition))
        return int(reply.body), -1

    def _write(self, changed):
        pending = []
        for (topic, partition), (offset, _msg_id) in changed.items():
            conn = self._connection(partition)
            request = ev.CommitOffset(self.group, topic, partition.partition, offset, 0)
            pending.append(((topic, partition), conn.request(request, timeout=self.timeout)))
        failures = []
        for key, future in pending:  # pipelined: every commit is in flight before the first wait
            try:
                self._committed(key, future.result(self.timeout + 1.0), changed[key][0])
            except (errors.MetaqError, TimeoutError) as exc:
                failures.append((key, exc))
        for key, _exc in failures:  # partly written: record what succeeded, raise for the rest
            changed.pop(key)
        with self._lock:
            for (topic, partition), value in changed.items():
                self._written[(topic, _partition_key(partition))] = value
        if failures:
            key, exc = failures[0]
            raise errors.Unavailable("%d offset commit(s) failed, first %s %s: %s"
                                     % (len(failures), key[0], key[1], exc))


    def _committed(self, key, reply, offset, redirected=False):
        """Check one commit's reply; a NOT_MASTER naming the master sends the commit there (once)."""
        if reply.code == 200:
            return
        error = reply_error(reply, "commit_offset %s %s %s" % (self.group, key[0], key[1]))
        if isinstance(error, errors.NotMaster) and error.master and not redirected:
            log.info("offset commit of %s %s %s: the broker is not the master; committing on %s", self.group,
                     key[0], key[1], error.master)
            conn = self.pool.get(error.master)
            request = ev.CommitOffset(self.group, key[0], key[1].partition, offset, 0)
            return self._committed(key, conn.call(request, timeout=self.timeout), offset, redirected=True)
        raise error


class LocalFileOffsetStore(OffsetStore):
    """Offsets in a local JSON file: ``{group: {topic: {"b-p": {"offset": n, "msg_id": m}}}}``.

    Each commit re-reads the file under an exclusive ``flock`` (on ``<path>.lock``), updates
    this group's entries, writes a temp file in the same directory, fsyncs it and renames
    it over the old one, so a crash leaves either the old or the new file, never a torn one.
    Other groups in the same file are kept.
    """

    def __init__(self, path, group):
        super().__init__()
        self.path = os.path.abspath(os.path.expanduser(str(path)))
        self.group = validate_group(group)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def _read_file(self):
        try:
            with open(self.path, "r", encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise errors.ClientError("offsets file %s is not valid JSON: %s" % (self.path, exc)) from None
        if not isinstance(data, dict):
            raise errors.ClientError("offsets file %s: expected a JSON object at the top" % self.path)
        return data

    def _read(self, topic, partition):
        with self._file_lock():
            data = self._read_file()
        entry = data.get(self.group, {}).get(topic, {}).get(_partition_key(partition))
        if entry is None:
            return None
        try:
            return int(entry["offset"]), int(entry.get("msg_id", -1))
        except (KeyError, TypeError, ValueError):
            log.error("ignoring the unreadable offset %r for %s %s in %s", entry, topic, partition, self.path)
            return None

    def _write(self, changed):
        with self._file_lock():
            data = self._read_file()
            group = data.setdefault(self.group, {})
            for (topic, partition), (offset, msg_id) in changed.items():
                group.setdefault(topic, {})[_partition_key(partition)] = {"offset": offset, "msg_id": msg_id}
            self._replace(json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))

    def _replace(self, payload):
        directory = os.path.dirname(self.path)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _file_lock(self):
        return _FileLock(self.path + ".lock")


class _FileLock:
    """An exclusive ``flock`` on a side file, so processes sharing an offsets file do not lose updates."""

    def __init__(self, path, timeout=10.0):
        self.path = path
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise errors.Unavailable("offsets file lock %s held by another process for %.0f s"
                                             % (self.path, self.timeout)) from None
                time.sleep(0.01)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
