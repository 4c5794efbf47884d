"""The store's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Cuts of the commit log (a slave's, before its epoch handshake) whose positions the log remembers: a zero-copy
#: reply read before that many cuts ago cannot tell which of its records they reached and is never sent (its
#: connection closes). Replies hold their records for ``MAX_PINNED_SEND_S`` at most; cuts are rare.
MAX_CUTS_REMEMBERED = 64

#: Corrupt records the store logs (one line each, the first time one is read); past that many a read
#: of one more is still refused and counted (``stats`` ``corrupt_reads``) but logged no more.
MAX_CORRUPT_LOGGED = 1024

# -- recovery (store/recovery.py, store/recovery_scan.py) ------------------------------------------------------
#: Records recovery's scan checks in one call (``recovery_scan.scan_log``, in C when built) before it hands their
#: index units to the rebuilder: the call's arrays and the batch of units it returns (16 bytes a record) stay
#: bounded however large a segment is.
RECOVERY_SCAN_RECORDS = 65536
#: Bytes of log a read may scan on the event loop to rebuild an index unit that does not name its record
#: (``unitcheck.repair_resident``): the stretch between the records before and after it, every page of it (and of
#: theirs) already in memory. A longer stretch, or a page not resident, is left to the next start or catch-up
#: (``unitcheck.check_units``) and the read answers 512 meanwhile: the loop never reads the disk for it.
UNIT_REPAIR_READ_BYTES = 256 * 1024
#: Seconds after a failed step of the log follower (a full disk while the key index made a file, say) before it is
#: tried again, besides after each flush round: a broker (an idle slave) that writes nothing after space returns
#: still brings its derived indexes up to the log.
LOG_FOLLOW_RETRY_S = 1.0

#: Log bytes one step of a recovery's id scan reads (store/lookup.py ``IdScan``: which due timers were delivered
#: before a crash, at a start or a promotion): the event loop yields between steps, and each step's cold pages
#: are brought in off it first.
ID_SCAN_STEP_BYTES = 1 << 20

#: Bytes of the log below the flushed position whose maps stay as they are at a checkpoint (the writer, the flusher
#: and readers at the tail work there); the log before them gives its page tables back (store/coldmaps.py), so the
#: broker's resident memory does not grow with its log.
HOT_MAP_BYTES = 64 << 20

#: Record bytes read from the log after which the cold maps give their page tables back again, without waiting for
#: the disk check's second (store/coldmaps.py ``cold_reads_due``). Reading a partition touches every page of the
#: shared log its records lie on (16 partitions: about 16× the bytes read), so a consumer reading a cold backlog
#: at full speed maps gigabytes of file pages within a second; checked every ``COLD_READ_CHECK_S``.
COLD_READ_DROP_BYTES = 16 << 20
COLD_READ_CHECK_S = 0.1
