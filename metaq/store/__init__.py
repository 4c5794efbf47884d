"""store layer (see DESIGN §2, §4): files only, no sockets, threads or clock.

    config.py     StoreConfig, TopicSpec, topic name/pattern resolution
    files.py      every file name in the data dir, the lock, checkpoint/clean-shutdown state files
    mapped.py     preallocated (posix_fallocate) memory-mapped files
    record.py     the commit-log record layout (MetaQ's record is its suffix)
    commitlog.py  contiguous segments, rolling with blank tails, flushing
    index.py      per-partition 16-byte index units
    msgid.py      snowflake message ids
    recovery.py   scan, decision to cut, index rebuild; read_log() for offline checks
    retention.py  which segments may go
    ahead.py      prepare_ahead: prefaulting and building the next segment/index file in a worker thread
    results.py    what MessageStore returns (PutResult, ReadResult, ...)
    replica.py    replication primitives: read_log (master), append_replicated (slave), truncate_log
    store.py      MessageStore, the facade the server uses
"""
