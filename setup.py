from setuptools import Extension, find_packages, setup

import ast
import os
import re
import shutil
import sysconfig

from setuptools.command.build_ext import build_ext

with open("metaq/__init__.py") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)



def _headers(path):
    return any(os.path.exists(os.path.join(d, path)) for d in ("/usr/include", "/usr/local/include"))


def _wanted(name):
    return os.environ.get(name, "") in ("", "0")


def bytes_extension():
    """metaq.native._bytes, with Intel's ISA-L CRC-32 when its headers are installed (Debian: libisal-dev), and
    OpenSSL's libcrypto for a served message's MD5 digest when its headers are (Debian: libssl-dev); without
    one, zlib's CRC-32 serves, and a served message is written by its Python definition (no served_record in C).
    METAQ_NO_ISAL=1 or METAQ_NO_OPENSSL=1 leaves one out."""
    libraries, macros = ["z"], []
    if _wanted("METAQ_NO_ISAL") and _headers("isa-l/crc.h"):
        libraries.append("isal")
        macros.append(("METAQ_HAVE_ISAL", "1"))
    if _wanted("METAQ_NO_OPENSSL") and _headers("openssl/evp.h"):
        libraries.append("crypto")
        macros.append(("METAQ_HAVE_OPENSSL", "1"))
    sources = sorted(os.path.join("metaq", "native", name) for name in os.listdir(os.path.join("metaq", "native"))
                     if name.endswith(".c"))
    return Extension("metaq.native._bytes", sources, depends=[os.path.join("metaq", "native", "native.h")],
                     include_dirs=[os.path.join("metaq", "native")], libraries=libraries, define_macros=macros,
                     optional=True)


def _compiled_names():
    with open("metaq/native/__init__.py") as f:
        tree = ast.parse(f.read())
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "COMPILED")
    return ast.literal_eval(table)


