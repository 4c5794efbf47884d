# Declarations for Cython's compile of msgid.py (metaq.native): the generator a C struct, so the burst writer's
# ``take`` reads and writes its fields without a lookup by name, and calls ``take`` and ``give_back`` without a
# Python call (cpdef). The .py stays the one definition.

cdef class IdGenerator:
    cdef public object broker_id, _bits, _ts, _seq

    cpdef tuple take(self, object now_ms, object count)
    cpdef give_back(self, object n)
