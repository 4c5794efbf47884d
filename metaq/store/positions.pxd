# Declarations for Cython's compile of positions.py (metaq.native): the positions a C struct, so every append's
# ``advance`` reads and writes its fields without a lookup by name, and the burst writer calls it without a Python
# call (cpdef). The .py stays the one definition.

cdef class LogPositions:
    cdef public object written, flushed, checkpointed, unflushed_msgs, pending, async_visible, appended
    cdef public object flush_mark, flush_cut, cuts, _recent_cuts

    cpdef advance(self, object p, object off, object end, object total, object count=*)
