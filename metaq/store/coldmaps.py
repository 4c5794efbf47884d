"""The maps of cold log and index pages given back: the resident memory of a broker with a long log stays its own.

Every segment of the commit log and every index file is mapped whole, and each page written or read stays
mapped, so a broker that wrote 20 GB showed 20 GB resident (RssFile) although the pages are page cache the
kernel may drop at will: alarming next to a broker that reads with ``pread``, and charged against container
limits that count mapped pages. At each checkpoint (a worker thread) the log below the flushed position less
``limits.HOT_MAP_BYTES`` (where the writer, the flusher and tailing readers work) and each partition's index files
before its last drop their page tables (``MappedFile.drop_pages``, MADV_DONTNEED): nothing is lost, the pages
stay in the page cache and a read maps them again (a minor fault per 64 KiB or so).
"""

from metaq.limits import COLD_READ_DROP_BYTES, HOT_MAP_BYTES


def drop_cold_pages(segments, partitions, flushed):
    """BLOCKING: drop the page tables of the cold log (``segments``: the commit log's, oldest first; below
    ``flushed - HOT_MAP_BYTES``) and of the index files of ``partitions`` before each one's last; returns how many
    maps had pages dropped."""
    dropped = 0
    cold_end = flushed - HOT_MAP_BYTES
    for seg in segments:
        if seg.start >= cold_end:
            break
        if seg.file.drop_pages(0, cold_end - seg.start):
            dropped += 1
    for p in partitions:
        for f in p.files[:-1]:  # the last one takes new units
            if f.file.drop_pages():
                dropped += 1
    return dropped


class ColdMaps:
    """Mixed into ``MessageStore``: reads its log (``_log``), partitions (``_parts``), flushed position and read
    counts (``reads``)."""

    _read_at_drop = 0  # reads.log_read_bytes when the cold maps last gave their pages back

    def drop_cold_pages(self):
        """BLOCKING (a worker thread): ``drop_cold_pages`` of this store, at each checkpoint, every disk check and
        whenever ``cold_reads_due`` (reads of a cold backlog map pages while nothing is written)."""
        self._read_at_drop = self.reads.log_read_bytes
        return drop_cold_pages(self._log.segments, list(self._parts.values()), self._pos.flushed)

    def cold_reads_due(self):
        """True once reads took ``COLD_READ_DROP_BYTES`` of records from the log since the cold maps last gave their
        pages back (a cheap comparison: the broker asks every ``COLD_READ_CHECK_S``)."""
        return self.reads.log_read_bytes - self._read_at_drop >= COLD_READ_DROP_BYTES
