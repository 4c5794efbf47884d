"""Cold pages of a map brought into memory off the event loop (gevent's thread pool), before the loop reads them.

A read of a map page that is not in the page cache stalls the thread on a disk read while it holds the GIL, so a
worker thread reading the map would not help: each page is checked first (``MappedFile.resident``, mincore: a few
microseconds) and a range holding a cold one is brought in by ``MappedFile.populate`` in the pool, which releases
the GIL; the loop then reads it from memory. ``offset_at`` does the same one page at a time (server/text/dispatch.py).
"""

import mmap

import gevent


def walk(search):
    """Step a stepwise read (``keys.index.KeySearch``: ``done``, ``need()``, ``step()``) to its end, each map
    range it names brought in first; returns the search."""
    while not search.done:
        need = search.need()
        if need is not None:
            bring_in((need,))
        search.step()
    return search


def bring_in(ranges):
    """Make the bytes of ``ranges`` (``[(MappedFile, start, end)]``) resident, populating cold ones in the pool;
    True when one was cold."""
    pool = None
    for mf, start, end in ranges:
        for pos in range(start - start % mmap.PAGESIZE, end, mmap.PAGESIZE):
            if not mf.resident(pos):
                pool = pool or gevent.get_hub().threadpool
                pool.apply(mf.populate, (pos, end))
                break
    return pool is not None


def bring_in_record_head(store, topic, partition, offset):
    """The pages ``store.msg_id_at(topic, partition, offset)`` reads, brought in off the loop when cold: the
    record's index unit, and then, named once that is resident, its header (``msg_id_at(..., ranges=True)``). True
    when one was cold (other greenlets ran meanwhile)."""
    if not bring_in(store.msg_id_at(topic, partition, offset, ranges=True)):
        return False
    bring_in(store.msg_id_at(topic, partition, offset, ranges=True))  # the unit was maybe alone
    return True
