"""The README's quickstart and the examples of docs/ beyond the Python client page run as written and end.

* every ```sh block of the README and of the docs/ pages runs with bash against a broker configured like
  `make run`, and the README's Python producer and consumer prints what it says;
* the RocketMQ example (producer and push consumer, the official client) ends on its own;
* the Spark example works without PYSPARK_PYTHON set and without the virtualenv on PATH;
* the XA example's command line runs against PostgreSQL as `make postgres` sets it up;
* no link in the README or docs/ points outside the repository.

Timeouts here are safety nets against an example that never ends, not speed checks.
"""

import inspect
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from itertools import pairwise

import pytest
import yaml

from metaq.client import Message, Producer
from metaq.client.local import BrokerProcess, free_port
from tests.harness.docs import blocks, nav_pages, read, section

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = read("README.md")
VENV_BIN = os.path.dirname(sys.executable)
NEVER_ENDS_S = 300


def make_run_broker(tmp_path, **extra):
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg["broker"]["port"] = 0
    cfg["broker"]["data_dir"] = str(tmp_path / "data")
    if cfg.get("http", {}).get("port"):
        cfg["http"]["port"] = free_port()  # conf/server.yaml's 8180 may be taken (a make run of the reader's)
    cfg["mqtt"]["port"] = free_port()  # and its 1883
    for name, values in extra.items():
        cfg[name].update(values)
    return BrokerProcess(tmp_path, cfg).start()


@pytest.fixture
def broker(tmp_path):
    b = make_run_broker(tmp_path)
    yield b
    b.kill()


def run(cmd, tmp_path, env_extra=None, **kw):
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    env.update(env_extra or {})
    return subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, errors="replace",
                          timeout=NEVER_ENDS_S, **kw)


# -- unit ------------------------------------------------------------------------------------------------

def test_no_link_points_outside_the_repository():
    for doc in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        assert "shared/reference" not in text, doc
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"[a-z]+://", target):
                continue  # a web address
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), (doc.name, target)


def test_first_run_has_runnable_shell_blocks_and_names_the_make_targets():
    first = section("quickstart.md", "First run")
    assert blocks("sh", first), "the First run section lost its runnable example"
    for target in ("make zookeeper", "make stop-zookeeper", "make postgres", "make stop-postgres",
                   ". .venv/bin/activate", "make run ARGS="):
        assert target in first


def test_the_readme_quickstart_is_short_and_its_say_helper_gives_up():
    """README: at most ~250 lines; the two commands; `say` has a timeout so a broker that never answers
    cannot hang the reader's terminal; the quickstart shows put/tail, a Python client, curl and how to stop."""
    assert README.count("\n") <= 260, "README.md grew past ~250 lines: move the detail to a page of docs/"
    assert "make run" in README and "make test" in README
    say = blocks("sh", README)[0]
    assert "say()" in say and re.search(r"create_connection\(\(\"127.0.0.1\", 8123\), timeout=\d+\)", say), say
    for needed in ("metaq-admin --brokers meta://127.0.0.1:8123 put", "tail test", "curl -s", "Ctrl-C",
                   "store.segment_size", "store.key_index_slots"):
        assert needed in README, needed
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", README))
    assert {"quickstart.md", "security.md", "configuration.md", "limits.md"} <= linked, linked


# -- against real parts ----------------------------------------------------------------------------------

@pytest.mark.integration
def test_every_sh_block_runs_as_written_and_ends(broker, tmp_path):
    """A ```sh block is one the documentation means to run (others are plain ``` blocks): each runs and ends,
    the README's first, then the pages' in the order of the navigation."""
    outputs = []
    for code in blocks("sh", README) + [c for page in nav_pages() for c in blocks("sh", read(page))]:
        script = re.sub(r"^\$ ", "", code, flags=re.M)  # a "$ " prompt shown before a command
        script = script.replace("8123", str(broker.port)).replace("8180", str(broker.config["http"]["port"]))
        script = script.replace("1883", str(broker.config["mqtt"]["port"]))
        out = run(["bash", "-euo", "pipefail", "-c", script], tmp_path, {"PATH": VENV_BIN + ":" + os.environ["PATH"]})
        assert out.returncode == 0, (code, out.stderr)
        outputs.append(out.stdout)
    text = outputs[0]  # the README's first block: version, put, get
    assert text.startswith("result 200 5 ") and "\n0.1.0" in text, text  # text mode: \r\n read as \n
    assert re.search(r"result 200 \d+ 1\n\d+ 0 0", text), text
    assert re.search(r"\nvalue 25 2\n.+hello$", text.rstrip("\n"), re.S), text  # the get: header and body
    assert any("sensors/room1/temp 21.5\n" in o for o in outputs), outputs  # docs/mqtt.md: Mosquitto's clients


