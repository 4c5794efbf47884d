# Declarations for Cython's compile of putpath.py (metaq.native): the broker's own writes a C struct, so the one wake
# every publisher's burst runs (``visible``) reads its store, waiters and flusher as fields, not by name, and is a C
# method (cpdef). The .py stays the one definition; without Cython it runs as it is.

cdef class BrokerWrites:
    cdef public object store, waiters, flusher
    cdef public bint sync_flush

    cpdef visible(self, object keys, object now, object quiet=*, object deliver=*, tuple args=*)
