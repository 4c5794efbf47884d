"""The differential fuzzers: ``python -m tests.fuzz NAME [libFuzzer flags] WORK_CORPUS SEED_CORPUS`` runs atheris
(PyPI) on ``differential.TARGETS[NAME]``, a difference between the C helper and its Python definition, or a crash,
ending the run (libFuzzer writes the input under ``-artifact_prefix``). ``make fuzz`` runs each for a set time.
``python -m tests.fuzz --list`` names the fuzzers; ``--write-seeds DIR`` writes each one's seed corpus under
``DIR/NAME/`` (tests/fuzz/corpus is made so).

The C helper gets native coverage when it was built with clang's ``-fsanitize=fuzzer-no-link`` (``make fuzz``
does): its coverage hooks are atheris's libFuzzer's, made global before the helper loads. The twins' Python
modules are instrumented as they are imported (``atheris.instrument_imports``)."""

import ctypes
import importlib
import importlib.util
import os
import sys


def _libfuzzer_global():
    """Load atheris's own libFuzzer (the module ``atheris.Fuzz`` imports when told ``internal_libfuzzer``) with its
    symbols global, so an extension built with ``-fsanitize=fuzzer-no-link`` finds its coverage hooks
    (``__sanitizer_cov_*``) when it loads, and they count for the one libFuzzer that runs."""
    ctypes.CDLL(importlib.util.find_spec("atheris.core_with_libfuzzer").origin, mode=os.RTLD_NOW | ctypes.RTLD_GLOBAL)


def _write_seeds(root):
    from tests.fuzz import differential
    for name in differential.TARGETS:
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        for i, seed in enumerate(differential.seeds(name)):
            with open(os.path.join(folder, "seed-%d" % i), "wb") as f:
                f.write(seed)


def main(argv):
    if argv[1:2] == ["--list"]:
        from tests.fuzz import differential
        print("\n".join(differential.TARGETS))
        return 0
    if argv[1:2] == ["--write-seeds"]:
        _write_seeds(argv[2])
        return 0
    name = argv[1]
    _libfuzzer_global()
    import atheris
    from tests.fuzz import differential
    check = differential.TARGETS[name]
    atheris.Setup([argv[0]] + argv[2:], check, internal_libfuzzer=True)
    with atheris.instrument_imports(include=["metaq"]):
        for module in check.modules:
            importlib.import_module(module)
    native = importlib.import_module("metaq.native._bytes")  # raises when the helper is not built: nothing to compare
    print("fuzzing %s against %s" % (name, native.__file__), file=sys.stderr)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
