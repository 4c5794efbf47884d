"""A broker's start: this checkout against a peer checkout, in the same run.

    python -m bench.bench_startup [--peer /path/to/other/checkout] [--runs 5]

Each run starts a standalone broker of ``small_config`` (the tests' broker: no optional port) on an empty data
directory once with each checkout (``PYTHONPATH``; the order alternates) and takes two figures: the seconds from
launch to its "ready on" line, and the CPU seconds the broker process had used by then (``/proc/<pid>/stat``, read
as the line is seen), which moves much less with the machine's load than the wall time. It also times the imports
alone: a fresh interpreter that imports ``metaq-server``'s module (which patches gevent) and the broker's modules
(its CPU seconds). Prints medians of ``--runs`` runs. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from metaq.client.local import BrokerProcess, small_config  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")
IMPORTS = ("import resource\nimport metaq.server.__main__, metaq.server.config, metaq.server.broker\n"
           "r = resource.getrusage(resource.RUSAGE_SELF)\nprint(r.ru_utime + r.ru_stime)")


def cpu_s(pid):
    """User and system CPU seconds process ``pid`` has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start(root, code):
    """(seconds to ready, CPU seconds by then) of checkout ``code``'s broker on an empty data directory."""
    wd = tempfile.mkdtemp(dir=root)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = code
    try:
        b = BrokerProcess(wd, small_config(os.path.join(wd, "data")))
        t = time.perf_counter()
        b.start(timeout=120)
        elapsed = time.perf_counter() - t
        cpu = cpu_s(b.proc.pid)
        b.stop()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    shutil.rmtree(wd, ignore_errors=True)
    return elapsed, cpu


def imports(root, code):
    """CPU seconds of a fresh interpreter that patches gevent and imports checkout ``code``'s broker modules (run in
    ``root``: ``-c`` puts the working directory first on the path)."""
    out = subprocess.run([sys.executable, "-c", IMPORTS], env=dict(os.environ, PYTHONPATH=code), check=True,
                         capture_output=True, text=True, cwd=root)
    return float(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", help="the other checkout (its C helper built in place)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-bench-startup-", dir=args.dir)
    variants = [("this", HERE)] + ([("peer", os.path.abspath(args.peer))] if args.peer else [])
    results = {name: [] for name, _c in variants}
    try:
        for r in range(args.runs):
            for name, code in variants if r % 2 == 0 else variants[::-1]:
                results[name].append(start(root, code) + (imports(root, code),))
                print("run %d %-5s ready %.2f s, CPU %.2f s, imports CPU %.2f s" % ((r, name) + results[name][-1]),
                      file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\na standalone broker's start (small_config), medians of %d runs (seconds, lower is better)" % args.runs)
    print("%-10s %10s %12s %12s" % ("checkout", "to ready", "CPU by then", "imports CPU"))
    for name, _c in variants:
        print("%-10s %10.2f %12.2f %12.2f" % ((name,) + tuple(statistics.median(x[i] for x in results[name])
                                                              for i in range(3))))


if __name__ == "__main__":
    main()
