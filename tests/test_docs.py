"""The documentation site: it builds with ``mkdocs build --strict`` (every link and anchor found), its configuration
reference is the page generated from the schema, and the README's disk figures are the broker's."""

import importlib.util
import logging
import os
import re
import time

import yaml

from metaq.client import Message, Producer
from metaq.client.local import small_config
from metaq.server.config import ServerConfig
from tests.harness.broker import wait_for
from tests.harness.docs import ROOT, read


def _tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / ("%s.py" % name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_the_generated_one():
    tool = _tool("config_reference")
    assert read("configuration-reference.md") == tool.render(), \
        "docs/configuration-reference.md is out of date: run python tools/config_reference.py"
    page = read("configuration-reference.md")
    for section in ServerConfig.model_fields:  # every setting of every section is on the page
        value = getattr(ServerConfig(), section)
        for name in getattr(type(value), "model_fields", {}):
            if not hasattr(type(getattr(value, name)), "model_fields"):
                assert "`%s.%s`" % (section, name) in page, (section, name)


def test_the_site_builds_strict_with_every_link_and_anchor_found(tmp_path, caplog):
    """mkdocs build --strict, in this process: a broken link, a missing anchor or a page left out of the
    navigation is a warning, and strict makes any warning fail the build."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    with caplog.at_level(logging.INFO, logger="mkdocs"):
        build(config)  # raises mkdocs.exceptions.Abort on the first build with a warning
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, warnings
    assert (tmp_path / "site" / "quickstart" / "index.html").exists()
    links = config["validation"]["links"]
    assert links["anchors"] >= logging.WARNING and links["not_found"] >= logging.WARNING  # checked, not just logged


def test_a_new_data_directory_costs_what_the_readme_says(broker_factory, tmp_path):
    """The first segment is allocated whole when the broker starts; the key index file (slots × 4 bytes and
    entries × 28 bytes) when the first message with a key is flushed; the README's figures are the defaults'."""
    segment, slots, entries = 8 << 20, 1024, 4096
    b = broker_factory(small_config(tmp_path / "data", store=dict(segment_size=segment, key_index_slots=slots,
                                                                     key_index_entries=entries)))
    data = tmp_path / "data"

    def allocated(directory):
        return {f: os.stat(os.path.join(directory, f)).st_blocks * 512 for f in os.listdir(directory)}

    wait_for(lambda: allocated(data / "commitlog"), 10, "the first segment")  # made as the broker starts
    [first] = allocated(data / "commitlog").values()
    assert first >= segment
    assert not os.listdir(data / "keyindex")
    with Producer(brokers=["meta://127.0.0.1:%d" % b.port]) as producer:
        assert producer.send(Message("tDisk", b"order 42", key="order-42")).success
    wanted = slots * 4 + entries * 28

    def key_index_sizes():  # the file appears, then gets its length
        return [os.path.getsize(data / "keyindex" / f) for f in os.listdir(data / "keyindex")]

    deadline = time.monotonic() + 30
    while not any(size >= wanted for size in key_index_sizes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    [size] = key_index_sizes()
    assert wanted <= size < wanted + 4096

    defaults = ServerConfig().store
    assert defaults.segment_size == 1 << 30
    assert (defaults.key_index_slots * 4 + defaults.key_index_entries * 28) >> 20 == 60
    shipped = yaml.safe_load(open(os.path.join(ROOT, "conf", "server.yaml")))["store"]
    assert shipped["segment_size"] == 64 << 20
    assert (shipped["key_index_slots"] * 4 + shipped["key_index_entries"] * 28) / (1 << 20) == 3.75
    quick = read("quickstart.md")
    assert re.search(r"first commit-log segment \| 64 MiB \| 1 GiB", quick)
    assert re.search(r"key index \| 3.75 MiB \| 60 MiB", quick)
    for page in ("README.md", "quickstart.md"):
        text = read(page)
        assert "about 70 MB" in text and "about 1.1 GB" in text, page


def test_the_flag_table_is_the_one_written_from_metaq_servers_parser():
    """docs/configuration.md "Flags" is what tools/server_flags.py writes from metaq-server's parser (run in a process
    of its own: importing the server's entry point monkey-patches), and names every flag `metaq-server --help` does."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    check = subprocess.run([sys.executable, str(ROOT / "tools" / "server_flags.py"), "--check"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    helped = subprocess.run([sys.executable, "-m", "metaq.server", "--help"], env=env, capture_output=True, text=True,
                            timeout=120)
    flags = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", helped.stdout.split("options:", 1)[1]))
    table = read("configuration.md").split("## Flags", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(--?[\w-]+)`(?:, `(--[\w-]+)`)? \|", table, re.M))
    documented = {f for pair in documented for f in pair if f}
    assert flags == documented, (flags ^ documented)
    for flag in ("--http-port", "--mqtt-port", "--grpc-port", "--remoting-port", "--replication-port", "--slave-of",
                 "--slave-id"):
        assert re.search(r"^\| `%s` \| `\w+(:\w+)?` \| `[a-z]+\.[a-z_]+`" % flag, table, re.M), flag


def test_make_docs_installs_the_docs_extra_only(tmp_path):
    """`make docs` in a fresh clone installs the broker and the docs extra (mkdocs), not the test, deploy and Spark
    extras `make test` needs (about 1.1 GB); the docs extra holds what mkdocs.yml uses. A dry run (make -n) into a
    virtualenv that does not exist yet: every command a fresh clone would run, none run."""
    import subprocess

    out = subprocess.run(["make", "-n", "docs", "VENV=%s" % (tmp_path / "venv")], cwd=str(ROOT), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    installs = [line.split(" install ", 1)[1] for line in out.stdout.splitlines() if " -m pip " in line]
    assert "-e '.[docs]'" in installs, out.stdout
    assert not any(extra in line for line in installs for extra in ("test", "deploy", "spark")), installs
    assert "mkdocs build --strict" in out.stdout
    setup = (ROOT / "setup.py").read_text()
    [docs_extra] = re.findall(r'"docs": \[([^\]]*)\]', setup)
    assert re.findall(r'"([\w-]+)', docs_extra) == ["mkdocs"], docs_extra
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "plugins" not in site and "theme" not in site  # mkdocs's own theme, no plugin package
    builtin = {"toc", "tables", "fenced_code", "attr_list", "admonition", "def_list", "abbr", "footnotes"}
    used = {next(iter(e)) if isinstance(e, dict) else e for e in site.get("markdown_extensions", [])}
    assert used <= builtin, used - builtin  # Python-Markdown's own extensions, installed with mkdocs
