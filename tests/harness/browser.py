"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: the browser reads
commands on its fd 3 and writes answers on its fd 4, each a JSON object ended by a NUL byte), so that a test types
into a page, clicks and reads what the page shows. Debian's chromium (the Makefile's SYSDEPS)."""

import base64
import json
import os
import signal
import subprocess
import threading
import time

from tests.harness.http import need


class BrowserError(AssertionError):
    pass


class Browser:
    """One Chromium with one page; ``evaluate`` runs an expression in the page, ``wait_for`` polls one."""

    def __init__(self, profile_dir, *flags):
        """``flags``: more of Chromium's command-line flags (``--ignore-certificate-errors`` for a test's CA)."""
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [need("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--remote-debugging-pipe", "--user-data-dir=%s" % profile_dir] + list(flags) + ["about:blank"]
        shell = 'exec 3<&%d 4>&%d; exec "$@"' % (to_browser_r, from_browser_w)  # bash: dash takes fds 0-9 only
        self.proc = subprocess.Popen(["bash", "-c", shell, "bash"] + args, pass_fds=(to_browser_r, from_browser_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # its renderers in its process group: ended with it
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._answers = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_browser, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._answers[msg["id"]] = msg
                        self._cond.notify_all()
        with self._cond:
            self._answers[None] = {"error": "the browser closed its pipe"}
            self._cond.notify_all()

    def call(self, method, session=False, timeout=30.0, **params):
        """Send one DevTools command (to the page when ``session``); its result, or BrowserError."""
        self._next += 1
        ident = self._next
        msg = {"id": ident, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._answers and None not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError("%s: no answer in %.0f s" % (method, timeout))
                self._cond.wait(left)
            answer = self._answers.pop(ident, None) or self._answers[None]
        if "error" in answer:
            raise BrowserError("%s: %s" % (method, answer["error"]))
        return answer["result"]

    def basic_auth(self, user, secret):
        """Send HTTP Basic credentials with every request of the page (as a browser does once they are typed)."""
        token = base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()
        self.call("Network.enable", session=True)
        self.call("Network.setExtraHTTPHeaders", session=True, headers={"Authorization": "Basic " + token})

    def open(self, url):
        """Load ``url`` and wait until its document is complete."""
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def evaluate(self, expression):
        """The value of ``expression`` in the page (JSON-able), or BrowserError with the page's exception."""
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise BrowserError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expression, timeout=20.0):
        """Poll ``expression`` until it is truthy; its value (BrowserError at the timeout, with the page's text)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError("not true in %.0f s: %s\npage: %s" % (
                    timeout, expression, self.evaluate("document.body ? document.body.innerText : ''")))
            time.sleep(0.05)

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        os.close(self._to_browser)
        os.close(self._from_browser)
