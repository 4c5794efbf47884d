"""A real PostgreSQL server (Debian's package) as a plain process on 127.0.0.1, for tests.

``PostgresProcess().start()`` runs ``initdb`` into a fresh temporary directory, then
``postgres -D <dir> -p <free port> -k <dir>/sock`` with ``listen_addresses=127.0.0.1``,
``max_prepared_transactions`` > 0 (two-phase commit) and ``fsync=off``, waits until it
accepts connections, and creates the login role the tests use (trust authentication).
It never touches the system cluster that Debian's package may have set up.

PostgreSQL refuses to run as root, so when the tests run as root both ``initdb`` and
``postgres`` run as the ``postgres`` system user (``Popen(user=...)``: the PID we hold is
the postmaster's own). ``stop()`` (fast shutdown, SIGINT) and ``kill()`` (SIGKILL) act on
that PID; ``start()`` again reuses the port and the data directory; ``cleanup()`` removes
the directory.

``create_database()`` makes a fresh database from ``template0`` and returns its name;
``drop_database(name)`` first rolls back the prepared transactions left in it, so one
test's in-doubt branches never fill another test's ``max_prepared_transactions`` slots.
"""

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

from metaq.client.local import free_port, read_text

PG_LIB = "/usr/lib/postgresql"
SYSTEM_USER = "postgres"   # the Debian package's system user, used only when we are root
SUPERUSER = "postgres"     # the cluster's bootstrap superuser (initdb -U)
TEST_ROLE = "metaq"        # the role tests connect as: LOGIN CREATEDB, trust auth


def pg_bindir():
    """The newest ``/usr/lib/postgresql/<ver>/bin`` that has ``initdb`` and ``postgres``."""
    found = []
    for d in glob.glob(os.path.join(PG_LIB, "*", "bin")):
        ver = os.path.basename(os.path.dirname(d))
        if ver.isdigit() and all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres")):
            found.append((int(ver), d))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (no %s/<ver>/bin/initdb): run `make test`, "
                           "which installs Debian's postgresql package" % PG_LIB)
    return max(found)[1]


def _psycopg():
    try:
        import psycopg
    except ImportError as exc:  # the test extra installs it
        raise RuntimeError("psycopg is not installed: run `make test` (pip install -e '.[test]')") from exc
    return psycopg


