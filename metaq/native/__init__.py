"""metaq's native layer: Python modules compiled with Cython where they string steps together, and small C where
bytes are parsed or built.

**Compiled orchestration.** Each module named in ``COMPILED`` is ordinary Python, the only definition of what it
does. ``setup.py`` compiles it with Cython (a ``.pxd`` beside the ``.py`` may declare typed fields and methods) into
an extension of the same module name, kept under ``metaq/native/<package>/`` rather than beside its source; the
finder ``install`` puts first on ``sys.meta_path`` loads that extension when the module is imported. Where it was
not built (no compiler or Cython), where it is older than its source (a warning says to rebuild), or with
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
``mqttcluster.following.copyturn`` (a peer's frame of plain copies taken in one step).
"""

import importlib.machinery
import importlib.util
import os
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
    """Finds a module of ``COMPILED`` as its compiled extension, when one is built and not older than its source
    or declarations; every other name (and those, otherwise) is left to the next finder."""

    def __init__(self, names=COMPILED, root=_ROOT):
        self._names = frozenset(names)
        self._root = root  # the metaq package's directory
        self._loaded = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self._names:
            return None
        built = extension_path(name, self._root)
        try:
            built_at = os.stat(built).st_mtime
        except OSError:
            return None
        source = source_path(name, self._root)
        for part in (source, source[:-3] + ".pxd"):
            try:
                newer = os.stat(part).st_mtime > built_at
            except OSError:
                continue
            if newer:
                warnings.warn("%s is older than %s: running the Python source (rebuild: `pip install -e .`, "
                              "or `make setup`)" % (built, part), RuntimeWarning, stacklevel=2)
                return None
        self._loaded.add(name)
        return importlib.util.spec_from_file_location(name, built,
                                                      loader=importlib.machinery.ExtensionFileLoader(name, built))

    def loaded(self):
        """The names this finder gave as compiled extensions (a new sorted list)."""
        return sorted(self._loaded)


_finder = CompiledFinder()


def install():
    """Put the finder of compiled modules first on ``sys.meta_path`` (once), unless pure Python is asked for."""
    if not pure() and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def running():
    """The modules of ``COMPILED`` running compiled in this process (a new sorted list)."""
    return _finder.loaded()
