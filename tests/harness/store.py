"""Small stores in temporary directories for the store, tx and server tests; time is injected, never read."""

import os

from metaq.store.config import StoreConfig, TopicSpec
from metaq.store.record import FIXED_OVERHEAD
from metaq import storestate

#: A fixed "now" for tests (2021-01-01T00:00:00Z); tests add to it instead of sleeping.
NOW = 1_609_459_200_000
HOUR_MS = 3600_000


def small_config(data_dir, **overrides):
    cfg = dict(data_dir=str(data_dir), segment_size=4096, index_file_units=64, flush="async", key_index_slots=64,
               key_index_entries=256,
               topics=[TopicSpec("test", 4), TopicSpec("t*", 2), TopicSpec("*", 1)])
    cfg.update(overrides)
    return StoreConfig(**cfg)


def server_config(data_dir, flush="sync", partitions=2, **sections):
    """A broker's whole configuration over a small store in ``data_dir``, for tests that wire the broker's parts in
    this process; each of ``sections`` replaces that section."""
    from metaq.server.config import ServerConfig

    raw = {
        "broker": {"id": 7, "host": "127.0.0.1", "port": 0, "data_dir": str(data_dir)},
        "store": {"segment_size": 1 << 20, "index_file_units": 4096, "flush": flush},
        "limits": {"max_body_bytes": 256 * 1024},
        "topics": [{"name": "*", "partitions": partitions}],
    }
    raw.update(sections)
    return ServerConfig.model_validate(raw)


def open_store(data_dir, now=NOW, **overrides):
    return storestate.open_store(small_config(data_dir, **overrides), now)


def read_all(store, topic, partition, start=None, max_size=1 << 20):
    """Every visible message's MetaQ form (bytes) from ``start`` (default: min offset)."""
    out = []
    offset = store.min_offset(topic, partition) if start is None else start
    while True:
        r = store.read(topic, partition, offset, max_size)
        if not r.count:
            return out
        out.extend(bytes(v) for v in r.views)
        offset = r.next_offset


def payload_of(metaq_form):
    """The data of a record's MetaQ form (after the 20-byte header)."""
    return metaq_form[20:]


def fill_to_leave(s, left, topic="test"):
    """Put messages until exactly ``left`` bytes remain in the active segment."""
    over = FIXED_OVERHEAD + len(topic)
    s.put(topic, 0, 0, b"f", NOW)
    while True:
        need = s._log.active.end - s.written_position - left
        if need == 0:
            return
        if 0 < need < over:
            size = 1000  # cannot land exactly here: move on to the next segment
        elif need - over <= 500:
            size = need - over
        elif need >= 2 * over + 500:
            size = 500
        else:
            size = (need - 2 * over) // 2
        s.put(topic, 0, 0, b"x" * size, NOW)


def files_of(root):
    """Every file under ``root`` (relative path -> bytes) but those holding random serials or times."""
    out = {}
    for d, _dirs, names in os.walk(root):
        for name in names:
            if name in ("lock", "clean_shutdown", "checkpoint") or name.endswith(".json"):  # random serials
                continue
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), root)] = f.read()
    return out


def inprocess_put_path(data_dir, now, flush="async"):
    """``(store, put_path)``: a broker's put path over a real store of one partition a topic in ``data_dir``, with its
    flusher, waiters and roles, in this process: for tests that drive a write step (the cluster's copies) without
    a broker process around it."""
    from gevent.lock import Semaphore

    from metaq.server.flusher import Flusher
    from metaq.server.replication.roles import Roles
    from metaq.server.stats import BrokerStats
    from metaq.serving.connections import ConnectionCore, ConnectionLimits
    from metaq.serving.longpoll import PartitionWaiters
    from metaq.serving.putpath import PutPath, WriteGate

    cfg = server_config(data_dir, flush=flush, partitions=1)
    store = storestate.open_store(cfg.store_config(), now)
    waiters = PartitionWaiters()
    flusher = Flusher(store, store.config, waiters.notify, lambda: None)
    roles = Roles(cfg, store, ConnectionCore(10, ConnectionLimits(60, 60)), flusher, waiters, Semaphore())
    return store, PutPath(store, BrokerStats(), flusher, waiters, roles, WriteGate())
