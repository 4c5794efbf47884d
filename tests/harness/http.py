"""The HTTP port in tests: a broker config with it on, a small blocking client, a real Prometheus, headless
Chromium. Prometheus and Chromium are Debian's (the Makefile's SYSDEPS): a missing binary fails the test."""

import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from urllib.parse import urlencode

from metaq.client.local import free_port


def with_http(config, **http):
    """``config`` (small_config's dict) with the HTTP port on at a free port of 127.0.0.1; returns it."""
    values = {"port": free_port()}
    values.update(http)
    config["http"] = values
    return config


def read_until_closed(sock):
    """Every byte the peer sends until it closes the connection."""
    out = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return out
        out += chunk


def http_port(broker):
    return broker.config["http"]["port"]


class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    def __repr__(self):
        return "<HTTP %d %r>" % (self.status, self.body[:300])


def request(broker, method, path, body=None, user=None, secret=None, ca=None, headers=None, timeout=10.0):
    """One request to the broker's HTTP port (HTTPS with ``ca``); returns a Reply."""
    port = http_port(broker)
    if ca is not None:
        ctx = ssl.create_default_context(cafile=ca)
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = dict(headers or {})
    if user is not None:
        hdrs["Authorization"] = "Basic " + base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()
    try:
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        return Reply(r.status, dict(r.getheaders()), r.read())
    finally:
        conn.close()


def need(binary):
    """The path of ``binary``; fails (never skips) when it is missing: ``make test`` installs it."""
    path = shutil.which(binary)
    assert path, "%s is not installed: run `make sysdeps` (the Makefile's SYSDEPS has it)" % binary
    return path


class PrometheusProcess:
    """Debian's prometheus as a plain process: a generated config scraping ``targets``, its own data dir,
    ``--web.listen-address=127.0.0.1:<free port>``; stopped by its PID."""

    def __init__(self, workdir, targets, interval_s=1):
        self.workdir = str(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.port = free_port()
        self.config = os.path.join(self.workdir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write("global:\n  scrape_interval: %ds\n  scrape_timeout: %ds\nscrape_configs:\n"
                    "  - job_name: metaq\n    static_configs:\n      - targets: [%s]\n"
                    % (interval_s, interval_s, ", ".join("'%s'" % t for t in targets)))
        self.proc = None

    def start(self):
        binary = need("prometheus")
        log = open(os.path.join(self.workdir, "prometheus.log"), "ab")
        self.proc = subprocess.Popen([binary, "--config.file=%s" % self.config,
                                      "--storage.tsdb.path=%s" % os.path.join(self.workdir, "data"),
                                      "--web.listen-address=127.0.0.1:%d" % self.port],
                                     stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()
        return self

    def _get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            doc = json.loads(conn.getresponse().read())
        except (OSError, ValueError):
            return {}
        finally:
            conn.close()
        return doc.get("data", {}) if doc.get("status") == "success" else {}

    def query(self, expr):
        """The ``/api/v1/query`` result list for ``expr`` ([] when Prometheus is not up yet)."""
        return self._get("/api/v1/query?" + urlencode({"query": expr})).get("result", [])

    def targets(self):
        """What Prometheus says of its targets (health, last error): for failure messages."""
        return [(t.get("scrapeUrl"), t.get("health"), t.get("lastError"))
                for t in self._get("/api/v1/targets").get("activeTargets", [])]

    def log_tail(self, nbytes=3000):
        with open(os.path.join(self.workdir, "prometheus.log"), "rb") as f:
            return f.read()[-nbytes:].decode("utf-8", "replace")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def chromium(url, *args, budget_ms=3000, timeout=90):
    """Run headless Chromium on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=FILE``...); its stdout."""
    binary = need("chromium")
    started = time.monotonic()
    r = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--virtual-time-budget=%d" % budget_ms] + list(args) + [url],
                       capture_output=True, timeout=timeout)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:], time.monotonic() - started)
    return r.stdout.decode("utf-8", "replace")
