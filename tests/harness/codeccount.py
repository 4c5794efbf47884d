"""A broker that counts its record codec's calls on one payload: ``python -m tests.harness.codeccount OUT MARK
<python> -m metaq.server ARGS`` runs ``metaq.server`` with ARGS in this process, each of
``metaq.protocol.message``'s ``encode_payload`` and ``decode_payload`` wrapped (every module's reference to them
too) to count the calls whose payload holds the bytes MARK (each makes a copy of it), written to the JSON file OUT
every COUNTS_S. A test runs brokers under it with ``BrokerProcess.prefix`` (``counting``)."""

import json
import os
import runpy
import sys

if __name__ == "__main__":  # the broker's process only: a test importing ``counting`` stays unpatched
    from gevent import monkey

    monkey.patch_all()

import gevent  # noqa: E402

#: How often the counts are written out.
COUNTS_S = 0.1


def counting(out, mark):
    """The ``BrokerProcess.prefix`` that runs a broker counting the codec's calls on ``mark`` into ``out``."""
    return [sys.executable, "-m", "tests.harness.codeccount", str(out), mark]


def read_counts(out):
    """``{"encode_payload": n, "decode_payload": n}`` a counting broker wrote last (zeros before its first)."""
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"encode_payload": 0, "decode_payload": 0}


def _install(mark):
    import metaq.server.broker  # noqa: F401  (every module that may hold a reference, imported first)
    from metaq.protocol import message

    counts = {"encode_payload": 0, "decode_payload": 0}
    originals = {"encode_payload": message.encode_payload, "decode_payload": message.decode_payload}

    def encode_payload(payload, attribute):
        if mark in bytes(payload):
            counts["encode_payload"] += 1
        return originals["encode_payload"](payload, attribute)

    def decode_payload(flag, data):
        if mark in bytes(data):
            counts["decode_payload"] += 1
        return originals["decode_payload"](flag, data)

    wrappers = {"encode_payload": encode_payload, "decode_payload": decode_payload}
    for module in list(sys.modules.values()):
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                setattr(module, name, wrappers[name])
    return counts


def _write(out, counts):
    while True:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(counts, f)
        os.replace(tmp, out)
        gevent.sleep(COUNTS_S)


def main():
    out, mark, rest = sys.argv[1], sys.argv[2].encode(), sys.argv[3:]
    counts = _install(mark)
    gevent.spawn(_write, out, counts)
    sys.argv = ["metaq.server"] + rest[3:]  # rest: <python> -m metaq.server ARGS
    runpy.run_module("metaq.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
