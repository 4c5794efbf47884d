"""``metaq-server`` / ``python -m metaq.server``: run one broker.

gevent's monkey-patching happens here, first thing, and nowhere else.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402

import metaq  # noqa: E402
from metaq.errors import ConfigError, CorruptLog, MetaqError  # noqa: E402
from metaq.server import logflood  # noqa: E402

log = logging.getLogger("metaq.server")

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def build_parser():
    from metaq.server.config import ServerConfig

    d = ServerConfig()  # the defaults, for the help text
    p = argparse.ArgumentParser(
        prog="metaq-server",
        description="Run a metaq broker (MetaQ text protocol on one port, data in a shared commit log).",
        epilog="Flags override the YAML file; without -c the built-in defaults are used "
               "(%s:%d, data under %s, %s flush, every topic allowed)."
               % (d.broker.host, d.broker.port, d.broker.data_dir, d.store.flush),
    )
    p.add_argument("-c", "--config", metavar="FILE", default=os.environ.get("METAQ_CONFIG"),
                   help="YAML configuration file (default: $METAQ_CONFIG, else built-in defaults)")
    p.add_argument("--host", help="address to bind (default %s)" % d.broker.host)
    p.add_argument("--port", type=int, help="port to bind (default %d; 0 = any free port)" % d.broker.port)
    p.add_argument("--data-dir", metavar="DIR",
                   help="where the commit log and indexes live (default %s)" % d.broker.data_dir)
    p.add_argument("--broker-id", type=int, metavar="N", help="broker id, 0..1023 (default %d)" % d.broker.id)
    p.add_argument("--flush", choices=("sync", "async"),
                   help="sync: acknowledge after fsync (group commit); async: flush every N messages or T ms")
    p.add_argument("--zk", metavar="HOST:PORT[,...]",
                   help="register in ZooKeeper at this connect string (a /chroot suffix is allowed); "
                        "without it (and without zk.connect in the file) the broker runs standalone")
    p.add_argument("--slave-of", metavar="HOST:PORT",
                   help="run as a replication slave of the master whose replication port is HOST:PORT "
                        "(same broker id and segment size as the master; puts are refused)")
    p.add_argument("--slave-id", type=int, metavar="N", help="this slave's number (registers as slave<N>)")
    p.add_argument("--replication-port", type=int, metavar="P",
                   help="master: serve slaves on this port (0 or absent = off)")
    p.add_argument("--http-port", type=int, metavar="P",
                   help="serve metrics, health, the JSON API and the dashboard over HTTP on this port (0 = off)")
    p.add_argument("--mqtt-port", type=int, metavar="P",
                   help="serve MQTT 3.1.1 and 5.0 clients on this port (0 = off; docs/mqtt.md)")
    p.add_argument("--remoting-port", type=int, metavar="P",
                   help="serve RocketMQ clients (name server and broker codes) on this port (0 or absent = off)")
    p.add_argument("--grpc-port", type=int, metavar="P",
                   help="serve RocketMQ 5 clients (gRPC, apache.rocketmq.v2.MessagingService) on this port "
                        "(0 or absent = off; RocketMQ's proxy uses 8081)")
    p.add_argument("--force-recovery", action="store_true", default=None,
                   help="cut the log at mid-log corruption instead of refusing to start (loses the records after it)")
    p.add_argument("--check-config", action="store_true", help="validate the configuration, print it and exit")
    p.add_argument("--verify", action="store_true",
                   help="check every record of the whole commit log (all segments, structure and CRC) offline, "
                        "print each corrupt one and a summary, and exit: 0 when none is corrupt, 1 when one is, "
                        "2 when it cannot run (a broker holds the data dir: stop it first)")
    p.add_argument("--log-level", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="log level, in any case (default %s)" % d.broker.log_level)
    p.add_argument("--version", action="version", version="metaq-server %s" % metaq.__version__)
    return p


#: The flag behind each setting a flag overrides (a bad value is blamed on the flag).
FLAGS = {"broker.host": "--host", "broker.port": "--port", "broker.data_dir": "--data-dir",
         "broker.id": "--broker-id", "broker.log_level": "--log-level", "store.flush": "--flush",
         "store.force_recovery": "--force-recovery", "zk.connect": "--zk", "replication.slave_of": "--slave-of",
         "replication.role": "--slave-of", "replication.slave_id": "--slave-id",
         "replication.port": "--replication-port", "remoting.port": "--remoting-port"}


def flags_from(overrides):
    """Dotted setting -> ``--flag value`` for every setting the command line gave."""
    return {dotted: "%s %s" % (FLAGS[dotted], value) for dotted, value in overrides.items()
            if value is not None and dotted in FLAGS}


def check_data_dir(path):
    """ConfigError when ``path``, or a directory above it, exists and is not a directory."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    if not os.path.isdir(probe):
        what = path if probe == os.path.abspath(path) else "%s: %s" % (path, probe)
        raise ConfigError("data_dir %s is a file, not a directory: give broker.data_dir (--data-dir) a directory"
                          % what)


