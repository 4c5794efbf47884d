"""metaq's native layer: Python modules compiled with Cython where they string steps together, and small C where
bytes are parsed or built.

**Compiled orchestration.** Each module named in ``COMPILED`` is ordinary Python, the only definition of what it
does. ``setup.py`` compiles it with Cython (a ``.pxd`` beside the ``.py`` may declare typed fields and methods) into
an extension of the same module name, kept under ``metaq/native/<package>/`` rather than beside its source; the
finder ``install`` puts first on ``sys.meta_path`` loads that extension when the module is imported. Where it was
not built (no compiler or Cython), where it is older than its source (a warning says to rebuild), or with
``METAQ_PURE_PYTHON=1``, the ``.py`` runs as it is: the same code, slower. The test suite runs both ways.

**C for bytes** (the extension ``metaq.native._bytes``; ``metaq.speedups.load``): buffers in, plain values out.
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
    "metaq.server.putpath",
    "metaq.server.longpoll",
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
                warnings.warn("%s is older than %s: running the Python source (rebuild with "
                              "`python setup.py build_ext --inplace`)" % (built, part), RuntimeWarning, stacklevel=2)
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