class PostgresProcess:
    """One private PostgreSQL cluster; see the module docstring."""

    def __init__(self, workdir=None, port=None, max_prepared_transactions=20, extra_settings=None):
        self.as_user = SYSTEM_USER if os.geteuid() == 0 else None
        self.workdir = str(workdir) if workdir else tempfile.mkdtemp(prefix="metaq-pg-")
        self._own_workdir = workdir is None
        self.data_dir = os.path.join(self.workdir, "data")
        self.socket_dir = os.path.join(self.workdir, "sock")
        self.log_path = os.path.join(self.workdir, "postgres.log")
        self.port = port or free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "max_prepared_transactions": str(max_prepared_transactions),
            "max_connections": "60",
            "shared_buffers": "16MB",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "logging_collector": "off",
        }
        self.settings.update(extra_settings or {})
        self.bindir = None
        self.proc = None

    # -- process ---------------------------------------------------------------------------------------

    def _popen_kwargs(self):
        kw = {"cwd": self.workdir, "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
                                          "LANG": "C.UTF-8", "TZ": "UTC"}}
        if self.as_user:
            pw = pwd.getpwnam(self.as_user)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            kw["env"]["HOME"] = pw.pw_dir
        return kw

    def _chown(self, path):
        if self.as_user:
            pw = pwd.getpwnam(self.as_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _initdb(self):
        os.makedirs(self.socket_dir, exist_ok=True)
        for p in (self.workdir, self.socket_dir):
            self._chown(p)
        os.chmod(self.workdir, 0o755)
        cmd = [os.path.join(self.bindir, "initdb"), "-D", self.data_dir, "-U", SUPERUSER, "--auth=trust",
               "-E", "UTF8", "--locale=C", "--no-sync"]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                             **self._popen_kwargs())
        if out.returncode != 0:
            raise RuntimeError("initdb failed (%s):\n%s" % (out.returncode, out.stdout.decode("utf-8", "replace")))
        with open(os.path.join(self.data_dir, "pg_hba.conf"), "w") as f:
            f.write("local all all trust\nhost all all 127.0.0.1/32 trust\n")

    def start(self, timeout=60.0):
        """initdb on first use, start the postmaster, wait until it serves; returns self."""
        if self.bindir is None:
            self.bindir = pg_bindir()
        if not os.path.exists(os.path.join(self.data_dir, "PG_VERSION")):
            self._initdb()
            first = True
        else:
            first = False
        cmd = [os.path.join(self.bindir, "postgres"), "-D", self.data_dir, "-p", str(self.port),
               "-k", self.socket_dir]
        for name, value in self.settings.items():
            cmd += ["-c", "%s=%s" % (name, value)]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **self._popen_kwargs())
        log.close()
        self._wait_ready(timeout)
        if first:
            self._create_role()
        return self

    def _wait_ready(self, timeout):
        psycopg = _psycopg()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited with %s:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                psycopg.connect(self.dsn("postgres", SUPERUSER), connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    self.kill()
                    raise RuntimeError("postgres did not serve within %.0f s on port %d:\n%s"
                                       % (timeout, self.port, self.log_text())) from exc
                time.sleep(0.05)

    def log_text(self):
        return read_text(self.log_path)

    def _signal(self, sig, timeout):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout=30.0):
        """Fast shutdown (SIGINT): open sessions are rolled back, prepared transactions are kept."""
        self._signal(signal.SIGINT, timeout)

    def kill(self):
        """SIGKILL the postmaster (its backends notice and exit by themselves)."""
        self._signal(signal.SIGKILL, 10)

    def cleanup(self):
        """Stop the server and remove the directory this harness created."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- SQL side --------------------------------------------------------------------------------------

    def dsn(self, dbname, user=TEST_ROLE):
        """A libpq connection string for ``dbname`` over TCP on 127.0.0.1."""
        return "host=127.0.0.1 port=%d user=%s dbname=%s" % (self.port, user, dbname)

    def admin(self, dbname="postgres"):
        """An autocommit superuser connection (psycopg); the caller closes it."""
        return _psycopg().connect(self.dsn(dbname, SUPERUSER), autocommit=True)

    def _create_role(self):
        with self.admin() as conn:
            conn.execute("CREATE ROLE %s LOGIN CREATEDB" % TEST_ROLE)

    def create_database(self, name=None):
        """A fresh database owned by the test role, from template0; returns its name."""
        name = name or "t_" + uuid.uuid4().hex[:12]
        with self.admin() as conn:
            conn.execute("CREATE DATABASE %s OWNER %s TEMPLATE template0" % (name, TEST_ROLE))
        return name

    def prepared_xacts(self, dbname=None):
        """``[(gid, database)]`` of the prepared transactions (of one database, or all)."""
        with self.admin() as conn:
            rows = conn.execute("SELECT gid, database FROM pg_prepared_xacts ORDER BY gid").fetchall()
        return [r for r in rows if dbname is None or r[1] == dbname]

    def drop_database(self, name):
        """Roll back the prepared transactions left in ``name``, then drop it (closing its sessions)."""
        gids = [gid for gid, _db in self.prepared_xacts(name)]
        if gids:
            with self.admin(name) as conn:
                for gid in gids:
                    conn.execute("ROLLBACK PREPARED %s" % _literal(gid))
        with self.admin() as conn:
            conn.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


def _literal(text):
    """A SQL string literal (for utility commands that take no parameters)."""
    return "'" + text.replace("'", "''") + "'"


__all__ = ["PostgresProcess", "pg_bindir", "TEST_ROLE"]