def overrides_from(args):
    return {
        "broker.host": args.host,
        "broker.port": args.port,
        "broker.data_dir": args.data_dir,
        "broker.id": args.broker_id,
        "broker.log_level": args.log_level,
        "store.flush": args.flush,
        "store.force_recovery": args.force_recovery,
        "zk.connect": args.zk,
        "replication.role": "slave" if args.slave_of else None,
        "replication.slave_of": args.slave_of,
        "replication.slave_id": args.slave_id,
        "replication.port": args.replication_port,
        "remoting.port": args.remoting_port,
        "http.port": args.http_port,
        "mqtt.port": args.mqtt_port,
        "grpc.port": args.grpc_port,
    }


def main(argv=None):
    args = build_parser().parse_args(argv)
    from metaq.server.config import check_fd_limit, raise_nofile_limit, read_config

    source = args.config or "(defaults)"
    try:
        overrides = overrides_from(args)
        config = read_config(args.config, overrides, flags_from(overrides))
        check_data_dir(config.broker.data_dir)
        if args.check_config:  # judged by the limit a start would raise to, never raising this process's own
            check_fd_limit(config, source, config.nofile_target(*resource.getrlimit(resource.RLIMIT_NOFILE)))
    except ConfigError as exc:
        return refuse(exc)
    if args.check_config:
        print(config.redacted_text().decode("utf-8"), end="")
        return EXIT_OK
    logging.basicConfig(level=config.broker.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verify:
        return verify(config.broker.data_dir)  # every line it prints matters: no flood filter
    raise_nofile_limit(config)  # before the check and the connection cap read the limit
    try:
        check_fd_limit(config, source)
    except ConfigError as exc:
        return refuse(exc)
    for handler in logging.getLogger().handlers:
        logflood.install(handler)
    logflood.route_hub_errors(gevent.get_hub())
    return run(config)


def refuse(exc):
    """A configuration the broker cannot start with: its one line on stderr, and the exit code that says so."""
    print("metaq-server: %s" % exc, file=sys.stderr)
    return EXIT_USAGE


def verify(data_dir):
    """``--verify``: the whole log checked offline (metaq/store/verify.py); the exit code says what was found."""
    from metaq.store.verify import verify_log

    try:
        report = verify_log(data_dir, on_finding=lambda f: print(f.line(), flush=True))
    except (MetaqError, OSError) as exc:
        print("metaq-server --verify: cannot verify %s: %s" % (data_dir, exc), file=sys.stderr)
        return EXIT_USAGE
    print(report.summary())
    return EXIT_ERROR if report.corrupt else EXIT_OK


def run(config):
    from metaq.server.broker import Broker

    # The handlers are in place before the broker says it is ready, so a SIGTERM sent as soon as the ready line is
    # read stops it cleanly; one that comes while it is still starting ends the process at once, as it always did.
    holder = []

    def on_signal(signum, signame):
        log.info("received %s", signame)
        if holder and holder[0].ready:
            gevent.spawn(holder[0].stop)
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    gevent.signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM, "SIGTERM")
    gevent.signal_handler(signal.SIGINT, on_signal, signal.SIGINT, "SIGINT")
    try:
        broker = Broker(config)
        holder.append(broker)
        broker.start()
    except ConfigError as exc:  # a port in use...: the user's to fix, as a bad setting is
        log.error("cannot start: %s", exc)
        return EXIT_USAGE
    except CorruptLog as exc:
        log.error("refusing to start: %s (run with --force-recovery to cut the log there)", exc)
        return EXIT_ERROR
    except (MetaqError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_ERROR

    broker.stopped.wait()
    return EXIT_OK if broker.stopped_cleanly else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
