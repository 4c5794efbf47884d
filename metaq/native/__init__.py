"""metaq's native layer: Python modules compiled with Cython where they string steps together, and small C where
bytes are parsed or built.

**Compiled orchestration.** Each module named in ``COMPILED`` is ordinary Python, the only definition of what it
does. ``setup.py`` compiles it with Cython (a ``.pxd`` beside the ``.py`` may declare typed fields and methods) into
an extension of the same module name, kept under ``metaq/native/<package>/`` rather than beside its source; the
finder ``install`` puts first on ``sys.meta_path`` loads that extension when the module is imported. Where it was
not built (no compiler or Cython), where it is older than its source or than the declarations it cimports (a
warning says to rebuild), or with
``METAQ_PURE_PYTHON=1``, the ``.py`` runs as it is: the same code, slower. The test suite runs both ways.

**C for bytes**: the extension ``metaq.native._bytes`` (optional; ``metaq.speedups.load`` gives each function or its
Python twin): buffers in, plain values out, each function the exact twin of a Python definition. One file a concern:

- ``module.c``: the method table and the module's init.
- ``native.h``: what the files share: declarations, the CRC-32 and the decimal writer inline.
- ``textburst.c``: the text protocol's put burst scanned, its result 200 replies (protocol/burst.py).
- ``idemburst.c``: the put_idem burst scanned (idempotence/burst.py).
- ``timerburst.c``: the put_at burst scanned, its replies (timers/burst.py).
- ``client.c``: the text client's putb and putb_idem bodies, a get reply scanned, its payloads gathered.
- ``records.c``: log records: a burst's run written, records checked and scanned, a read's gathered; CRC-32.
- ``recovery.c``: recovery's scan of a segment, index units rewritten, the key index's walk.
- ``send.c``: writes by descriptor: a read's log ranges to a socket, a packet run to many.
- ``clock.c``: ``now_ms``, the broker's wall clock.
- ``sync.c``: ``SyncWorker``, fdatasync in a thread that never takes the GIL (server/flusher.py).
- ``mqttwire.c``: MQTT's per-packet steps: the split, a PUBLISH's bytes, a PUBACK run (mqtt/wire.py).
- ``mqttpublishes.c``: an MQTT read's plain PUBLISHes split and staged; staged puts as the store's burst frames.
- ``mqttturn.c``: the MQTT publisher's read in one call, with its PUBACKs' bytes.
- ``mqttacks.c``: the MQTT subscriber's read of PUBACKs split into packet ids.
- ``protobuf.c``: protobuf fields written from pairs; gRPC messages framed (rmq5/messagebytes.py, rmq5/wire.py).
- ``servedmsg.c``: a served RocketMQ 5 message's bytes from its log record (built with OpenSSL only).
- ``pop.c``: POP receipt handles written and read (pop/records.py).
- ``wsframe.c``: a WebSocket client's common frames unmasked (protocol/wsframe.py).

**Compiled modules** (``COMPILED``), each under ``<package>/`` here: ``store.store``, ``store.batch`` (the log's
writer and a burst's run), ``mqtt.plainturn``, ``mqtt.direct`` (the MQTT reader's turn and direct delivery),
``serving.putpath``, ``serving.longpoll`` (the put path and long-polled reads), ``store.msgid``, ``store.positions``
(the ids a run takes and the log positions it advances), ``server.stats`` (the counters every run of puts adds to),
``protocol.recordwalk`` (a peer's RECORDS frame's entries read), ``mqttcluster.following.records`` (an inbox
record's kept attribute read, its own properties written),
``mqttcluster.following.copyturn`` (a peer's frame of plain copies taken in one step).
"""

import importlib.machinery
import importlib.util
import os
import re
import sys
import sysconfig
import warnings

