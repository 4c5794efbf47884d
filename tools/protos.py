"""Generate the Python code of metaq's .proto files (metaq/rmq5/messages.proto -> messages_pb2.py).

Run by ``make setup`` / ``make run`` (the Makefile's core step) after grpcio-tools is installed: protoc comes from
PyPI (grpcio-tools bundles it), so no system protoc is needed, and nothing generated is committed. Regenerates only
when the .proto is newer than its output (``--force``: always). Exits non-zero when protoc fails.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTOS = ["metaq/rmq5/messages.proto"]


def outputs(proto):
    return os.path.join(ROOT, proto[:-len(".proto")] + "_pb2.py")


def stale(proto):
    out = outputs(proto)
    return not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(os.path.join(ROOT, proto))


def generate(force=False):
    todo = [p for p in PROTOS if force or stale(p)]
    if not todo:
        return 0
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        print("tools/protos.py: grpcio-tools is not installed (pip install grpcio-tools)", file=sys.stderr)
        return 2
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")  # google/protobuf/*.proto
    rc = protoc.main(["protoc", "-I" + ROOT, "-I" + well_known, "--python_out=" + ROOT]
                     + [os.path.join(ROOT, p) for p in todo])
    if rc != 0:
        print("tools/protos.py: protoc failed (%d) on %s" % (rc, ", ".join(todo)), file=sys.stderr)
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="regenerate even when up to date")
    sys.exit(generate(ap.parse_args().force))


if __name__ == "__main__":
    main()
