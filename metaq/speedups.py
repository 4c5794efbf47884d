"""The optional C helper ``metaq.native._bytes``: each of its functions, or the exact pure-Python twin.

The helper is built by ``pip install`` when a compiler and zlib's headers are
there (``setup.py``: optional, so an install never fails for it). Its functions
and their twins (tested equal): ``scan_puts`` and ``encode_put_acks``
(protocol/burst.py), ``write_run`` (store/batch.py), ``gather_records`` (store/gather.py), ``scan_log`` and
``write_units`` (store/recovery_scan.py: recovery's scan), ``nonzero_end`` (store/mapped.py) and the others
named in ``native/module.c``. ``METAQ_PURE_PYTHON=1`` in the environment runs the twins even when the helper is built.
"""

import importlib.util
import os


def load(name, twin):
    """``metaq.native._bytes.<name>`` if it is built and wanted, else ``twin`` (also when the helper was built without
    that function: ``served_record`` needs OpenSSL's libcrypto)."""
    if os.environ.get("METAQ_PURE_PYTHON", "") not in ("", "0"):
        return twin
    try:
        from metaq.native import _bytes
    except ImportError:
        return twin
    return getattr(_bytes, name, twin)


def built():
    """True when the C helper is importable (whether or not METAQ_PURE_PYTHON is set)."""
    return importlib.util.find_spec("metaq.native._bytes") is not None