#: The conf/server.yaml settings that open a listener (a port of 0 or null is off).
LISTENERS = (("broker", "port"), ("http", "port"), ("mqtt", "port"), ("remoting", "port"), ("grpc", "port"),
             ("replication", "port"))


@pytest.mark.integration
@pytest.mark.parametrize("page", ["README.md", "quickstart.md"])
def test_the_second_broker_of_the_docs_runs_beside_make_runs_first(page, tmp_path):
    """`make run ARGS="…"` as the page writes it starts a second broker beside `make run`'s: every listener
    conf/server.yaml opens gets a port of its own from the flags. Each port number the file and the flags name
    is moved to a free one, the same in both, so the two brokers meet exactly where the page's would."""
    [args] = re.findall(r'make run ARGS="(--port [^"]+)"', read(page))
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    argv = args.split()
    named = {cfg[a][b] for a, b in LISTENERS if (cfg.get(a) or {}).get(b)}
    named |= {int(v) for k, v in pairwise(argv) if k.endswith("-port")}
    moved = {port: free_port() for port in named}
    for a, b in LISTENERS:
        if (cfg.get(a) or {}).get(b):
            cfg[a][b] = moved[cfg[a][b]]
    argv = [str(moved[int(v)]) if k.endswith("-port") else v for k, v in pairwise([""] + argv)]
    argv[argv.index("--data-dir") + 1] = str(tmp_path / "second")
    first = dict(cfg, broker=dict(cfg["broker"], data_dir=str(tmp_path / "first")))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = BrokerProcess(tmp_path / "a", first)
    b = BrokerProcess(tmp_path / "b", first, extra_args=argv)
    try:
        a.start()
        b.start()  # a port it shares with the first: "address already in use", and it exits
        flags = dict(pairwise(argv))
        assert (a.port, b.port) == (cfg["broker"]["port"], int(flags["--port"]))
        for broker in (a, b):
            with broker.client() as c:
                assert c.put("tSecond", b"x", 0).code == 200
        for port in (cfg["http"]["port"], cfg["mqtt"]["port"], int(flags["--http-port"]), int(flags["--mqtt-port"])):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()  # HTTP and MQTT of each
        assert os.listdir(tmp_path / "second")  # its own data directory
    finally:
        b.kill()
        a.kill()


@pytest.mark.integration
def test_topics_examples_run_on_a_make_run_broker(tmp_path):
    """docs/concepts.md "Topics": create, alter, list, delete as written, on a broker configured like `make run`'s."""
    b = make_run_broker(tmp_path, http={"port": 0})
    try:
        [code] = blocks("sh", section("concepts.md", "Topics: the table, create, alter, delete"))
        out = run(["bash", "-euo", "pipefail", "-c", code.replace("8123", str(b.port))], tmp_path,
                  {"PATH": VENV_BIN + ":" + os.environ["PATH"]})
        assert out.returncode == 0, (out.stdout, out.stderr)
        lines = out.stdout.splitlines()
        assert lines[0].startswith("broker 0: topic orders created: ") and '"partitions": 4' in lines[0], lines
        assert lines[1].startswith("broker 0: topic orders altered: ") and '"perm": "r"' in lines[1], lines
        starts = [m.start() for m in re.finditer(r"\S+", lines[2])] + [None]  # the table's columns (some blank)
        [row] = [{lines[2][a:b].strip(): line[a:b].strip() for a, b in pairwise(starts)}
                 for line in lines if line.startswith("orders ")]
        assert (row["PARTITIONS"], row["PERM"], row["RETENTION_HOURS"], row["RETENTION_BYTES"], row["SOURCE"]) == \
            ("4", "r", "24.0", "1000000000", "table"), out.stdout  # the listing between alter and delete
        assert lines[-1].startswith("broker 0: topic orders deleted: "), lines
        with b.client() as c:
            assert c.put("orders", b"x", 0).code == 400  # the last command deleted it
    finally:
        b.kill()


