# Declarations for Cython's compile of putpath.py (metaq.native): the broker's own writes a C struct, so the one wake
# every publisher's burst runs (``visible``) reads its store, waiters and flusher as fields, not by name, and is a C
# method (cpdef); its store and waiters typed, so their flush policy and wake are C calls too. The put path a C struct
# too: the fields every put reads (its store typed, so the burst's append is a C call of the store's), and the steps of
# a put (its refusal, the append, the count, the wake, the wait) C methods called from each other without a Python call;
# its other attributes stay ones by name (``__dict__``). The .py stays the one definition; without Cython it runs as it
# is.
cimport cython

from metaq.serving.longpoll cimport PartitionWaiters
from metaq.store.store cimport MessageStore


cdef class BrokerWrites:
    cdef public MessageStore store
    cdef public PartitionWaiters waiters
    cdef public object flusher
    cdef public bint sync_flush

    cpdef visible(self, object keys, object now, object quiet=*, object deliver=*, tuple args=*)


cdef class PutPath:
    cdef dict __dict__
    cdef public MessageStore store
    cdef public BrokerWrites writes
    cdef public object guard, stats, flusher, waiters, roles, gate, registry
    cdef public bint sync_flush

    cpdef object writable_refusal(self)
    cpdef object isolation_refusal(self)
    cpdef object write_refusal(self, object topic, object session, object internal=*)
    cpdef object creation_refusal(self, object topic, object session)
    cpdef tuple append_burst(self, object frames, object src, object now)
    cpdef counted(self, object topic, object count, object nbytes)
    @cython.locals(roles=object)
    cpdef object written(self, object keys, object now, object quiet=*, object deliver=*, tuple args=*)
    cpdef settle(self, object log_end, object since=*)
    cpdef confirm(self, object log_end, object since=*)
