# Declarations for Cython's compile of longpoll.py (metaq.native): the waits a C struct whose table is a typed dict, so
# the put path's one wake (``notify``, which every publisher's burst runs) looks partitions up without a method call
# by name. The .py stays the one definition; without Cython it runs as it is.
cimport cython


cdef class PartitionWaiters:
    cdef public dict _waits, by_user
    cdef public object max_parked, quota, parked
    cdef public bint closed, _made

    @cython.locals(waits=dict, woke=bint)
    cpdef bint notify(self, object keys, dict quiet=*, bint settle=*) except -1