@pytest.mark.integration
def test_the_shell_one_liner_needs_no_activated_virtualenv(broker, tmp_path):
    code = blocks("sh", README)[0]
    out = run(["bash", "-c", code.replace("8123", str(broker.port))], tmp_path,
              {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": ""})
    assert out.returncode == 0 and "result 200" in out.stdout, out.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_rocketmq_example_runs_and_ends(tmp_path):
    pytest.importorskip("rocketmq.client")
    ns_port = free_port()
    b = make_run_broker(tmp_path, remoting={"port": ns_port})
    try:
        code = blocks("python", read("rocketmq.md"))[0]
        assert "127.0.0.1:9876" in code and "consumer.shutdown()" in code
        out = run([sys.executable, "-c", code.replace("127.0.0.1:9876", "127.0.0.1:%d" % ns_port)], tmp_path)
    finally:
        b.kill()
    assert out.returncode == 0, out.stderr
    assert "SendStatus.OK" in out.stdout, out.stdout
    assert "orders b'created' b'order-17' b'order 17 created' 0" in out.stdout, out.stdout
    assert out.stdout.rstrip().endswith("received order 17: True"), out.stdout


@pytest.mark.integration
@pytest.mark.slow
def test_spark_example_runs_without_pyspark_python_set(broker, tmp_path):
    pytest.importorskip("pyspark")
    url = "meta://127.0.0.1:%d" % broker.port
    with Producer(brokers=[url]) as producer:
        for i in range(5):
            assert producer.send(Message("orders", b"order %d" % i)).success
    code = blocks("python", section("spark.md", "Messages as DataFrames"))[0]
    assert "PYSPARK_PYTHON" in code
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), PATH="/usr/bin:/bin", SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run([sys.executable, "-c", code.replace("meta://127.0.0.1:8123", url)], cwd=str(tmp_path),
                         env=env, capture_output=True, text=True, timeout=NEVER_ENDS_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"\|\s*0-0\|\s*5\|", out.stdout), out.stdout


def test_the_spark_page_names_its_java_package_and_the_pyspark_python_line_local_session_runs():
    """docs/spark.md names the Debian package of its Java runtime, and the PYSPARK_PYTHON line it says
    `local_session` runs is in `local_session` (the examples' sessions are all made by it)."""
    from metaq.spark import session

    text = read("spark.md")
    assert "apt-get install -y --no-install-recommends openjdk-17-jre-headless" in text
    if shutil.which("apt-cache"):  # the name is a package Debian knows
        known = subprocess.run(["apt-cache", "show", "openjdk-17-jre-headless"], capture_output=True, timeout=60)
        assert known.returncode == 0 and b"Package: openjdk-17-jre-headless" in known.stdout
    line = 'os.environ.setdefault("PYSPARK_PYTHON", sys.executable)'
    assert line in inspect.getsource(session.local_session)
    said = re.search(r"`local_session`, which the examples above use, runs `([^`]+)`", text)
    assert said and re.sub(r"\s+", " ", said.group(1)) == line, said
    before = text[:said.start()]
    assert all("local_session(" in code or "getOrCreate" not in code and "spark = " not in code
               for code in blocks("python", before)), "an example above makes its session without local_session"


@pytest.mark.integration
@pytest.mark.slow
def test_xa_example_command_runs_against_postgres_set_up_like_make_postgres(broker, pg_server, tmp_path):
    with pg_server.admin() as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'shop'").fetchone():
            conn.execute("CREATE ROLE shop LOGIN")
            conn.execute("CREATE DATABASE shop OWNER shop")
    line = next(line for line in read("python-client.md").splitlines()
                if line.startswith("$ python examples/xa_postgres.py --dsn"))
    args = line[2:].split(" ", 2)[2]
    args = args.replace('"host=127.0.0.1 dbname=shop user=shop"',
                        '"host=127.0.0.1 port=%d dbname=shop user=shop"' % pg_server.port)
    args = args.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)
    out = run(["bash", "-c", "%s examples/xa_postgres.py %s --log %s" % (sys.executable, args, tmp_path / "xa.log")],
              tmp_path)
    assert out.returncode == 0, out.stderr
    with pg_server.admin("shop") as conn:
        assert conn.execute("SELECT item FROM orders").fetchall()[-1] == ("book",)


