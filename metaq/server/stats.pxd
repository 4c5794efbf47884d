# Declarations for Cython's compile of stats.py (metaq.native): a realtime counter a C struct, and the counting every
# put and get path does (``on_puts``, once per run of puts; ``on_get``) C methods adding to typed counters. The
# broker's other figures stay attributes by name (``__dict__``). The .py stays the one definition; without Cython it
# runs as it is.
cimport cython


cdef class RealtimeStat:
    cdef public object count, value

    cpdef add(self, object value=*)


cdef class BrokerStats:
    cdef dict __dict__
    cdef public object cmd_put, cmd_get, cmd_offset, get_miss, put_failed
    cdef public dict realtime, topic_realtime, topic_totals, _put_counters

    cpdef dict topic(self, object topic)
    cpdef list totals(self, object topic)

    @cython.locals(put=RealtimeStat, msize=RealtimeStat, tput=RealtimeStat, tmsize=RealtimeStat, totals=list)
    cpdef on_puts(self, object topic, object count, object size)

    @cython.locals(t=dict)
    cpdef on_get(self, object topic, object miss)
