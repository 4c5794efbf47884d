# Declarations for Cython's compile of stats.py (metaq.native): a realtime counter a C struct, and the counting of a
# run of puts (``on_puts``, once per run of every put path) a C method adding to typed counters. The broker's other
# counters stay attributes by name (``__dict__``). The .py stays the one definition; without Cython it runs as it is.
cimport cython


cdef class RealtimeStat:
    cdef public object count, value


cdef class BrokerStats:
    cdef dict __dict__
    cdef public object cmd_put
    cdef public dict _put_counters

    @cython.locals(put=RealtimeStat, msize=RealtimeStat, tput=RealtimeStat, tmsize=RealtimeStat, totals=list)
    cpdef on_puts(self, object topic, object count, object size)