@pytest.mark.integration
def test_the_readme_python_producer_and_consumer_print_what_they_say(broker, tmp_path):
    [code] = blocks("python", README)
    out = run([sys.executable, "-c", code.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)], tmp_path)
    assert out.returncode == 0, out.stderr
    sent, got = out.stdout.splitlines()
    assert re.fullmatch(r"True 0-0 (\d+)", sent), out.stdout
    assert got == "%s b'order 1'" % sent.split()[-1], out.stdout


#: What `pip install -e .` (make run's install) puts on sys.meta_path: a finder consulted after the path's, that
#: maps the package metaq to the clone's metaq/ folder. Here it maps to this checkout's.
EDITABLE_FINDER = """
import importlib.machinery, importlib.util, os, runpy, sys
ROOT = %r
class EditableFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "metaq" and not name.startswith("metaq."):
            return None
        base = os.path.join(ROOT, *name.split("."))
        if os.path.isdir(base):
            return importlib.util.spec_from_file_location(name, os.path.join(base, "__init__.py"),
                                                          submodule_search_locations=[base])
        return importlib.util.spec_from_file_location(name, base + ".py") if os.path.exists(base + ".py") else None
sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, EditableFinder)  # before the venv's
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))  # as `python SCRIPT` does
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.mark.integration
def test_the_readme_script_run_from_the_folder_above_a_clone_says_what_hides_the_package(broker, tmp_path):
    """The README's quickstart.py saved in the folder that holds a clone named metaq: `metaq` there is the clone's
    folder (no __init__.py), which an editable install's finder never gets to see past; the import says so, naming
    the folder, instead of "cannot import name 'lazy_exports' from 'metaq' (unknown location)". Saved anywhere
    else (the clone's own folder aside) it runs."""
    [code] = blocks("python", README)
    code = code.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)
    above, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    (above / "metaq").mkdir(parents=True)
    (above / "metaq" / "README.md").write_text(README)  # a clone's root: no __init__.py
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    outs = []
    for folder in (above, elsewhere):
        (folder / "quickstart.py").write_text(code)
        outs.append(subprocess.run([sys.executable, "-c", EDITABLE_FINDER % str(ROOT), "quickstart.py"],
                                   cwd=str(folder), env=env, capture_output=True, text=True, timeout=NEVER_ENDS_S))
    hidden, fine = outs
    assert hidden.returncode != 0 and "lazy_exports" not in hidden.stderr.splitlines()[-1], hidden.stderr
    assert hidden.stderr.splitlines()[-1] == (
        "ImportError: 'metaq' is the folder %s, not the metaq package: a folder named metaq without an __init__.py "
        "(a clone of the repository) in the current directory or the script's hides the installed package. Run from "
        "another directory, or from inside the clone" % (above / "metaq")), hidden.stderr
    assert fine.returncode == 0 and fine.stdout.startswith("True 0-0 "), fine.stderr
    (above / "spark_job.py").write_text("from metaq.spark import local_session\n")  # metaq.spark says the same
    spark = subprocess.run([sys.executable, "-c", EDITABLE_FINDER % str(ROOT), "spark_job.py"], cwd=str(above),
                           env=env, capture_output=True, text=True, timeout=NEVER_ENDS_S)
    assert spark.returncode != 0 and spark.stderr.splitlines()[-1] == hidden.stderr.splitlines()[-1], spark.stderr


@pytest.mark.integration
def test_the_delayed_delivery_example_runs_and_waits_its_level(broker, tmp_path):
    [code] = blocks("python", section("messaging.md", "Delayed delivery"))
    out = run([sys.executable, "-c", code.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True None", "b'remind me' True"], out.stdout


@pytest.mark.integration
def test_the_priorities_example_runs_after_its_topics_create(broker, tmp_path):
    text = section("messaging.md", "Priorities")
    [create] = blocks("sh", text)
    out = run(["bash", "-euo", "pipefail", "-c", create.replace("8123", str(broker.port))], tmp_path,
              {"PATH": VENV_BIN + ":" + os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    [code] = blocks("python", text)
    out = run([sys.executable, "-c", code.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(0, b'send the newsletter'), (2, b'rebuild the index')]", out.stdout
