"""The package ``deploy`` ships: the metaq wheel, its dependencies' wheels and pip, built once per run.

Hosts install from these wheels with ``pip --isolated install --no-index``: no host needs a
package index, and a deploy is as fast and as reproducible as a copy. Dependencies are pinned to
the versions installed beside fab (the ones the tests ran with).

The cache (``$METAQ_DEPLOY_CACHE``, default ``~/.cache/metaq-deploy``) makes a run after the
first one offline and quick:

    package/<source digest>/metaq-<version>-py3-none-any.whl   built from this checkout; the
        build date is fixed (SOURCE_DATE_EPOCH), so the same sources give the same bytes and
        the same package checksum, which is how a second deploy knows it has nothing to do
    wheels/   dependency wheels (gevent, pydantic, ...), fetched once from your package index
"""

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from typing import Tuple

from metaq.errors import MetaqError

__all__ = ["Bundle", "BundleError", "build_bundle", "default_cache_dir", "source_digest"]

# 1980-01-01: the earliest date a zip entry can carry; fixed so a rebuild gives identical bytes.
SOURCE_DATE_EPOCH = "315532800"
_TOP_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md")
_PACKAGE = "metaq"


class BundleError(MetaqError):
    """The package or its dependencies could not be built on this machine."""


@dataclass(frozen=True)
class Wheel:
    filename: str
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Bundle:
    version: str
    wheels: Tuple[Wheel, ...]  # sorted by file name: metaq, its dependencies and pip
    python: str  # "3.11": the hosts' Python must be this minor version ...
    machine: str  # ... on this machine type (the dependency wheels are binary)
    seconds: float  # how long building or finding it took

    @property
    def sha256(self):
        """The package checksum: of every wheel's name and content."""
        lines = "".join("%s  %s\n" % (w.sha256, w.filename) for w in self.wheels)
        return hashlib.sha256(lines.encode()).hexdigest()

    @property
    def id(self):
        from metaq.deploy.layout import RELEASE_ID_CHARS

        return self.sha256[:RELEASE_ID_CHARS]

    @property
    def pip(self):
        return next(w for w in self.wheels if w.filename.startswith("pip-"))

    @property
    def installs(self):
        """The wheels that go into the virtualenv (everything but pip, which runs from its wheel)."""
        return [w for w in self.wheels if w is not self.pip]

    @property
    def size(self):
        return sum(w.size for w in self.wheels)


def default_cache_dir():
    explicit = os.environ.get("METAQ_DEPLOY_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "metaq-deploy")


def build_bundle(source_dir, cache_dir=None, say=print):
    """Build (or find in the cache) the metaq wheel of ``source_dir`` and the wheels it needs."""
    started = time.monotonic()
    cache_dir = cache_dir or default_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    package = _metaq_wheel(source_dir, cache_dir, say)
    paths = [package] + _dependency_wheels(package, cache_dir, say)
    wheels = tuple(sorted((_wheel(p) for p in paths), key=lambda w: w.filename))
    version = os.path.basename(package).split("-")[1]
    return Bundle(version, wheels, "%d.%d" % sys.version_info[:2], platform.machine(), time.monotonic() - started)


def _wheel(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return Wheel(os.path.basename(path), path, h.hexdigest(), os.path.getsize(path))


def source_files(source_dir):
    """The files the package is built from (relative paths, sorted)."""
    files = [name for name in _TOP_FILES if os.path.isfile(os.path.join(source_dir, name))]
    for top, dirs, names in os.walk(os.path.join(source_dir, _PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in names:
            if not name.endswith((".pyc", ".pyo")):
                files.append(os.path.relpath(os.path.join(top, name), source_dir))
    return sorted(files)


def source_digest(source_dir):
    h = hashlib.sha256()
    for rel in source_files(source_dir):
        with open(os.path.join(source_dir, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _metaq_wheel(source_dir, cache_dir, say):
    digest = source_digest(source_dir)[:16]
    dest = os.path.join(cache_dir, "package", digest)
    found = sorted(n for n in os.listdir(dest) if n.endswith(".whl")) if os.path.isdir(dest) else []
    if found:
        return os.path.join(dest, found[0])
    say("building the metaq wheel from %s ..." % source_dir)
    with tempfile.TemporaryDirectory(prefix="metaq-build-") as tmp:
        # Build from a copy: the checkout gets no build/ or egg-info litter, and only packaged files count.
        src = os.path.join(tmp, "src")
        for rel in source_files(source_dir):
            os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
            shutil.copy2(os.path.join(source_dir, rel), os.path.join(src, rel))
        out = os.path.join(tmp, "out")
        cmd = _pip("wheel", "--no-deps", "-w", out, src)
        if _can_build_here():
            cmd.append("--no-build-isolation")  # offline: this interpreter's setuptools builds it
        _run(cmd, "building the metaq wheel", env=dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH))
        built = [n for n in os.listdir(out) if n.endswith(".whl")]
        if len(built) != 1:
            raise BundleError("building the metaq wheel gave %r, expected one wheel" % built)
        os.makedirs(dest, exist_ok=True)
        shutil.move(os.path.join(out, built[0]), os.path.join(dest, built[0]))
    return os.path.join(dest, built[0])


def _can_build_here():
    """True when this interpreter can build a wheel without fetching build tools."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _constraints():
    """``name==version`` for every distribution installed here (so hosts get the tested versions)."""
    pins = set()
    for dist in importlib.metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and version and name.lower() != _PACKAGE:
            pins.add("%s==%s" % (name, version))
    return "\n".join(sorted(pins)) + "\n"


def _requirements(package):
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(package) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    return [line for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _dependency_wheels(package, cache_dir, say):
    """The wheels ``package`` needs (and pip), pinned by the local versions; resolved once per inputs."""
    wheels = os.path.join(cache_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    pins = _constraints()
    key = hashlib.sha256("\n".join(_requirements(package) + [pins, sys.version, platform.machine()])
                         .encode()).hexdigest()[:16]
    resolved = os.path.join(cache_dir, "resolved", key)
    if os.path.exists(resolved):
        with open(resolved) as f:
            names = f.read().split()
        if all(os.path.exists(os.path.join(wheels, n)) for n in names):
            return [os.path.join(wheels, n) for n in names]
    with tempfile.TemporaryDirectory(prefix="metaq-wheels-") as tmp:
        constraints = os.path.join(tmp, "constraints.txt")
        with open(constraints, "w") as f:
            f.write(pins)
        out = os.path.join(tmp, "out")
        cmd = _pip("wheel", "-w", out, "--find-links", wheels, "-c", constraints, package, "pip")
        offline = subprocess.run(cmd + ["--no-index"], capture_output=True, text=True)
        if offline.returncode != 0:
            say("fetching dependency wheels into %s (once; later runs are offline) ..." % wheels)
            _run(cmd, "fetching the dependency wheels")
        names = sorted(n for n in os.listdir(out) if n.endswith(".whl") and n != os.path.basename(package))
        for name in names:
            if not os.path.exists(os.path.join(wheels, name)):
                shutil.move(os.path.join(out, name), os.path.join(wheels, name))
    os.makedirs(os.path.dirname(resolved), exist_ok=True)
    with open(resolved + ".tmp", "w") as f:
        f.write("\n".join(names) + "\n")
    os.replace(resolved + ".tmp", resolved)
    return [os.path.join(wheels, n) for n in names]


def _pip(*args):
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]


def _run(cmd, what, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BundleError("%s failed (exit %d): %s\n%s" % (what, proc.returncode, " ".join(cmd), tail))
    return proc
