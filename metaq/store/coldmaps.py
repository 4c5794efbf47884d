"""The maps of cold log and index pages given back: the resident memory of a broker with a long log stays its own.

Every segment of the commit log and every index file is mapped whole, and each page written or read stays
mapped, so a broker that wrote 20 GB showed 20 GB resident (RssFile) although the pages are page cache the
kernel may drop at will: alarming next to a broker that reads with ``pread``, and charged against container
limits that count mapped pages. At each checkpoint (a worker thread) the log below the flushed position less
``limits.HOT_MAP_BYTES`` (where the writer, the flusher and tailing readers work) and each partition's index files
before its last drop their page tables (``MappedFile.drop_pages``, MADV_DONTNEED): nothing is lost, the pages
stay in the page cache and a read maps them again (a minor fault per 64 KiB or so).
"""

from metaq.store.limits import COLD_READ_DROP_BYTES, HOT_MAP_BYTES


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
    """When the store's cold maps give their pages back: at each checkpoint (``drop``), and whenever ``due`` says
    reads took ``COLD_READ_DROP_BYTES`` of records from the log since the last time. ``reads``: the store's
    ReadCounts."""

    def __init__(self, reads):
        self._reads = reads
        self.read_at_drop = 0  # reads.log_read_bytes when the maps last gave their pages back

    def drop(self, segments, partitions, flushed):
        """BLOCKING (a worker thread): ``drop_cold_pages(segments, partitions, flushed)``, the reads counted so far
        taken as its starting point."""
        self.read_at_drop = self._reads.log_read_bytes
        return drop_cold_pages(segments, partitions, flushed)

    def due(self):
        """True once reads took ``COLD_READ_DROP_BYTES`` of records from the log since the last ``drop`` (a cheap
        comparison: the broker asks every ``COLD_READ_CHECK_S``)."""
        return self._reads.log_read_bytes - self.read_at_drop >= COLD_READ_DROP_BYTES
