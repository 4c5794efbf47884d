"""A log filter that keeps one repeated line from flooding the log (and the disk under it).

Every connection a client opens can end in a log line ("no request for 600 s; closing", "send
failed", a protocol error): a client that opens thousands a second would otherwise write
thousands of lines a second. ``LogFlood`` lets each line *template* (logger + format string)
through at most ``limits.LOG_LINES_PER_TEMPLATE`` times per ``limits.LOG_WINDOW_S``; the first
line of the next window says how many of that template were dropped. Distinct lines are never
held back by another's flood.
"""

import logging
import time

from metaq import limits


class LogFlood(logging.Filter):
    def __init__(self, per_window=limits.LOG_LINES_PER_TEMPLATE, window_s=limits.LOG_WINDOW_S,
                 clock=time.monotonic, max_templates=limits.LOG_TEMPLATES):
        super().__init__()
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        self.max_templates = max_templates
        self._seen = {}  # (logger name, msg) -> [window start, lines let through, lines dropped]

    def filter(self, record):
        key = (record.name, record.msg if isinstance(record.msg, str) else type(record.msg).__name__)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.window_s:
            dropped = seen[2] if seen is not None else 0
            if seen is None and len(self._seen) >= self.max_templates:
                self._seen.clear()  # templates are few in practice; this only bounds a pathological case
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = "%s [%d more like this dropped in the last %.0f s]" % (record.msg, dropped,
                                                                                  self.window_s)
            return True
        if seen[1] < self.per_window:
            seen[1] += 1
            return True
        seen[2] += 1
        return False

    @property
    def templates(self):
        """How many line templates are tracked now."""
        return len(self._seen)


def install(handler):
    """Put a LogFlood on ``handler`` (the broker's stderr handler)."""
    handler.addFilter(LogFlood())


def route_hub_errors(hub):
    """Report what the gevent ``hub`` would print to stderr (a greenlet that died of an exception, a thread-pool
    task that raised) through the logging module instead, so that the flood filter bounds it too: a full disk made
    each periodic checkpoint print a traceback straight to stderr, often the very disk that is full. A pool task's
    exception is raised again in the greenlet that waits for it, which reports it: logged at DEBUG here."""
    log = logging.getLogger("metaq.server.hub")

    def report(context, kind, value, tb):
        name = getattr(kind, "__name__", str(kind))
        if isinstance(context, tuple):  # (ThreadPoolWorker, function): its caller gets the exception
            log.debug("a thread-pool task failed with %s: %s", name, value)
        else:
            log.error("%.200s died of %s: %s", context, name, value, exc_info=(kind, value, tb))

    hub.print_exception = report

