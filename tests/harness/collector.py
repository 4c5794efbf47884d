"""A consumer handler that collects what it is given, thread-safely, and waits for a count."""

import threading
import time


class Collector:
    """A thread-safe handler that records every message it is given."""

    def __init__(self, fail=None):
        self.messages = []
        self.calls = {}
        self.fail = fail  # message -> bool: raise for it
        self.cond = threading.Condition()

    def __call__(self, message):
        with self.cond:
            self.calls[message.body] = self.calls.get(message.body, 0) + 1
        if self.fail is not None and self.fail(message):
            raise RuntimeError("cannot process %r" % message.body)
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def wait_for(self, count, timeout=15.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.messages) < count:
                left = deadline - time.monotonic()
                assert left > 0, "got %d of %d messages" % (len(self.messages), count)
                self.cond.wait(left)
        return list(self.messages)

    def bodies(self):
        with self.cond:
            return [m.body for m in self.messages]

    def received_once(self, expected, timeout=15.0):
        """Wait for ``len(expected)`` messages and check they are exactly ``expected`` (bodies, any order), each
        handled once: a count alone would pass with a duplicate in place of a loss."""
        got = sorted(m.body for m in self.wait_for(len(expected), timeout))
        assert got == sorted(expected), "got %s, expected %s" % (got, sorted(expected))
        with self.cond:
            twice = {body: n for body, n in self.calls.items() if n > 1}
        assert not twice, "handled more than once: %s" % twice
        return got
