"""Commands the control machine runs on a host, built here as strings (every argument quoted).

``facts_command`` runs before metaq is installed there, with the host's own Python (3.6 or
later), and prints one JSON object: that Python's version and machine, what the last deploy
recorded, the checksum of the server.yaml in place, the wheels already uploaded, the release
a running broker uses, the user, whether systemd is the host's init and the checksums of the
broker's systemd unit (its copy under conf/ and the installed one). ``deploy`` decides everything
from it in one round trip.
"""

import shlex

from metaq.deploy.layout import Layout
from metaq.deploy.units import installed_path

_FACTS = r"""
import hashlib, json, os, platform, pwd, sys
home, config, pidfile, wheels, current, state, unit, installed_unit = sys.argv[1:9]
def sha(path):
    try:
        with open(path, 'rb') as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
pid = running = None
try:
    with open(pidfile) as f:
        pid = int(f.read().strip())
    with open('/proc/%d/stat' % pid) as f:
        st = f.read()
    with open('/proc/%d/cmdline' % pid, 'rb') as f:
        argv = f.read().decode('utf-8', 'replace').split('\0')
    if st[st.rfind(')') + 2:][:1] not in 'ZX' and config in argv:
        running = next((a.split('/releases/')[1].split('/')[0] for a in argv if '/releases/' in a), '?')
    else:
        pid = None
except (OSError, ValueError):
    pid = None
names = sorted(os.listdir(wheels)) if os.path.isdir(wheels) else []
rel = os.path.join(home, 'releases')
releases = dict((r, os.path.exists(os.path.join(rel, r, '.complete')))
                for r in (os.listdir(rel) if os.path.isdir(rel) else []))
print(json.dumps({
    'python': '%d.%d' % sys.version_info[:2], 'machine': platform.machine(),
    'home': os.path.isdir(home), 'state': load(state), 'config_sha256': sha(config),
    'current': os.path.basename(os.path.realpath(current)) if os.path.exists(current) else None,
    'current_ok': os.access(os.path.join(current, 'venv', 'bin', 'python'), os.X_OK),
    'wheels': dict((n, sha(os.path.join(wheels, n))) for n in names if n.endswith('.whl')),
    'releases': releases,
    'pid': pid, 'running_release': running,
    'user': pwd.getpwuid(os.getuid()).pw_name, 'root': os.getuid() == 0,
    'systemd': os.path.isdir('/run/systemd/system'),
    'unit_sha256': sha(unit), 'installed_unit_sha256': sha(installed_unit),
}))
"""


def q(*args):
    """A shell command line of ``args``, each quoted."""
    return " ".join(shlex.quote(str(a)) for a in args)


def facts_command(python, home, broker_name):
    layout = Layout(home)
    return q(python, "-c", _FACTS, layout.home, layout.config, layout.pidfile, layout.wheels, layout.current,
             layout.state, layout.unit(broker_name), installed_path(broker_name))


def agent_command(home, command, *options):
    layout = Layout(home)
    return q(*layout.agent(), command, "--home", layout.home, *options)


def pip_install_command(python, pip_wheel, wheel_paths, find_links):
    """Install exactly these wheels with pip run from its own wheel: no index, no config files, no network."""
    options = ["--isolated", "--disable-pip-version-check", "install", "--quiet", "--no-index",
               "--find-links", find_links]
    version = tuple(int(x) for x in pip_wheel.rsplit("/", 1)[-1].split("-")[1].split(".")[:2] if x.isdigit())
    if version >= (22, 1):
        options.append("--root-user-action=ignore")  # installing as root into a virtualenv is what we mean
    return q(python, pip_wheel + "/pip", *options, *wheel_paths)
