"""The cluster inventory (``conf/cluster.yaml``): validated with pydantic, one server.yaml rendered per broker.

    cluster: orders-prod
    defaults:                      # any broker setting; a broker's own value wins
      ssh_user: deploy
      install_dir: /opt/metaq
      data_dir: /var/lib/metaq
      zk_connect: zk1:2181,zk2:2181/metaq
      server: {store: {flush: sync}}
    brokers:
      - {name: b0, host: 10.0.0.11, broker_id: 0}
      - {name: b1, host: 10.0.0.12, broker_id: 1}

A master and its slaves (``role: slave`` + ``master: <name>``, same broker id) form a replication group
rendered as a pair (``replication:`` of server.yaml; docs/deploy.md):

    defaults: {ha: manual, replication_mode: async}      # ha: auto elects the master through ZooKeeper
    brokers:
      - {name: m0, host: 10.0.0.11, broker_id: 0}                      # replication port 8124 (port + 1)
      - {name: s0, host: 10.0.0.21, role: slave, master: m0}           # slave_id 1, slave_of 10.0.0.11:8124

``per_host:`` (metaq/deploy/placement.py) adds N brokers on each of its hosts, one per core by default (the
caller's ``cores(host, ssh)`` tells, fab asks each host over SSH), master/slave groups spread over the hosts:

    per_host: {hosts: [10.0.0.11, 10.0.0.12], slaves: 1}

``credentials:`` (a default or per broker) is the path, on the broker's host, of a credentials file
(``metaq.client.security``: YAML with user, secret_file, tls; mode 0600) the deploy agent's probe
authenticates with when the broker has authentication on; fab passes only that path.

Every problem is reported at once, each with where it is (``brokers[1] (b1).port: ...``).
A rendered server.yaml is also validated with the broker's own config model, so
``deploy`` never uploads a configuration the broker would refuse.
"""

import dataclasses
import hashlib
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from metaq import limits
from metaq.deploy.groups import replication_settings, resolve_groups
from metaq.deploy.placement import SERVER_PORTS
from metaq.errors import ConfigError
from metaq.protocol.registration import mqtt_membership

__all__ = ["Broker", "Cluster", "InventoryError", "load_inventory", "parse_inventory", "ports"]

