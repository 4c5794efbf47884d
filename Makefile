# metaq: `make run` starts a standalone broker, `make test` runs the whole suite.
# Both set up what they need (idempotently) on a fresh Debian machine as root:
# `make run` only the broker's own packages (and libisal-dev, libssl-dev for the C helper), `make test`
# the test, deploy and Spark extras and the servers the tests start as well.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
CONFIG ?= conf/server.yaml
# Extra metaq-server flags for `make run`, e.g. make run ARGS="--port 8124 --data-dir /tmp/d"
ARGS ?=
PYTEST_ARGS ?=
# `make zookeeper` / `make postgres`: where their data, logs and PID files go, and their ports.
DEVDATA ?= devdata
ZK_PORT ?= 2181
PG_PORT ?= 5432

.PHONY: all setup sysdeps builddeps bytecode run test test-unit test-fast bench bench-scale clean docs \
	zookeeper stop-zookeeper postgres stop-postgres cluster stop-cluster sanitize fuzz

all: test

# System packages the tests use: a real ZooKeeper (Debian's package runs as a
# plain java process), PostgreSQL (its own cluster per test run, started by
# the tests; the system service is not used), OpenSSH's server (the deploy
# tests run sshd as a plain process on 127.0.0.1 and 127.0.0.2) and libfuse2 (the
# fsync-failure tests mount tests/harness/fusefs.py, a FUSE filesystem written with
# fusepy; as root libfuse2 mounts and unmounts with mount(2) itself, so neither
# `fuse` nor `fuse3`, whose fusermount programs conflict on Debian 12, is needed), and
# openssl (the security tests make a CA and certificates with it and probe TLS ports
# with `openssl s_client`; a minimal Debian may lack the command), prometheus (the HTTP
# port's tests run a real Prometheus, as a plain process with its own data dir, that scrapes
# a broker's /metrics, and check that output with its `promtool check metrics`) and chromium
# (the dashboard is loaded in headless Chromium: its DOM after the page's script ran, and
# the screenshot docs/dashboard.png), and mosquitto-clients (the MQTT port's tests publish and
# subscribe with Mosquitto's mosquitto_pub and mosquitto_sub, clients nobody here wrote).
# systemd's systemd-analyze checks the unit `fab deploy` writes for each broker (Debian installs systemd; a
# minimal container image may not).
SYSDEPS := zookeeper postgresql openssh-server libfuse2 openssl prometheus chromium mosquitto-clients systemd
# The benchmark measures Redis Streams and NATS JetStream beside metaq when redis-server and
# nats-server are there (Debian's nats-server runs as a plain process with its own store dir), and
# the MQTT port beside Mosquitto (Debian's mosquitto broker, run as a plain process with its own config).
BENCH_SYSDEPS := redis-server nats-server mosquitto
sysdeps:
	@missing=""; for p in $(SYSDEPS) $(EXTRA_SYSDEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Intel's ISA-L for the C helper's CRC-32 (about 4x zlib's); OpenSSL's libcrypto for a served gRPC
# message's MD5 digest, computed in C (no Python call a message). Optional: where one cannot be
# installed the helper is built with zlib's CRC-32 (stats: crc32) or calls hashlib's MD5.
BUILD_SYSDEPS := libisal-dev libssl-dev
builddeps:
	@$(MAKE) --no-print-directory sysdeps SYSDEPS="$(BUILD_SYSDEPS)" || \
	  echo "warning: could not install $(BUILD_SYSDEPS); the C helper will use zlib's CRC-32 and hashlib's MD5"

# The broker alone (`make run`): metaq and its install_requires, the C helper built; no extras. grpcio-tools
# (protoc from PyPI) generates the gRPC port's Python code from metaq/rmq5/messages.proto (tools/protos.py);
# nothing generated is committed.
GRPC_TOOLS := 'grpcio-tools>=1.62'
# Cython (pyproject.toml's build requirements) compiles the modules metaq/native/__init__.py names: a change to one
# of them or to a .pxd rebuilds.
COMPILED_SOURCES := $(shell sed -n '/^COMPILED = (/,/^)/s/^ *"metaq\.\(.*\)",/metaq\/\1.py/p' metaq/native/__init__.py | tr . /  | sed 's,/py$$,.py,')
$(VENV)/.core: setup.py pyproject.toml $(wildcard metaq/native/*.c metaq/native/*.h) metaq/native/__init__.py $(COMPILED_SOURCES) \
		$(wildcard metaq/*/*.pxd) metaq/rmq5/messages.proto tools/protos.py | builddeps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e . $(GRPC_TOOLS)
	$(PY) tools/protos.py --force
	touch $@

# Everything the tests, the deploy tasks, Spark and the benchmarks use: the extras on top.
$(VENV)/.installed: $(VENV)/.core
	$(PIP) install -e '.[test,deploy,spark]'
	touch $@

# The official RocketMQ 5 Python client (PyPI rocketmq-python-client, pinned), which tests/rmq5/test_official_client.py
# drives against the gRPC port, in a virtualenv of its own: it installs the import package `rocketmq`, which the
# RocketMQ 4 client of the test extra (rocketmq==0.4.4) owns too, so the two cannot share .venv. The tests run its
# Python as a subprocess; nothing of metaq is installed in it.
VENV_RMQ5 ?= .venv-rmq5
RMQ5_CLIENT := rocketmq-python-client==5.1.2
$(VENV_RMQ5)/.installed: Makefile
	test -x $(VENV_RMQ5)/bin/python || $(PYTHON) -m venv $(VENV_RMQ5)
	$(VENV_RMQ5)/bin/python -m pip -q --disable-pip-version-check install '$(RMQ5_CLIENT)'
	touch $@

# MQTT.js (npm's mqtt, pinned), the browser MQTT client tests/mqtt/test_websocket_browser.py loads in a page in
# headless Chromium against the MQTT port's WebSocket listener: its browser bundle installed into a cache dir of the
# checkout (npm: Debian's, unless a nodejs package that carries its own is there), once; the tests read it there.
JS_CACHE ?= .cache/js
MQTTJS := mqtt@5.16.0
$(JS_CACHE)/.installed: Makefile
	@command -v npm >/dev/null || $(MAKE) --no-print-directory sysdeps SYSDEPS=npm
	mkdir -p $(JS_CACHE)
	npm install --prefix $(JS_CACHE) --no-save --no-audit --no-fund --silent '$(MQTTJS)'
	test -f $(JS_CACHE)/node_modules/mqtt/dist/mqtt.min.js
	touch $@

setup: sysdeps $(VENV)/.installed $(VENV_RMQ5)/.installed $(JS_CACHE)/.installed bytecode

# The checkout's modules byte-compiled into __pycache__ (only those changed since): a broker, a client or a tool
# started from the checkout then reads its modules' bytecode instead of compiling every source at each start, even
# where PYTHONDONTWRITEBYTECODE keeps Python from writing it on import.
bytecode: $(VENV)/.core
	@$(PY) -m compileall -q metaq tools bench tests

run: $(VENV)/.core bytecode
	$(VENV)/bin/metaq-server -c $(CONFIG) $(ARGS)

# ZooKeeper and PostgreSQL for the README's examples, as plain processes on 127.0.0.1
# (tools/devservices.py; each installs its Debian package first when it is missing).
zookeeper:
	@$(MAKE) --no-print-directory sysdeps SYSDEPS=zookeeper
	@$(PYTHON) tools/devservices.py zookeeper start --port $(ZK_PORT) --dir $(DEVDATA)
stop-zookeeper:
	@$(PYTHON) tools/devservices.py zookeeper stop --port $(ZK_PORT) --dir $(DEVDATA)
postgres:
	@$(MAKE) --no-print-directory sysdeps SYSDEPS=postgresql
	@$(PYTHON) tools/devservices.py postgres start --port $(PG_PORT) --dir $(DEVDATA)
stop-postgres:
	@$(PYTHON) tools/devservices.py postgres stop --port $(PG_PORT) --dir $(DEVDATA)

# A local cluster for development (metaq-cluster, metaq/client/devcluster.py): a ZooKeeper and N brokers
# (broker ids 0..N-1, SLAVES slaves each) on 127.0.0.1, broker s's ports from CLUSTER_PORT + 10*s, files under
# CLUSTER_DIR/<id>. It runs in the foreground: Ctrl-C stops it; `make stop-cluster` from another terminal too.
N ?= 3
SLAVES ?= 1
HA ?= auto
CLUSTER_DIR ?= data/cluster
CLUSTER_PORT ?= 8123
cluster: $(VENV)/.core
	@$(MAKE) --no-print-directory sysdeps SYSDEPS=zookeeper
	$(PY) -m metaq.client.devcluster start -n $(N) --slaves $(SLAVES) --ha $(HA) --dir $(CLUSTER_DIR) \
	  --base-port $(CLUSTER_PORT) --zk-port $(ZK_PORT)
stop-cluster:
	$(PY) -m metaq.client.devcluster stop --dir $(CLUSTER_DIR)

# The test runs write bytecode whatever PYTHONDONTWRITEBYTECODE says: pytest keeps each test module as rewritten for
# its asserts in __pycache__, and each worker of each tier would rewrite all of them again.
TESTENV := PYTHONDONTWRITEBYTECODE=

# The whole suite, then the unit tier again with the C helper's pure-Python twins (METAQ_PURE_PYTHON=1), so
# that a machine without a compiler runs what the tests hold equal. The 40 slowest tests are listed at the end:
# where the suite's time goes. Two workers, one test file each at a time (--dist loadfile): a file's fixtures
# (brokers, ZooKeeper, Spark) stay in one process, and the suite's servers bind free ports so two files never meet.
test: setup
	$(TESTENV) METAQ_RMQ5_PYTHON=$(abspath $(VENV_RMQ5))/bin/python $(VENV)/bin/pytest -n 2 --dist loadfile --durations=40 $(PYTEST_ARGS)
	$(TESTENV) METAQ_PURE_PYTHON=1 $(VENV)/bin/pytest -q -m "not integration" -n 2 -p no:cacheprovider $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into ./site; --strict fails on any broken link or anchor.
# make test checks the same (tests/test_docs.py). It needs the docs extra (mkdocs) on top of the broker's own
# packages, not the test, deploy and Spark extras.
$(VENV)/.docs: $(VENV)/.core
	$(PIP) install -e '.[docs]'
	touch $@

docs: $(VENV)/.docs
	$(VENV)/bin/mkdocs build --strict

# The unit tier: no test that starts a server, spawns a process or opens a network socket
# (tests/conftest.py marks those `integration` and fails a unit test that binds or connects one).
# Two workers (pytest-xdist): the tier is many small CPU-bound tests.
test-unit: $(VENV)/.installed bytecode
	$(TESTENV) $(VENV)/bin/pytest -m "not integration" -n 2 $(PYTEST_ARGS)

# The fast tier: no slow or fault tests.
test-fast: setup
	$(TESTENV) METAQ_RMQ5_PYTHON=$(abspath $(VENV_RMQ5))/bin/python $(VENV)/bin/pytest -m "not slow and not fault" $(PYTEST_ARGS)

# `make sanitize`: the C helper's memory and undefined-behaviour check. The helper is built again with
# AddressSanitizer and UndefinedBehaviorSanitizer (gcc) into build/sanitize/lib, beside a copy of the package,
# never in place: `make test` and an install keep loading the plain build. Then the native tests (NATIVE_TESTS: every
# test file naming the C helper, which hold each C function equal to its Python definition, the wire parsers' tests
# and the fuzzers' seed corpora; the unit tier of them) run on that build, in one process with libasan preloaded
# (libstdc++ too: greenlet throws C++ exceptions, which ASan's interceptor must find). PYTHONMALLOC=malloc puts every
# Python buffer in its own malloc'd block, so a read one byte past a buffer is a report; detect_leaks=0 (CPython's
# own allocations look like leaks). Any report ends the run and fails it (--capture=sys leaves the report on the
# terminal). The check at the end fails the target when the tests did not load the sanitized build.
SAN_DIR := build/sanitize
SAN_CFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
# (The layer and loader tests name the helper too, but check the code's shape or spawn processes: left out.)
NATIVE_TESTS = $(filter-out tests/test_layers.py tests/test_speedups_loader.py tests/test_native.py, \
	$(sort $(shell grep -rlE 'native\._bytes|native import _bytes|speedups\.(built|load)|harness\.native' tests \
	  --include='test_*.py'))) \
	tests/mqtt/test_wire.py tests/rmq5/test_wire.py tests/fuzz
# Run pytest in-process, then fail unless metaq.native._bytes came from the sanitized build.
RUN_FROM_BUILD = import sys, pytest; rc = pytest.main(sys.argv[2:]); import metaq.native._bytes as s; \
	ok = s.__file__.startswith(sys.argv[1]); print("" if ok else "not the build under test: " + s.__file__); \
	sys.exit(rc or not ok)
sanitize: $(VENV)/.installed
	@$(MAKE) --no-print-directory sysdeps SYSDEPS=gcc
	rm -rf $(SAN_DIR)/lib
	METAQ_NO_CYTHON=1 CFLAGS="$(SAN_CFLAGS)" LDFLAGS="-fsanitize=address,undefined" $(PY) setup.py -q build_py --build-lib $(SAN_DIR)/lib \
	  build_ext --build-lib $(SAN_DIR)/lib --build-temp $(SAN_DIR)/temp
	ls $(SAN_DIR)/lib/metaq/native/_bytes*.so
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so.6)" \
	ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONMALLOC=malloc \
	PYTHONPATH=$(abspath $(SAN_DIR)/lib):$(CURDIR) $(PY) -P -c '$(RUN_FROM_BUILD)' $(abspath $(SAN_DIR)/lib)/ \
	  -q --capture=sys -p no:cacheprovider --import-mode=importlib -m "not integration" $(NATIVE_TESTS) $(PYTEST_ARGS)

# `make fuzz`: atheris (the fuzz extra) runs each differential fuzzer of tests/fuzz for FUZZ_SECONDS: one input to a C
# function of the helper that reads a client's or a disk's bytes and to its Python definition, a difference in their
# answers (or a crash) ending that fuzzer and failing the target once all have run, its input kept under
# build/fuzz/artifacts/. The helper is built with clang's -fsanitize=fuzzer-no-link into build/fuzz/lib (never in
# place), so libFuzzer follows the C's branches as well as the Python's. Each fuzzer starts from its seed corpus, tests/fuzz/corpus/<name>/ (tests/fuzz/test_corpus.py runs
# those in `make test`); what it finds is kept in build/fuzz/corpus/<name>/ for the next run.
FUZZ_SECONDS ?= 60
FUZZ_DIR := build/fuzz
$(VENV)/.fuzz: $(VENV)/.core
	$(PIP) install -e '.[fuzz]'
	touch $@

fuzz: $(VENV)/.fuzz
	@$(MAKE) --no-print-directory sysdeps SYSDEPS=clang
	rm -rf $(FUZZ_DIR)/lib
	METAQ_NO_CYTHON=1 CC=clang LDSHARED="clang -shared" CFLAGS="-fsanitize=fuzzer-no-link -g -O1" $(PY) setup.py -q \
	  build_py --build-lib $(FUZZ_DIR)/lib build_ext --build-lib $(FUZZ_DIR)/lib --build-temp $(FUZZ_DIR)/temp
	ls $(FUZZ_DIR)/lib/metaq/native/_bytes*.so
	@failed=""; for name in $$(PYTHONPATH=$(CURDIR) $(PY) -P -m tests.fuzz --list); do \
	  echo "fuzz: $$name for $(FUZZ_SECONDS) s"; mkdir -p $(FUZZ_DIR)/corpus/$$name $(FUZZ_DIR)/artifacts; \
	  PYTHONPATH=$(abspath $(FUZZ_DIR)/lib):$(CURDIR) $(PY) -P -m tests.fuzz $$name -max_total_time=$(FUZZ_SECONDS) \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/artifacts/$$name- $(FUZZ_DIR)/corpus/$$name \
	    tests/fuzz/corpus/$$name || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: a difference or a crash in:$$failed (inputs in $(FUZZ_DIR)/artifacts/)"; exit 1; fi

# The bench extra: the peers' Python clients (redis-py, nats-py), measured beside metaq's client.
$(VENV)/.bench: $(VENV)/.installed
	$(PIP) install -e '.[bench]'
	touch $@

bench: $(VENV)/.bench
	$(MAKE) sysdeps EXTRA_SYSDEPS="$(BENCH_SYSDEPS)"
	$(PY) bench/run.py $(BENCH_ARGS)
	$(PY) -m bench.bench_pyclients $(BENCH_PYCLIENTS_ARGS)
	$(PY) -m bench.bench_client $(BENCH_CLIENT_ARGS)
	$(PY) -m bench.bench_tx $(BENCH_TX_ARGS)
	$(PY) -m bench.bench_delay $(BENCH_DELAY_ARGS)
	$(PY) -m bench.bench_replication $(BENCH_REPL_ARGS)
	$(PY) -m bench.bench_tls $(BENCH_TLS_ARGS)
	HOME=$${HOME:-/tmp} $(PY) -m bench.bench_remoting $(BENCH_REMOTING_ARGS)
	$(PY) -m bench.bench_mqtt $(BENCH_MQTT_ARGS)

# The scale benchmarks (long: tens of minutes, and bench_backlog needs ~20 GB of disk at its default 100 M
# messages): 1,000,000 pending timers, 19,000 idle connections beside a load, 19,000 MQTT connections and a
# fan-out to 10,000 MQTT subscribers, a 100-million-message backlog.
# Each prints its table; e.g. make bench-scale BACKLOG_ARGS="--messages 2000000" for a quick look.
bench-scale: $(VENV)/.installed
	$(PY) -m bench.bench_timer_scale $(TIMER_SCALE_ARGS)
	$(PY) -m bench.bench_connections $(CONNECTIONS_ARGS)
	$(PY) -m bench.bench_mqtt_scale $(MQTT_SCALE_ARGS)
	$(PY) -m bench.bench_backlog $(BACKLOG_ARGS)

clean:
	rm -rf $(VENV) $(VENV_RMQ5) $(JS_CACHE) .pytest_cache build site *.egg-info metaq/*.so metaq/native/*.so
	find metaq tools bench tests examples -name __pycache__ -prune -exec rm -rf {} + ; rm -rf __pycache__
