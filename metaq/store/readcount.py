"""What the store's reads count (``MessageStore.reads``, shown by ``stats``): no sockets, threads or clock."""

import logging

from metaq.store.limits import MAX_CORRUPT_LOGGED

log = logging.getLogger("metaq.store.store")


class ReadCounts:
    """``log_read_bytes``: bytes of whole records read from the commit log to answer gets and pulls (a
    filtered read counts the records it read, never the units it passed over); ``corrupt_reads``: reads
    refused because a record failed its check (each corrupt record logged the first time, up to
    ``limits.MAX_CORRUPT_LOGGED`` of them)."""

    def __init__(self):
        self.log_read_bytes = 0
        self.corrupt_reads = 0
        self._logged = set()

    def corrupt(self, exc):
        """Count (and, the first time, log) a read refused at a corrupt record; returns ``exc``."""
        self.corrupt_reads += 1
        key = (exc.topic, exc.partition, exc.offset)
        if key not in self._logged and len(self._logged) < MAX_CORRUPT_LOGGED:
            self._logged.add(key)
            log.error("%s; `metaq-server --verify` lists every corrupt record", exc)
        return exc