# Paths on a host: absolute, normalised, plain characters only (they end up in shell commands,
# quoted, and uninstall removes install_dir, so "/" or "/opt" must never be one).
_SAFE_PATH = re.compile(r"^(/[A-Za-z0-9._+-]+){2,}$")
_SAFE_WORD = re.compile(r"^[A-Za-z0-9._@+/:-]+$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

# server.yaml settings the inventory owns (set them on the broker, not under `server:`).
_OWNED = {
    ("broker", "id"): "broker_id",
    ("broker", "host"): "listen",
    ("broker", "port"): "port",
    ("broker", "data_dir"): "data_dir",
    ("zk", "connect"): "zk_connect",
    ("replication", "role"): "role",
    ("replication", "slave_of"): "master",
    ("replication", "slave_id"): "slave_id",
    ("replication", "port"): "replication_port",
    ("replication", "mode"): "replication_mode",
    ("replication", "ha"): "ha",
}

BUILTIN_DEFAULTS = {
    "ssh_user": None,  # None: Fabric's default (your local user name, or ~/.ssh/config)
    "ssh_port": 22,
    "ssh_key": None,  # None: fab -i KEY, an ssh-agent or ~/.ssh keys
    "ssh_timeout_s": 10.0,
    "python": "python3",
    "install_dir": "/opt/metaq",
    "data_dir": "/var/lib/metaq",
    "port": 8123,
    "zk_connect": None,
    "start_timeout_s": 60.0,
    "stop_timeout_s": 60.0,
    "credentials": None,  # a credentials file ON THE HOST for the agent's probe (metaq.client.security)
    "replication_port": None,  # None: port + 1, for a broker of a replication group (or any broker in ha: auto)
    "replication_mode": "async",
    "ha": "manual",
    "catch_up_timeout_s": 300.0,  # rolling-restart: how long a restarted slave may take to catch up
    "handover_timeout_s": 60.0,  # rolling-restart in ha: auto: how long the election of a new master may take
    "server": {},
}


class InventoryError(ConfigError):
    """The inventory is missing, not YAML, or invalid; the message lists every problem."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Settings(_Model):
    """What ``defaults:`` may set and every broker may override (None = inherit)."""

    ssh_user: Optional[str] = Field(None, min_length=1)
    ssh_port: Optional[int] = Field(None, ge=1, le=65535)
    ssh_key: Optional[str] = Field(None, min_length=1)
    ssh_timeout_s: Optional[float] = Field(None, gt=0)
    python: Optional[str] = None
    install_dir: Optional[str] = None
    data_dir: Optional[str] = None
    port: Optional[int] = Field(None, ge=1, le=65535)
    zk_connect: Optional[str] = None
    start_timeout_s: Optional[float] = Field(None, gt=0)
    stop_timeout_s: Optional[float] = Field(None, gt=0)
    credentials: Optional[str] = None
    replication_port: Optional[int] = Field(None, ge=1, le=65535)
    replication_mode: Optional[Literal["async", "sync"]] = None
    ha: Optional[Literal["manual", "auto"]] = None
    catch_up_timeout_s: Optional[float] = Field(None, gt=0)
    handover_timeout_s: Optional[float] = Field(None, gt=0)
    server: Optional[Dict[str, Any]] = None

    @field_validator("install_dir", "data_dir", "credentials")
    @classmethod
    def _host_path(cls, value):
        if value is None:
            return value
        value = value.rstrip("/") or "/"
        if posixpath.normpath(value) != value or not _SAFE_PATH.match(value):
            raise ValueError("must be an absolute path at least two levels deep (such as /opt/metaq), "
                             "of letters, digits and . _ + - only, got %r" % value)
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value):
        if value is not None and not _SAFE_WORD.match(value):
            raise ValueError("must be a command or path without spaces, got %r" % value)
        return value

    @field_validator("server")
    @classmethod
    def _server(cls, value):
        if value is None:
            return value
        for (section, key), field_name in _OWNED.items():
            if isinstance(value.get(section), dict) and key in value[section]:
                raise ValueError("%s.%s is set from the inventory: set `%s` instead" % (section, key, field_name))
        return value


class BrokerEntry(Settings):
    """One broker as written under ``brokers:``."""

    name: Optional[str] = None
    host: str = Field(min_length=1)
    listen: Optional[str] = None
    broker_id: Optional[int] = Field(None, ge=0, le=limits.MAX_BROKER_ID)
    role: Literal["master", "slave"] = "master"
    master: Optional[str] = None
    slave_id: Optional[int] = Field(None, ge=1, le=limits.MAX_BROKER_ID)

    @field_validator("name")
    @classmethod
    def _name(cls, value):
        if value is not None and not _NAME.match(value):
            raise ValueError("must be 1-64 letters, digits, '.', '_' or '-', got %r" % value)
        return value

    @field_validator("host", "listen")
    @classmethod
    def _address(cls, value):
        if value is not None and not _SAFE_WORD.match(value):
            raise ValueError("must be a host name or address, got %r" % value)
        return value


class PerHost(_Model):
    """``per_host:``: N brokers on each of ``hosts``, master/slave groups spread over them (deploy/placement.py)."""

    hosts: List[str] = Field(min_length=1)
    brokers: Optional[int] = Field(None, ge=1)  # None: one per core of each host (fab asks: nproc)
    slaves: int = Field(0, ge=0)
    port_step: int = Field(10, ge=2)  # at least the text and the replication port apart
    first_broker_id: int = Field(0, ge=0, le=limits.MAX_BROKER_ID)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value):
        for host in value:
            if not _SAFE_WORD.match(host):
                raise ValueError("must be host names or addresses, got %r" % host)
        if len(set(value)) != len(value):
            raise ValueError("a host is named twice: %s" % ", ".join(sorted({h for h in value if value.count(h) > 1})))
        return value


class InventoryFile(_Model):
    cluster: str = Field("metaq", min_length=1)
    defaults: Settings = Settings()
    per_host: Optional[PerHost] = None
    brokers: List[BrokerEntry] = []


@dataclass(frozen=True)
class Broker:
    """One broker with every setting resolved, and its rendered server.yaml."""

    index: int
    name: str
    host: str
    listen: str
    role: str
    master: Optional[str]
    broker_id: int
    port: int
    ssh_user: Optional[str]
    ssh_port: int
    ssh_key: Optional[str]
    ssh_timeout_s: float
    python: str
    install_dir: str
    data_dir: str
    zk_connect: Optional[str]
    start_timeout_s: float
    stop_timeout_s: float
    credentials: Optional[str]
    replication_port: Optional[int]  # None: no replication listener (a master alone in ha: manual)
    replication_mode: str
    ha: str
    catch_up_timeout_s: float
    handover_timeout_s: float
    server: Dict[str, Any] = field(repr=False)
    slave_id: Optional[int] = None  # a slave's id; in ha: auto every member's (the master's is 0)
    slave_of: Optional[str] = None  # a slave in ha: manual: its master's replication HOST:PORT
    group: Optional[str] = None  # the name of the group's master (the broker's own for a master)
    config_text: str = field(default="", repr=False)

    @property
    def label(self):
        """``b0 (root@10.0.0.11:22)``: how reports name this broker."""
        user = "%s@" % self.ssh_user if self.ssh_user else ""
        return "%s (%s%s:%d)" % (self.name, user, self.host, self.ssh_port)

    @property
    def config_sha256(self):
        return hashlib.sha256(self.config_text.encode("utf-8")).hexdigest()

    @property
    def url(self):
        return "meta://%s:%d" % (self.listen, self.port)

    @property
    def role_text(self):
        """How ``fab check`` shows the role: ``master``, ``slave of m0``, ``ha auto, member 1 of m0``."""
        if self.ha == "auto":
            return "ha auto, member %d of %s" % (self.slave_id, self.group)
        return self.role if self.role == "master" else "slave of %s" % self.master


@dataclass(frozen=True)
class Cluster:
    name: str
    brokers: List[Broker]
    source: str = "<inventory>"
    notes: tuple = ()  # what an operator should know of the inventory (``per_host`` slots left empty)

    def select(self, only=None):
        """The brokers named in ``only`` ("b0,b1" or a list), in inventory order; all when None."""
        if not only:
            return list(self.brokers)
        wanted = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
        known = {b.name for b in self.brokers}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise InventoryError("%s: no broker named %s (brokers: %s)" % (
                self.source, ", ".join(repr(n) for n in unknown), ", ".join(b.name for b in self.brokers)))
        return [b for b in self.brokers if b.name in wanted]

    def members(self, broker):
        """The brokers of ``broker``'s replication group (its master first, then the slaves in inventory order)."""
        return sorted((b for b in self.brokers if b.group == broker.group), key=lambda b: b.role != "master")


def load_inventory(path, cores=None):
    """Read and validate an inventory file; InventoryError with every problem otherwise. ``cores(host, ssh)``:
    the number of cores of ``host`` (``ssh``: the defaults' ssh_* settings), asked for ``per_host`` without
    ``brokers``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise InventoryError("cannot read the inventory %s: %s (copy conf/cluster.yaml and edit it, or set "
                             "METAQ_INVENTORY)" % (path, exc.strerror or exc)) from None
    return parse_inventory(text, str(path), cores)


def parse_inventory(text, source="<inventory>", cores=None):
    from metaq.server.config import DuplicateKey, UniqueKeyLoader  # a key written twice is refused, as in server.yaml

    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)
    except DuplicateKey as exc:
        raise InventoryError("%s, %s" % (source, exc)) from None
    except yaml.YAMLError as exc:
        raise InventoryError("%s is not valid YAML: %s" % (source, exc)) from None
    if not isinstance(data, dict):
        raise InventoryError("%s: expected a mapping with `brokers:` (and optionally `cluster:`, `defaults:`)"
                             % source)
    try:
        parsed = InventoryFile.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(_report(source, [_describe(err, data) for err in exc.errors()])) from None
    notes = ()
    if parsed.per_host is not None:
        parsed, notes = _per_host(parsed, source, cores)
    elif not parsed.brokers:
        raise InventoryError("%s is invalid:\n  brokers: list at least one broker (or give per_host:)" % source)
    brokers, problems = _resolve(parsed)
    problems += _cross_check(brokers)
    if problems:
        raise InventoryError(_report(source, problems))
    return Cluster(parsed.cluster, brokers, source, notes)


def _per_host(parsed, source, cores):
    """``parsed`` with ``per_host``'s brokers after those of ``brokers:`` (deploy/placement.py); (parsed, notes)."""
    from metaq.deploy.placement import expand

    ph = parsed.per_host
    defaults = dict(BUILTIN_DEFAULTS)
    defaults.update({k: v for k, v in parsed.defaults.model_dump().items() if v is not None})
    if ph.brokers is None and cores is None:
        raise InventoryError("%s is invalid:\n  per_host.brokers: null means one broker per core of each host, "
                             "which fab asks the hosts; give a number here" % source)
    ssh = {k: defaults[k] for k in ("ssh_user", "ssh_port", "ssh_key", "ssh_timeout_s")}
    slots = [ph.brokers if ph.brokers is not None else cores(host, ssh) for host in ph.hosts]
    entries, unused = expand(ph.model_dump(), defaults, slots)
    notes = ["per_host: %d brokers on %s (%s); %d groups of a master and %d slaves" % (
        len(entries), ", ".join(ph.hosts), ", ".join(str(n) for n in slots),
        sum(1 for e in entries if e["role"] == "master"), ph.slaves)]
    if unused:
        notes.append("per_host: %d slots left empty: no whole group of %d fits in them with each slave on another "
                     "host than its master" % (unused, 1 + ph.slaves))
    try:
        extra = [BrokerEntry.model_validate(e) for e in entries]
    except ValidationError as exc:
        raise InventoryError(_report(source, ["per_host: %s" % _describe(err, {}) for err in exc.errors()])) from None
    return parsed.model_copy(update={"brokers": list(parsed.brokers) + extra}), tuple(notes)


def _report(source, problems):
    return "%s is invalid:\n  %s" % (source, "\n  ".join(problems))


def _describe(err, data):
    loc = list(err["loc"])
    where = []
    if len(loc) >= 2 and loc[0] == "brokers" and isinstance(loc[1], int):
        entry = data.get("brokers")[loc[1]]
        name = entry.get("name") or entry.get("host") if isinstance(entry, dict) else None
        where.append("brokers[%d]%s" % (loc[1], " (%s)" % name if name else ""))
        loc = loc[2:]
    where.extend(str(p) if not isinstance(p, int) else "[%d]" % p for p in loc)
    return "%s: %s" % (".".join(where).replace(".[", "["), _message(err))


def _message(err):
    """pydantic's message without its "Value error, " prefix (our validators' messages stand alone)."""
    msg = err["msg"]
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


def _merge(base, over):
    """``over`` deep-merged onto ``base`` (mappings merge, anything else replaces)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _resolve(parsed):
    """Every broker with defaults applied and its server.yaml rendered; (brokers, problems)."""
    defaults = dict(BUILTIN_DEFAULTS)
    defaults.update({k: v for k, v in parsed.defaults.model_dump().items() if v is not None})
    masters = {e.name or e.host: e for e in parsed.brokers if e.role == "master"}
    brokers, problems = [], []
    for i, entry in enumerate(parsed.brokers):
        name = entry.name or entry.host
        where = "brokers[%d] (%s)" % (i, name)
        values = dict(defaults)
        values.update({k: v for k, v in entry.model_dump().items() if v is not None and k in defaults})
        values["server"] = _merge(defaults["server"], entry.server or {})
        broker_id = entry.broker_id
        if entry.role == "master":
            if entry.master is not None:
                problems.append("%s.master: only a slave names its master" % where)
            if entry.slave_id is not None:
                problems.append("%s.slave_id: only a slave has one (in ha: auto the master's member id is 0)" % where)
            if broker_id is None:
                problems.append("%s.broker_id: required for a master (0..%d, unique in the cluster)"
                                % (where, limits.MAX_BROKER_ID))
                continue
        else:
            master = masters.get(entry.master) if entry.master else None
            if master is None:
                problems.append("%s.master: a slave names its master broker (one of: %s)"
                                % (where, ", ".join(masters) or "no masters"))
                continue
            if broker_id is not None and broker_id != master.broker_id:
                problems.append("%s.broker_id: a slave has its master's id (%s)" % (where, master.broker_id))
            broker_id = master.broker_id
            if broker_id is None:
                continue
        brokers.append(Broker(index=i, name=name, host=entry.host, listen=entry.listen or entry.host,
                              role=entry.role, master=entry.master, broker_id=broker_id, slave_id=entry.slave_id,
                              group=name if entry.role == "master" else entry.master, **values))
    brokers, refused = resolve_groups(brokers, problems)
    rendered = []
    for broker in brokers:
        if broker.index not in refused:  # a group problem is reported once, not again as the broker's refusal
            try:
                broker = _with_config(broker, render_server_config(broker, parsed.cluster))
            except InventoryError as exc:
                problems.append("%s.server: %s" % (_where(broker), exc))
        rendered.append(broker)  # even with a bad server section: the clash checks still see it
    return rendered, problems


def _where(broker):
    return "brokers[%d] (%s)" % (broker.index, broker.name)


def _with_config(broker, text):
    return dataclasses.replace(broker, config_text=text)


def _cross_check(brokers):
    """Clashes between brokers: names, ids, and two brokers of one host sharing a port or a directory."""
    problems = []

    def dup(key_of, what):
        seen = {}
        for b in brokers:
            key = key_of(b)
            if key is None:
                continue
            if key in seen:
                problems.append("brokers[%d] (%s): %s as brokers[%d] (%s)"
                                % (b.index, b.name, what, seen[key].index, seen[key].name))
            else:
                seen[key] = b

    dup(lambda b: b.name, "same name (give each broker a unique `name`)")
    dup(lambda b: b.broker_id if b.role == "master" else None, "same broker_id")
    dup(lambda b: (b.host, b.port), "same host and port")
    listeners = {}
    for b in brokers:
        listeners.setdefault((b.host, b.port), (b, "port"))
    for b in brokers:
        for what, port in _listeners(b):
            other, first = listeners.setdefault((b.host, port), (b, what))
            if other is not b or first != what:
                problems.append("brokers[%d] (%s).%s: %d on host %s is also the %s of brokers[%d] (%s)"
                                % (b.index, b.name, what, port, b.host, first, other.index, other.name))
    dup(lambda b: (b.host, b.install_dir), "same host and install_dir")
    dup(lambda b: (b.host, b.data_dir), "same host and data_dir")
    for b in brokers:
        for other in brokers:
            if other.host == b.host and _inside(b.data_dir, other.install_dir):
                problems.append("brokers[%d] (%s).data_dir: %s is inside the install_dir %s of %s (uninstall "
                                "removes install dirs; keep data elsewhere)"
                                % (b.index, b.name, b.data_dir, other.install_dir, other.name))
            elif other is not b and other.host == b.host and _inside(other.install_dir, b.data_dir):
                problems.append("brokers[%d] (%s).install_dir: %s is inside the data_dir %s of %s"
                                % (other.index, other.name, other.install_dir, b.data_dir, b.name))
    return problems


def _listeners(broker):
    """``(setting, port)`` of each listener the broker opens besides its text port: replication and the
    ``server:`` sections' ports (remoting, http, mqtt, grpc; 0 or unset: off)."""
    out = []
    if broker.replication_port is not None:
        out.append(("replication_port", broker.replication_port))
    for section in SERVER_PORTS:
        values = broker.server.get(section)
        if isinstance(values, dict) and isinstance(values.get("port"), int) and values["port"]:
            out.append(("server.%s.port" % section, values["port"]))
    return out


def ports(broker):
    """Every port the broker listens on, by name (text, replication, remoting, http, mqtt, grpc; None: off):
    what ``fab check`` prints, so that nothing about broker k's ports is left to work out."""
    out = {"text": broker.port, "replication": broker.replication_port}
    for section in SERVER_PORTS:
        values = broker.server.get(section)
        out[section] = values.get("port") or None if isinstance(values, dict) else None
    return out


def mqtt_cluster_notes(brokers):
    """What ``fab check`` says of each master that serves MQTT under ZooKeeper but cannot be in the MQTT cluster
    (``protocol.registration.mqtt_membership``: no replication port)."""
    notes = []
    for b in brokers:
        mqtt = b.server.get("mqtt")
        state = mqtt_membership(mqtt.get("port") if isinstance(mqtt, dict) else None, b.zk_connect, b.replication_port)
        if b.role == "master" and state not in (None, "on"):
            notes.append("%s: mqtt cluster: %s: the other masters cannot follow it, so what its MQTT clients publish "
                         "reaches only its own subscribers; give every master a replication_port to make them one "
                         "MQTT service" % (b.name, state))
    return notes


def _inside(path, directory):
    return path == directory or path.startswith(directory + "/")


def server_config(broker):
    """The broker's server.yaml as a dict: the inventory's own settings, then ``server:`` sections."""
    server = dict(broker.server)
    doc = {"broker": _merge({"id": broker.broker_id, "host": broker.listen, "port": broker.port,
                             "data_dir": broker.data_dir}, server.pop("broker", None) or {})}
    doc["zk"] = _merge({"connect": broker.zk_connect}, server.pop("zk", None) or {})
    replication = replication_settings(broker)
    if replication:
        doc["replication"] = _merge(server.pop("replication", None) or {}, replication)
    doc.update(server)
    return doc


def render_server_config(broker, cluster_name):
    """The text of the broker's server.yaml (deterministic: same inventory, same bytes, same checksum)."""
    from metaq.server.config import ServerConfig

    doc = server_config(broker)
    try:
        ServerConfig.model_validate(doc)
    except ValidationError as exc:
        raise InventoryError("; ".join(("%s: " % ".".join(str(p) for p in e["loc"]) if e["loc"] else "")
                                       + _message(e) for e in exc.errors())) from None
    header = ("# metaq broker %s (broker id %d) of cluster %s.\n"
              "# Rendered by fabfile.py from the cluster inventory: edit the inventory and run\n"
              "# `fab deploy`, not this file (the next deploy replaces it).\n"
              % (broker.name, broker.broker_id, cluster_name))
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