#: The modules compiled with Cython from their Python source (read by setup.py; keep it a plain literal).
COMPILED = (
    "metaq.store.store",
    "metaq.mqtt.plainturn",
    "metaq.mqtt.direct",
    "metaq.store.batch",
    "metaq.serving.putpath",
    "metaq.serving.longpoll",
    "metaq.store.msgid",
    "metaq.store.positions",
    "metaq.server.stats",
    "metaq.protocol.recordwalk",
    "metaq.mqttcluster.following.records",
    "metaq.mqttcluster.following.copyturn",
)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pure():
    """True when ``METAQ_PURE_PYTHON`` asks for the Python definitions even where the native ones are built."""
    return os.environ.get("METAQ_PURE_PYTHON", "") not in ("", "0")


def extension_path(name, root=_ROOT):
    """Where the compiled extension of module ``name`` (``metaq.store.store``) lives once built."""
    parts = name.split(".")[1:]
    return os.path.join(root, "native", *parts[:-1], parts[-1] + sysconfig.get_config_var("EXT_SUFFIX"))


def source_path(name, root=_ROOT):
    """The Python source of module ``name``."""
    return os.path.join(root, *name.split(".")[1:]) + ".py"


class CompiledFinder:
    """Finds a module of ``COMPILED`` as its compiled extension, when one is built and current: not older than its
    source or declarations, nor than the declarations of a module it cimports (read from ``from ... cimport`` lines
    of its ``.pxd``), and each module it cimports found compiled too (an extension built against a class that now
    runs as Python would fail at import). Every other name (and those, otherwise) is left to the next finder."""

    def __init__(self, names=COMPILED, root=_ROOT):
        self._names = frozenset(names)
        self._root = root  # the metaq package's directory
        self._loaded = set()
        self._why = {}  # module name -> why it runs as Python ("": it is current)

    def find_spec(self, name, path=None, target=None):
        if name not in self._names:
            return None
        why = self.stale(name)
        if why:
            if why != _NOT_BUILT:
                warnings.warn("%s: running the Python source (rebuild: `pip install -e .`, or `make setup`)" % why,
                              RuntimeWarning, stacklevel=2)
            return None
        self._loaded.add(name)
        built = extension_path(name, self._root)
        return importlib.util.spec_from_file_location(name, built,
                                                      loader=importlib.machinery.ExtensionFileLoader(name, built))

    def stale(self, name):
        """Why module ``name`` of ``COMPILED`` cannot run compiled here ("" when it can): its extension not built,
        older than a file it was built from, or a module it cimports not current."""
        if name in self._why:
            return self._why[name]
        self._why[name] = _NOT_BUILT  # (a cimport cycle cannot be built either)
        built = extension_path(name, self._root)
        try:
            built_at = os.stat(built).st_mtime
        except OSError:
            return _NOT_BUILT
        source = source_path(name, self._root)
        declarations = source[:-3] + ".pxd"
        why = ""
        for part in (source, declarations):
            try:
                if os.stat(part).st_mtime > built_at:
                    why = "%s is older than %s" % (built, part)
                    break
            except OSError:
                continue
        if not why:
            for other in _cimported(declarations):
                if other in self._names:
                    other_why = self.stale(other)
                    if other_why or os.stat(source_path(other, self._root)[:-3] + ".pxd").st_mtime > built_at:
                        why = "%s cimports %s, %s" % (built, other, other_why or "whose declarations are newer")
                        break
        self._why[name] = why
        return why

    def loaded(self):
        """The names this finder gave as compiled extensions (a new sorted list)."""
        return sorted(self._loaded)


#: ``CompiledFinder.stale``'s answer for a module whose extension is not built (no warning: nothing to rebuild).
_NOT_BUILT = "not built"

_CIMPORT = re.compile(r"^from\s+(metaq(?:\.\w+)+)\s+cimport\b", re.M)


def _cimported(declarations):
    """The metaq modules a ``.pxd`` cimports (none when it does not exist)."""
    try:
        with open(declarations, encoding="utf-8") as f:
            return _CIMPORT.findall(f.read())
    except OSError:
        return []


_finder = CompiledFinder()


def install():
    """Put the finder of compiled modules first on ``sys.meta_path`` (once), unless pure Python is asked for."""
    if not pure() and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def running():
    """The modules of ``COMPILED`` running compiled in this process (a new sorted list)."""
    return _finder.loaded()
