"""LogFlood: one repeated log line cannot flood the log; other lines are not held back."""

import logging

from metaq.server.logflood import LogFlood


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def logger_with(flt):
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    log = logging.getLogger("test.logflood.%d" % id(flt))
    log.propagate = False
    handler = Keep()
    handler.addFilter(flt)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return log, records


def test_a_template_passes_up_to_its_budget_then_is_counted_and_reported():
    clock = Clock()
    log, records = logger_with(LogFlood(per_window=5, window_s=10, clock=clock))
    for i in range(50):
        log.info("connection %s: no request; closing", i)  # the limit, then 45 past it
    log.warning("another line %d", 1)  # a different template is not held back
    assert records == ["connection %d: no request; closing" % i for i in range(5)] + ["another line 1"]
    clock.now += 10
    log.info("connection %s: no request; closing", 99)
    assert records[-1] == "connection 99: no request; closing [45 more like this dropped in the last 10 s]"
    log.info("connection %s: no request; closing", 100)
    assert records[-1] == "connection 100: no request; closing"


def test_the_templates_tracked_are_bounded():
    flt = LogFlood(per_window=1, window_s=10, clock=Clock(), max_templates=3)
    log, records = logger_with(flt)
    for i in range(10):
        log.info("template %d" % i)  # each its own template (a pathological logger)
    assert len(records) == 10 and flt.templates <= 3


def test_what_the_hub_would_print_goes_through_the_flood_filter(caplog):
    # a disk review: on a full disk each periodic checkpoint printed a traceback straight to stderr
    import logging

    import gevent

    from metaq import limits
    from metaq.server import logflood

    hub = gevent.get_hub()
    saved = hub.__dict__.get("print_exception")
    logflood.route_hub_errors(hub)
    flood = logflood.LogFlood()
    caplog.handler.addFilter(flood)
    try:
        def boom():
            raise OSError(28, "No space left on device")
        with caplog.at_level(logging.DEBUG, logger="metaq.server.hub"):
            for _ in range(3 * limits.LOG_LINES_PER_TEMPLATE):
                gevent.spawn(boom).join()
            try:
                hub.threadpool.apply(boom)
            except OSError:
                pass  # its caller reports it
        died = [r for r in caplog.records if "died of OSError" in r.getMessage()]
        assert 0 < len(died) <= limits.LOG_LINES_PER_TEMPLATE and died[0].levelno == logging.ERROR
        assert died[0].exc_info is not None  # the traceback, in the log
        pool = [r for r in caplog.records if "thread-pool task failed with OSError" in r.getMessage()]
        assert len(pool) == 1 and pool[0].levelno == logging.DEBUG
    finally:
        caplog.handler.removeFilter(flood)
        if saved is None:
            del hub.print_exception
        else:
            hub.print_exception = saved
