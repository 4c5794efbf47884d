"""Where a deployed broker keeps its files, relative to its install dir (``install_dir`` in the inventory).

    <install_dir>/
        .metaq-deploy.json           what the last successful deploy installed (package and config checksums)
        wheels/                      the uploaded wheels of the current package (metaq + dependencies + pip)
        releases/<package-id>/venv   one virtualenv per package, never changed after it is built
        current -> releases/<id>     switched atomically once a release is installed
        conf/server.yaml             the broker's configuration, rendered from the inventory
        conf/metaq-<name>.service    its systemd unit (metaq/deploy/units.py), installed where systemd runs
        run/metaq.pid                the running broker's pid
        run/metaq.json               its pid, address and release, as it was started
        log/metaq.log                the broker's stdout and stderr

The data directory (``data_dir`` in the inventory) lives elsewhere and survives ``uninstall``.
A running broker keeps the release it was started from (its real path, not ``current``),
so a deploy never changes the code under a running broker: a restart picks the new one up.
"""

import posixpath

STATE = ".metaq-deploy.json"
WHEELS = "wheels"
RELEASES = "releases"
CURRENT = "current"
CONFIG = "conf/server.yaml"
PIDFILE = "run/metaq.pid"
RUNINFO = "run/metaq.json"
LOG = "log/metaq.log"
VENV = "venv"

# Length of the package id (a prefix of the package's sha256) used as the release directory name.
RELEASE_ID_CHARS = 12


class Layout:
    """Absolute paths of one install dir (POSIX paths: they name files on the host)."""

    def __init__(self, home):
        self.home = home

    def path(self, *parts):
        return posixpath.join(self.home, *parts)

    @property
    def state(self):
        return self.path(STATE)

    @property
    def wheels(self):
        return self.path(WHEELS)

    @property
    def releases(self):
        return self.path(RELEASES)

    @property
    def current(self):
        return self.path(CURRENT)

    @property
    def config(self):
        return self.path(CONFIG)

    @property
    def pidfile(self):
        return self.path(PIDFILE)

    @property
    def runinfo(self):
        return self.path(RUNINFO)

    @property
    def log(self):
        return self.path(LOG)

    def release(self, release_id):
        return self.path(RELEASES, release_id)

    def venv(self, release_id=None):
        """The virtualenv of a release, or of ``current`` when no release is named."""
        base = self.release(release_id) if release_id else self.current
        return posixpath.join(base, VENV)

    def python(self, release_id=None):
        return posixpath.join(self.venv(release_id), "bin", "python")

    def server_script(self, release_id=None):
        return posixpath.join(self.venv(release_id), "bin", "metaq-server")

    def unit(self, broker_name):
        """The copy of the broker's systemd unit kept with its configuration."""
        return self.path("conf", "metaq-%s.service" % broker_name)

    def agent(self):
        """The command prefix that runs the agent from the current release."""
        return [self.python(), "-m", "metaq.deploy.agent"]