def compiled_extensions():
    """The modules of metaq.native.COMPILED compiled with Cython from their Python source (and the ``.pxd`` beside
    it), each an extension of the module's own name. Optional like the C helper: without Cython, or with
    METAQ_NO_CYTHON=1, nothing is compiled and the sources run as they are."""
    if not _wanted("METAQ_NO_CYTHON"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    extensions = [Extension(name, [name.replace(".", "/") + ".py"], optional=True) for name in _compiled_names()]
    if not extensions:
        return []
    return cythonize(extensions, build_dir=os.path.join("build", "cython"), quiet=True,
                     compiler_directives={"language_level": 3})


class BuildExt(build_ext):
    """build_ext that puts a compiled module under metaq/native/<package>/, where metaq.native's finder loads it,
    not beside its source, where it would shadow the Python under METAQ_PURE_PYTHON=1: in a wheel or a build
    directory by its path, in place (an editable install) by a move once built."""

    def get_ext_fullpath(self, ext_name):
        path = super().get_ext_fullpath(ext_name)
        if self.in_place or ext_name not in _compiled_names():  # (in place, setuptools builds with inplace off)
            return path
        parts = ext_name.split(".")
        return os.path.join(self.build_lib, "metaq", "native", *parts[1:-1], os.path.basename(path))

    def finalize_options(self):
        super().finalize_options()
        self.in_place = self.inplace
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # Cython's C for a module is long: compile them side by side

    def run(self):
        super().run()
        if not self.inplace:
            return
        for name in _compiled_names():
            parts = name.split(".")
            built = os.path.join(*parts) + sysconfig.get_config_var("EXT_SUFFIX")
            if os.path.exists(built):
                where = os.path.join("metaq", "native", *parts[1:-1])
                os.makedirs(where, exist_ok=True)
                shutil.move(built, os.path.join(where, os.path.basename(built)))


setup(
    name="metaq",
    version=VERSION,
    description="A MetaQ-style message broker: text protocol, shared commit log, transactions, replication",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["metaq", "metaq.*"]),
    # The put-burst fast path in C. Optional: if it cannot be built (no compiler,
    # no zlib headers) the install goes on and the exact pure-Python twins run.
    ext_modules=[bytes_extension()] + compiled_extensions(),
    cmdclass={"build_ext": BuildExt},
    package_data={"metaq.server.http": ["static/*"]},  # the dashboard's script and style
    python_requires=">=3.11",
    install_requires=[
        "gevent>=24.2",
        "PyYAML>=6.0",
        "pydantic>=2.6,<3",
        "kazoo>=2.10",
        "zstandard>=0.22",  # RocketMQ 5 producers' zstd bodies, decompressed on arrival (protocol/compression.py)
        "lz4>=4.3",  # RocketMQ 5 producers' LZ4 frame bodies, likewise
        "prometheus_client>=0.17",  # the HTTP port's /metrics (metaq/server/http/metrics.py)
        "hpack>=4.0,<5",  # HPACK for the gRPC port's own HTTP/2 layer (metaq/rmq5/http2.py, headercache.py)
        "orjson>=3.9",  # the journals' records: POP's, MQTT sessions' (metaq/protocol/journalrecord.py)
        "wsproto>=1.2,<2",  # MQTT over WebSocket: RFC 6455's handshake and framing, sans-IO (metaq/serving/wsio.py)
        "protobuf>=6.31",  # RocketMQ 5's messages (metaq/rmq5/messages_pb2.py, generated at setup by tools/protos.py)
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "Cython>=3.0",  # `setup.py build_ext --inplace` compiles metaq.native.COMPILED again after a change
            "hypothesis>=6.100",
            "crcmod>=1.7",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # make test-unit: the unit tier on both cores
            "psycopg[binary]>=3.1",
            "rocketmq==0.4.4",  # the official RocketMQ client (C++ core bundled): remoting tests and bench
            "fusepy>=3.0.1,<4",  # tests/harness/fusefs.py: the FUSE fault filesystem (needs Debian's libfuse2)
            "mkdocs>=1.6,<2",  # the documentation site: tests/test_docs.py builds it --strict (links and anchors)
            "ruff>=0.17,<0.18",  # the linter make test runs (tests/test_lint.py; rules in ruff.toml)
            "paho-mqtt>=2.1,<3",  # Eclipse's MQTT client: the MQTT port's tests (tests/mqtt)
            "grpcio>=1.62",  # the gRPC client of the gRPC port's tests (tests/rmq5), over our generated messages
            "h2>=4.1,<5",  # a raw HTTP/2 client for the gRPC port's tests: frames no gRPC client would send
        ],
        "spark": ["pyspark[sql]>=4.0,<5", "pandas<3", "matplotlib>=3.8", "pyarrow>=18"],
        # make docs: the documentation site alone (mkdocs.yml uses only mkdocs and Python-Markdown's own extensions)
        "docs": ["mkdocs>=1.6,<2"],
        "deploy": ["fabric>=3.2,<4", "wheel>=0.40"],
        # make fuzz: Google's coverage-guided fuzzer for Python and native extensions (libFuzzer inside), which feeds
        # the C helper's byte readers and their Python definitions the same inputs (tests/fuzz)
        "fuzz": ["atheris>=2.3"],
        # make bench: the peers' own Python clients, measured beside metaq's in bench/bench_pyclients.py
        "bench": [
            "redis>=5.0,<7",  # redis-py: pipelined XADD, XRANGE, XREAD BLOCK against Redis Streams
            "nats-py>=2.6,<3",  # nats-py: JetStream publish with acks, pull and push consumers
        ],
    },
    entry_points={
        "console_scripts": [
            "metaq-server = metaq.server.__main__:main",
            "metaq-admin = metaq.admincli:main",
            "metaq-cluster = metaq.client.devcluster:main",
            "metaq-spark-report = metaq.spark.report:main",
        ],
    },
)
