"""Timed delivery's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Timed messages (``put_at``, RocketMQ 5's timer properties) pending on the whole broker
#: (``limits.max_pending_timers``; each a row of timers.db); past it a timed put is answered 503 at once, nothing
#: stored. Users' ``timers`` quotas divide it (docs/security.md "Quotas").
MAX_PENDING_TIMERS = 10_000_000

# -- timers: any delivery time (docs/messaging.md "Delayed delivery", "Any delivery time") -----------------------------
#: Furthest ahead a message may be scheduled (about 10 years): due times stay far inside int64, and a typo is caught.
MAX_DELIVER_AHEAD_MS = 10 * 366 * 86_400_000

#: The delivery greenlet keeps in memory the pending messages due within this many milliseconds of now.
TIMER_WINDOW_MS = 60_000

#: Most rows the in-memory delivery window holds (the rest wait in timers.db for the next load).
MAX_TIMER_WINDOW_ROWS = 10_000

#: ... and at most this many bytes of their messages' data (10,000 messages of ``MAX_BODY_BYTES`` due at once would
#: be 40 GB); a single message is always taken.
MAX_TIMER_WINDOW_BYTES = 64 << 20

#: Most ids one DONE record lists (a larger delivered batch writes several).
MAX_TIMER_DONE_IDS = 1_000

#: Rows of recent outcomes (delivered / cancelled) kept so a cancel can say which one happened.
MAX_TIMER_OUTCOMES = 100_000

#: Most pending timers one ``timers`` listing returns.
MAX_TIMER_LIST = 1_000

#: TIMER_TOPIC records the indexer applies per SQLite transaction.
TIMER_INDEX_BATCH = 1_000
#: Bytes of message data a batch of the timer index holds at most (one record at least): what the log follower
#: collects on the event loop for the timer service's next transaction (timers/follow.py).
TIMER_INDEX_BATCH_BYTES = 8 << 20

#: Bytes of timers.db pages SQLite keeps in memory (``PRAGMA cache_size``). Each entry adds a row to the due-time
#: index at a random place: with SQLite's default cache, a million pending meant a read of an index page per insert.
TIMER_INDEX_CACHE_BYTES = 32 << 20
#: Pages of timers.db's write-ahead log before SQLite copies them into the file (``PRAGMA wal_autocheckpoint``;
#: its default is 1,000). One batch of 1,000 entries dirties hundreds of index pages: with the default, every
#: batch was checkpointed, writing each page twice; with more, a page changed by many batches is copied once.
TIMER_INDEX_CHECKPOINT_PAGES = 16_384
#: Bytes the write-ahead log file is cut back to after a checkpoint (``PRAGMA journal_size_limit``): without it
#: the file keeps its largest size for good (a batch far larger than usual). Above a full log at the checkpoint
#: (16,384 pages of 4,120 bytes: 64.4 MiB, and the batch that crossed it), so the file is not cut and grown again
#: every cycle.
TIMER_INDEX_WAL_BYTES = 80 << 20

#: TIMER_TOPIC records a master's timer service keeps, decoded, as it writes them, so that its indexer applies them
#: without reading them back from the log and decoding them (timers/service.py ``written``). Past this many not yet
#: indexed, the newest are not kept and the indexer reads those from the log, as a slave's always does.
MAX_TIMER_FRESH = 20_000
#: ... and at most this many bytes of their messages' data (a put_at body may be up to ``max_body_bytes``).
MAX_TIMER_FRESH_BYTES = 32 << 20

#: Least milliseconds between two of the indexer's transactions (each one fsyncs timers.db): a pipeline of put_at
#: is indexed in a few large batches, not one per flush round, and its fsyncs do not crowd the log's. A message
#: due sooner than this after its put may be delivered up to this much later than due.
TIMER_INDEX_INTERVAL_MS = 20

#: Least seconds between two records of the timer store's ``scan_from`` by the delivery (an SQLite transaction each).
TIMER_SCAN_FROM_INTERVAL_S = 1.0
