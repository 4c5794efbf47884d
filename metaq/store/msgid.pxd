# Declarations for Cython's compile of msgid.py (metaq.native): the generator a C struct, so the burst writer's
# ``take`` reads and writes its fields without a lookup by name. The .py stays the one definition.

cdef class IdGenerator:
    cdef public object broker_id, _bits, _ts, _seq
