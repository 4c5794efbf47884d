# Declarations for Cython's compile of store.py (metaq.native): the store a C struct for the fields the flush policy
# reads after every visible write (``should_flush``: its positions typed, a C method) and its burst writer typed, so
# ``put_burst`` (a C method, the put path's call) calls its ``append`` as C; every other attribute stays one by name
# (``__dict__``). The .py stays the one definition; without Cython it runs as it is.
cimport cython

from metaq.store.batch cimport BurstWriter
from metaq.store.positions cimport LogPositions


cdef class MessageStore:
    cdef dict __dict__
    cdef public LogPositions _pos
    cdef public bint _async
    cdef public object _last_flush_ms, config
    cdef public BurstWriter _burst

    cpdef tuple put_burst(self, object frames, object src, object now_ms)

    @cython.locals(pos=LogPositions)
    cpdef bint should_flush(self, object now_ms) except -1
