"""Broker configuration: YAML file + command-line overrides, validated with clear messages.

The file layout is documented setting by setting in ``conf/server.yaml``.
Unknown keys are errors (a typo must not silently fall back to a default).

This is the one schema of the broker's settings. Each default is written once: the store's knobs (``store:``)
take theirs from ``metaq.store.config.StoreConfig`` and the transaction manager's (``transactions:``) from
``metaq.transactions.config.TxConfig`` (store/ and the transactions' state may not import this module); the
settings only the server uses have theirs here. ``ServerConfig.store_config`` and ``ServerConfig.tx_config`` build
those two from this schema.
"""

import inspect
import ipaddress
import logging
import os
import resource
import socket
import zlib
from typing import Dict, List, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from metaq import limits
from metaq.keys import limits as keys_limits
from metaq.mqtt import limits as mqtt_limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.pop import limits as pop_limits
from metaq.reqreply import limits as reqreply_limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.server.http import limits as http_limits
from metaq.server.remoting import limits as remoting_limits
from metaq.serving import limits as serving_limits
from metaq.timers import limits as timers_limits
from metaq.topics import limits as topics_limits
from metaq.transactions import limits as transactions_limits
from metaq.errors import ConfigError, InvalidTopic
from metaq.timers.levels import DEFAULT_LEVELS, MAX_LEVELS, SCHEDULE_TOPIC, parse_levels
from metaq.store.config import FLUSH_MODES, StoreConfig, TopicSpec
from metaq.timers.records import TIMER_TOPIC
from metaq.protocol.journaltopic import MQTT_INBOX_TOPIC, MQTT_SESSIONS_TOPIC, POP_TOPIC, TX_TOPIC
from metaq.trace.records import TRACE_TOPIC
from metaq.transactions.config import FLUSH_POLICIES, TxConfig
# the YAML reader moved out when this schema reached its size; guard.py and deploy/inventory.py (which may
# import this module alone of the server) still take these names from here
from metaq.server.configerrors import format_errors
from metaq.server.yamlfile import DuplicateKey, UniqueKeyLoader, read_yaml  # noqa: F401

log = logging.getLogger(__name__)


def _defaults(container):
    """Name -> default of every field of ``container`` (a dataclass or NamedTuple) that has one."""
    return {name: p.default for name, p in inspect.signature(container).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _settings_for(container, section):
    """The settings of ``section`` that ``container`` takes, as its keyword arguments."""
    return {name: getattr(section, name) for name in inspect.signature(container).parameters
            if name in type(section).model_fields}


_STORE = _defaults(StoreConfig)
_TX = _defaults(TxConfig)


#: A setting's mark (``Field(json_schema_extra=SECRET)``) that its value is a secret: every view of the
#: configuration (``stats config``, ``--check-config``, the checksum others see) shows ``REDACTED`` instead.
SECRET = {"secret": True}
REDACTED = "<redacted>"


def _is_secret(field):
    return bool((field.json_schema_extra or {}).get("secret"))


def redact(model, dump):
    """``dump`` (``model.model_dump()``) with the value of every setting marked ``SECRET`` replaced, at any depth.

    It works on the parsed configuration, never on the file's text: whatever YAML form gave a secret (block,
    flow, block scalar, anchor and alias, quoted), the value is one field of the model and is replaced here."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if _is_secret(field):
            if value is not None:
                dump[name] = REDACTED
        elif isinstance(value, BaseModel):
            redact(value, dump[name])
        elif isinstance(value, (list, tuple)):
            for item, item_dump in zip(value, dump[name], strict=True):
                if isinstance(item, BaseModel):
                    redact(item, item_dump)
    return dump


class _Section(BaseModel):
    # strict: ``id: true`` is not broker 1 and ``port: "8123"`` not a number (YAML said what it is);
    # no inf or nan: a timeout, a ratio or a retention of ``.inf`` is a typo, not a setting
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _not_blank(value, meaning):
    """``value`` unless it is an empty (or all-blank) string, which would silently mean ``meaning``."""
    if value is not None and not value.strip():
        raise ValueError("must not be empty (an empty value would mean %s)" % meaning)
    return value


class BrokerSection(_Section):
    id: int = Field(0, ge=0, le=limits.MAX_BROKER_ID)
    host: str = "127.0.0.1"
    port: int = Field(8123, ge=0, le=65535)
    data_dir: str = "./data"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    burst_puts: bool = True
    zero_copy_reads: bool = False

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, level):
        return level.upper() if isinstance(level, str) else level  # debug, Debug and DEBUG alike

    @field_validator("host")
    @classmethod
    def _host(cls, host):
        return _not_blank(host, "every interface; write 0.0.0.0 for that")

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, data_dir):
        return _not_blank(data_dir, "the directory the broker happens to be started in; write . for that")


class StoreSection(_Section):
    """The store's knobs (defaults from ``StoreConfig``) and how often the broker runs retention and disk checks."""

    segment_size: int = Field(_STORE["segment_size"], ge=64 * 1024)
    index_file_units: int = Field(_STORE["index_file_units"], ge=16)
    key_index_slots: int = Field(_STORE["key_index_slots"], ge=1)  # the key index (keys/index.py)
    key_index_entries: int = Field(_STORE["key_index_entries"], ge=keys_limits.MAX_KEYS_PER_MESSAGE)
    flush: Literal[FLUSH_MODES] = _STORE["flush"]
    flush_every_messages: int = Field(_STORE["flush_every_messages"], ge=1)
    flush_interval_ms: int = Field(_STORE["flush_interval_ms"], ge=1)
    checkpoint_interval_ms: int = Field(_STORE["checkpoint_interval_ms"], ge=10)
    retention_hours: float = Field(_STORE["retention_hours"], gt=0)
    retention_check_interval_s: float = Field(60.0, gt=0)
    disk_warn_ratio: float = Field(_STORE["disk_warn_ratio"], gt=0, le=1)
    disk_danger_ratio: float = Field(_STORE["disk_danger_ratio"], gt=0, le=1)
    disk_check_interval_s: float = Field(1.0, gt=0)
    max_transfer_size: int = Field(_STORE["max_transfer_size"], ge=1024)
    force_recovery: bool = _STORE["force_recovery"]
    producer_ttl_s: float = Field(_STORE["producer_ttl_s"], gt=0)  # idempotent producers (idempotence/window.py)

    @model_validator(mode="after")
    def _marks_ordered(self):
        if self.disk_warn_ratio > self.disk_danger_ratio:
            raise ValueError("disk_warn_ratio must not exceed disk_danger_ratio")
        return self


class LimitsSection(_Section):
    max_line_bytes: int = Field(limits.MAX_LINE_BYTES, ge=64)
    max_body_bytes: int = Field(limits.MAX_BODY_BYTES, ge=1)
    max_connections: Optional[int] = Field(None, ge=1)
    max_connections_per_address: Optional[int] = Field(None, ge=1)
    max_reply_bytes: int = Field(limits.MAX_REPLY_BYTES, ge=4096)
    max_partial_request_bytes: int = Field(limits.MAX_PARTIAL_REQUEST_BYTES, ge=1 << 20)
    max_http_unsent_bytes: int = Field(http_limits.MAX_HTTP_UNSENT_BYTES, ge=1 << 16)
    login_timeout_s: float = Field(limits.LOGIN_TIMEOUT_S, gt=0)
    max_unauthenticated: Optional[int] = Field(None, ge=1)
    max_unauthenticated_per_address: int = Field(limits.MAX_UNAUTHENTICATED_PER_ADDRESS, ge=1)
    stranger_eviction_age_s: float = Field(limits.STRANGER_EVICTION_AGE_S, ge=0)
    tls_handshakes_per_address_s: int = Field(limits.TLS_HANDSHAKES_PER_ADDRESS_S, ge=1)
    max_parked_gets: int = Field(limits.MAX_PARKED_GETS, ge=0)
    max_parked_gets_per_connection: int = Field(limits.MAX_PARKED_GETS_PER_CONNECTION, ge=0)
    max_pending_requests: int = Field(reqreply_limits.MAX_PENDING_REQUESTS, ge=0)
    max_pending_timers: int = Field(timers_limits.MAX_PENDING_TIMERS, ge=0)
    max_pending_requests_per_connection: int = Field(reqreply_limits.MAX_PENDING_REQUESTS_PER_CONNECTION, ge=0)
    max_request_timeout_ms: int = Field(reqreply_limits.MAX_REQUEST_TIMEOUT_MS, ge=1)
    idle_timeout_s: float = Field(limits.IDLE_TIMEOUT_S, gt=0)
    request_timeout_s: float = Field(limits.REQUEST_TIMEOUT_S, gt=0)
    max_wait_ms: int = Field(limits.MAX_WAIT_MS, ge=0)
    max_topics: int = Field(topics_limits.MAX_TOPICS, ge=1)
    max_partitions: int = Field(topics_limits.MAX_TOTAL_PARTITIONS, ge=1)


class ZkSection(_Section):
    connect: Optional[str] = None
    root: str = "/meta"
    session_timeout_ms: int = Field(30000, ge=1000)
    connection_timeout_ms: int = Field(30000, ge=100)

    @field_validator("connect")
    @classmethod
    def _hosts(cls, connect):
        if connect is None:
            return None
        hosts = connect.split("/", 1)[0]
        for host in hosts.split(","):
            name, sep, port = host.strip().rpartition(":")
            if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("expected HOST:PORT[,HOST:PORT...][/chroot], got %r" % connect)
        return connect

    @field_validator("root")
    @classmethod
    def _root(cls, root):
        if not root.startswith("/") or root.endswith("/") or "//" in root:
            raise ValueError("must be an absolute ZooKeeper path such as /meta, got %r" % root)
        return root


class TransactionsSection(_Section):
    """The transaction manager's settings (defaults from ``TxConfig``)."""

    max_timeout_s: int = Field(_TX["max_timeout_s"], ge=1)
    default_timeout_s: int = Field(_TX["default_timeout_s"], ge=1)
    journal_flush: Literal[FLUSH_POLICIES] = _TX["journal_flush"]
    journal_file_size: int = Field(_TX["journal_file_size"], ge=64 * 1024)
    max_puts_per_tx: int = Field(_TX["max_puts_per_tx"], ge=1)
    max_tx_bytes: int = Field(_TX["max_tx_bytes"], ge=1024)
    max_open: int = Field(_TX["max_open"], ge=1)
    max_held_bytes: int = Field(_TX["max_held_bytes"], ge=1024)

    @model_validator(mode="after")
    def _timeouts(self):
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        if self.max_tx_bytes > self.max_held_bytes:
            raise ValueError("max_tx_bytes must not exceed max_held_bytes (what all open transactions may hold)")
        return self


#: ``replication.max_isolation_ms`` when unset, with ``ha: auto`` and ``async`` mode.
DEFAULT_MAX_ISOLATION_MS = 1000


class ReplicationSection(_Section):
    """Master→slave replication (DESIGN §8; docs/replication.md)."""

    role: Literal["master", "slave"] = "master"
    port: Optional[int] = Field(None, ge=0, le=65535)  # master: replication listener (None/0 = off)
    slave_of: Optional[str] = None  # slave: the master's replication HOST:PORT
    slave_id: Optional[int] = Field(None, ge=0, le=limits.MAX_BROKER_ID)
    mode: Literal["async", "sync"] = "async"
    sync_timeout_ms: int = Field(3000, ge=1)
    ha: Literal["manual", "auto"] = "manual"  # auto: elected through ZooKeeper (slave_id = member id; election.py)
    lease_ms: Optional[int] = Field(None, ge=100)  # default: half of zk.session_timeout_ms (Config.lease_ms)
    insync_lag_ms: int = Field(2000, ge=10, le=60000)  # sync mode: a member behind for this long leaves the in-sync set
    election_settle_ms: int = Field(500, ge=0)  # how long candidates wait for each other's positions
    # async master: acknowledge only while a slave or ZooKeeper was heard within this (null: Config.max_isolation_ms)
    max_isolation_ms: Optional[int] = Field(None, ge=0, le=600000)
    advertised_address: Optional[str] = None  # HOST:PORT the other members dial for our port (NAT, a proxy)

    @field_validator("slave_of", "advertised_address")
    @classmethod
    def _hostport(cls, value, info):
        name, sep, port = (value or "").rpartition(":")
        if value is not None and (not sep or not name or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError("expected HOST:PORT of a replication port, got %r" % value)
        if value is not None and info.field_name == "advertised_address" and not info.data.get("port"):
            raise ValueError("where other members reach our replication port: set replication.port too")
        return value

    @model_validator(mode="after")
    def _slave_needs(self):
        if self.ha == "auto":
            if self.role != "master" or self.slave_of is not None:
                raise ValueError("ha: auto elects the master through ZooKeeper: remove role/slave_of (every member "
                                 "of the broker id starts the same way)")
            if not self.port or self.slave_id is None:
                raise ValueError("ha: auto needs a replication port (any member may become master) and slave_id "
                                 "(this broker's member id, distinct within its broker id)")
        elif self.role == "slave" and (self.slave_of is None or self.slave_id is None):
            raise ValueError("a slave needs slave_of (the master's HOST:PORT) and slave_id")
        return self

    def master_address(self):
        host, _sep, port = self.slave_of.rpartition(":")
        return host.strip("[]"), int(port)


class RemotingSection(_Section):
    """The RocketMQ remoting port (DESIGN §6; docs/rocketmq.md; check-back defaults: RocketMQ 4's)."""

    port: int = Field(0, ge=0, le=65535)  # 0 = off
    host: Optional[str] = None  # bind address; default broker.host
    advertised_host: Optional[str] = None  # the host routes name; default the bind host
    broker_name: Optional[str] = None  # default metaq-<broker id>
    cluster: str = "DefaultCluster"
    retry_queues: int = Field(1, ge=1, le=limits.MAX_PARTITIONS)
    max_reconsume_times: int = Field(16, ge=0)
    # RocketMQ's accessMessageInMemoryMaxRatio: the percentage of physical memory deemed to hold the log's newest
    # bytes; a pull leaving more backlog is slow (a group's read_from_slave_when_slow: docs/concepts.md)
    access_message_in_memory_max_ratio: int = Field(40, ge=0, le=100)
    send_back_delay_level: Optional[int] = Field(None, ge=0, le=MAX_LEVELS)
    client_timeout_s: float = Field(120.0, gt=0)
    max_frame_bytes: int = Field(remoting_limits.MAX_REMOTING_FRAME, ge=64 * 1024)
    max_client_entries: int = Field(remoting_limits.MAX_REMOTING_MEMBERS, ge=1)
    lock_expiry_s: float = Field(60.0, gt=0)  # orderly consumers' queue locks (conf/server.yaml)
    max_locks: int = Field(remoting_limits.MAX_REMOTING_LOCKS, ge=1)
    transaction_check_interval_ms: int = Field(60_000, ge=10, le=86_400_000)
    transaction_timeout_ms: int = Field(6_000, ge=0, le=86_400_000)
    transaction_check_max: int = Field(15, ge=0, le=1_000_000)
    max_half_messages: int = Field(transactions_limits.MAX_HALF_MESSAGES, ge=1,
                                   le=10 * transactions_limits.MAX_OPEN_TRANSACTIONS)

    @field_validator("host", "advertised_host", "broker_name", "cluster")
    @classmethod
    def _named(cls, value, info):
        return _not_blank(value, "an unnamed %s; leave it out for the default" % info.field_name.replace("_", " "))

    def retry_topic_specs(self):
        """Topic patterns of the retry and dead-letter topics, and of the dead letters' resent journals
        (``admin/service.py``): first, so they win over user patterns. The dead letters and their journals are
        declared without the remoting port too: per-message acknowledgement (``pop/service.py``) writes them. With
        the port, RocketMQ's message-trace topic too (one partition, as RocketMQ's broker creates it with
        ``traceTopicEnable``): clients with tracing on find its route and send there (docs/operating.md "Where is
        my message")."""
        dead = [TopicSpec("%DLQ%*", self.retry_queues), TopicSpec("%RESENT%*", 1)]
        if not self.port:
            return dead
        return [TopicSpec("%RETRY%*", self.retry_queues)] + dead + [TopicSpec(TRACE_TOPIC, 1)]


class DelaySection(_Section):
    """Delayed delivery (docs/messaging.md "Delayed delivery"): RocketMQ's delay levels, ``"1s 5s ... 2h"``."""

    levels: str = DEFAULT_LEVELS

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels):
        parse_levels(levels)  # ValueError with the reason
        return levels

    def levels_ms(self):
        """The levels as a tuple of milliseconds (level 1 first)."""
        return parse_levels(self.levels)


class TopicSection(_Section):
    name: str
    partitions: int = Field(1, ge=1, le=limits.MAX_PARTITIONS)

    @field_validator("name")
    @classmethod
    def _legal(cls, name):
        try:
            limits.validate_topic(name.replace("*", "x"))
        except InvalidTopic as exc:
            raise ValueError(str(exc)) from None
        if name == SCHEDULE_TOPIC:
            raise ValueError("%s is the broker's internal topic for delayed delivery; "
                             "it cannot be configured" % SCHEDULE_TOPIC)
        return name


class TlsSection(_Section):
    """TLS on every listener (docs/security.md): the broker's certificate and key, optionally clients' CA."""

    mode: Literal["off", "on", "permissive"] = "off"  # permissive: TLS and plaintext on the same port (the
    #                                                     first byte tells them apart: 0x16 opens a TLS hello)
    cert: Optional[str] = None  # PEM certificate chain of the broker
    key: Optional[str] = None  # PEM private key of the broker
    ca: Optional[str] = None  # PEM CAs: clients' certificates are checked against them when verify_clients
    verify_clients: bool = False  # require a client certificate signed by ``ca``
    replication: bool = True  # the slave also connects to its master over TLS (when mode is not off)

    @model_validator(mode="after")
    def _files(self):
        if self.mode != "off" and (not self.cert or not self.key):
            raise ValueError("TLS (mode %s) needs cert and key (PEM files)" % self.mode)
        if self.verify_clients and not self.ca:
            raise ValueError("verify_clients needs ca: the CAs client certificates are checked against")
        return self


class SecuritySection(_Section):
    """Who may connect and what they may do (docs/security.md)."""

    acl_file: Optional[str] = None  # users, roles and permissions (YAML); set = authentication on
    acl_reload_s: float = Field(2.0, gt=0)  # how often the file is checked for a change
    # shared by a master and its slaves (or replication_secret_file)
    replication_secret: Optional[str] = Field(None, json_schema_extra=SECRET)
    replication_secret_file: Optional[str] = None  # a file holding it (kept out of the config, mode 0600)
    insecure: bool = False  # allow what protected mode refuses (logged at every start): see conf/server.yaml
    tls: TlsSection = TlsSection()
    # networks (CIDRs) of reverse proxies whose word on a client's address is taken (docs/security.md "Behind a
    # proxy"); proxy_protocol: the listeners whose connections from them must begin with a PROXY header (v1 or v2)
    trusted_proxies: List[str] = Field([], max_length=limits.MAX_TRUSTED_PROXIES)
    proxy_protocol: List[Literal["text", "remoting", "mqtt", "http", "grpc"]] = []

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, networks):
        for n in networks:
            try:
                ipaddress.ip_network(n, strict=False)
            except ValueError:
                raise ValueError("%r is not a network (an address or CIDR: 10.0.0.0/8, 192.0.2.7, fd00::/8)"
                                 % n) from None
        return networks

    @field_validator("acl_file", "replication_secret_file")
    @classmethod
    def _path(cls, value, info):
        return _not_blank(value, "no %s; leave it out for that" % info.field_name.replace("_", " "))

    @model_validator(mode="after")
    def _one_secret(self):
        if self.proxy_protocol and not self.trusted_proxies:
            raise ValueError("proxy_protocol needs trusted_proxies: the proxies whose PROXY header is read")
        if self.replication_secret is not None and self.replication_secret_file is not None:
            raise ValueError("replication_secret and replication_secret_file are both set: keep one")
        if self.replication_secret is not None and len(self.replication_secret.encode()) < \
                limits.MIN_REPLICATION_SECRET_BYTES:
            raise ValueError("replication_secret must be at least %d bytes (a random string: openssl rand -hex 32)"
                             % limits.MIN_REPLICATION_SECRET_BYTES)
        return self

    @property
    def auth(self):
        return self.acl_file is not None

    def read_replication_secret(self):
        """The replication secret as bytes (read from its file when given so), or None when not set."""
        if self.replication_secret is not None:
            return self.replication_secret.encode("utf-8")
        if self.replication_secret_file is None:
            return None
        try:
            with open(self.replication_secret_file, "rb") as f:
                secret = f.read(limits.MAX_SECRET_BYTES + 1).strip()
        except OSError as exc:
            raise ConfigError("cannot read security.replication_secret_file %s: %s"
                              % (self.replication_secret_file, exc.strerror)) from None
        if not limits.MIN_REPLICATION_SECRET_BYTES <= len(secret) <= limits.MAX_SECRET_BYTES:
            raise ConfigError("security.replication_secret_file %s must hold %d to %d bytes"
                              % (self.replication_secret_file, limits.MIN_REPLICATION_SECRET_BYTES,
                                 limits.MAX_SECRET_BYTES))
        return secret


class HttpSection(_Section):
    """``http:``: the HTTP port (metrics, health, JSON API, HTTP put/get, the dashboard)."""

    port: Optional[int] = Field(None, ge=0, le=65535)  # None or 0 = off
    host: Optional[str] = None  # bind address; default broker.host
    open_metrics: bool = False  # /metrics without credentials when security.acl_file is set (a scraper's view)
    # names a browser may reach the port by, beside IP addresses, localhost and this machine's host name (a
    # browser's request under another name may be DNS rebinding: routes.BrowserCheck); "*": any name
    allowed_hosts: List[str] = []

    @field_validator("host")
    @classmethod
    def _host(cls, host):
        if host is not None and not host.strip():
            raise ValueError("http.host must not be blank (leave it out to use broker.host)")
        return host

    @field_validator("allowed_hosts")
    @classmethod
    def _names(cls, names):
        for name in names:
            if not name.strip() or any(c in name for c in " /:@"):
                raise ValueError("http.allowed_hosts: %r is not a host name (a name without port, or \"*\")" % name)
        return [name.strip().lower().rstrip(".") for name in names]


class MqttSection(_Section):
    """``mqtt:``: the MQTT 3.1.1 and 5.0 port for devices (docs/mqtt.md); TLS, the allow-list and users as on every
    port (``security:``)."""

    port: Optional[int] = Field(None, ge=0, le=65535)  # None or 0 = off (1883 by convention, 8883 with TLS)
    host: Optional[str] = None  # bind address; default broker.host
    max_packet_bytes: int = Field(mqtt_limits.MQTT_MAX_PACKET_BYTES, ge=64)
    # MQTT over WebSocket (docs/mqtt.md "Over WebSocket"): ws:// and wss:// (security.tls) ports, None or 0 = off,
    # on the MQTT port's host; the upgrade's path; the Origin values a browser page may come from (empty: any)
    ws_port: Optional[int] = Field(None, ge=0, le=65535)
    wss_port: Optional[int] = Field(None, ge=0, le=65535)
    ws_path: str = Field("/mqtt", pattern=r"^/[\x21-\x7e]*$", max_length=256)
    ws_allowed_origins: List[str] = Field([], max_length=serving_limits.WS_MAX_ALLOWED_ORIGINS)
    receive_maximum: int = Field(mqtt_limits.MQTT_RECEIVE_MAXIMUM, ge=1, le=65535)
    max_inflight: int = Field(mqtt_limits.MQTT_MAX_INFLIGHT, ge=1, le=65535)
    max_subscriptions: int = Field(mqtt_limits.MQTT_MAX_SUBSCRIPTIONS, ge=1)
    max_wildcard_topics: int = Field(mqtt_limits.MQTT_MAX_WILDCARD_TOPICS, ge=1)
    max_client_id_bytes: int = Field(mqtt_limits.MQTT_MAX_CLIENT_ID_BYTES, ge=23, le=65535)
    topic_alias_maximum: int = Field(mqtt_limits.MQTT_TOPIC_ALIAS_MAXIMUM, ge=0, le=65535)
    max_outbound_aliases: int = Field(mqtt_limits.MQTT_MAX_OUTBOUND_ALIASES, ge=0, le=65535)
    max_keep_alive_s: int = Field(mqtt_limits.MQTT_MAX_KEEP_ALIVE_S, ge=0, le=65535)  # 0 = no bound
    max_delayed_wills: int = Field(mqtt_limits.MQTT_MAX_DELAYED_WILLS, ge=0)
    # how long a master that may confirm no write keeps its connections holding a session or a will open
    unconfirmable_grace_s: float = Field(mqtt_limits.MQTT_UNCONFIRMABLE_GRACE_S, ge=0)
    max_offline_sessions: int = Field(mqtt_limits.MQTT_MAX_OFFLINE_SESSIONS, ge=0)  # persistent sessions kept offline
    offline_session_max_age_s: int = Field(mqtt_limits.MQTT_OFFLINE_SESSION_MAX_AGE_S, ge=1)
    max_retained: int = Field(mqtt_limits.MQTT_MAX_RETAINED, ge=0)  # retained messages kept
    max_retained_bytes: int = Field(mqtt_limits.MQTT_MAX_RETAINED_BYTES, ge=0)
    # MQTT topic names -> metaq topics (docs/mqtt.md "Topics"): [{filter: <MQTT filter>, topic: <metaq topic>}, ...],
    # the first match wins; else a name's first level when it is a legal metaq topic name, else fallback_topic
    topic_map: List[Dict[str, str]] = []
    fallback_topic: str = mqtt_limits.MQTT_FALLBACK_TOPIC
    cluster_max_ids: int = Field(mqttcluster_limits.MQTT_CLUSTER_MAX_IDS,
                                 ge=1)  # a home broker's client ids (mqttcluster)
    # the percent of them one other broker may hold (mqttcluster: ids.holder_share)
    cluster_holder_share_percent: int = Field(mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT, ge=1, le=100)
    # how long a master beginning to keep sessions holds CONNACKs and wills until its peers follow it (mqttcluster)
    cluster_start_hold_s: float = Field(mqttcluster_limits.MQTT_CLUSTER_START_HOLD_S, ge=0)
    # how long a broker keeps a connection of a client id whose home it cannot reach (mqttcluster: ClientIds); at
    # least 1 s: the holder counts it out a quarter of it and 0.25 s early, and renews it every quarter of it
    cluster_id_lease_s: float = Field(mqttcluster_limits.MQTT_CLUSTER_ID_LEASE_S, ge=1, le=60)

    @field_validator("host")
    @classmethod
    def _host(cls, host):
        if host is not None and not host.strip():
            raise ValueError("mqtt.host must not be blank (leave it out to use broker.host)")
        return host

    @model_validator(mode="after")
    def _websocket(self):
        if (self.ws_port or self.wss_port) and not self.port:
            raise ValueError("mqtt.ws_port and mqtt.wss_port serve the MQTT port's sessions: set mqtt.port too")
        return self

    @model_validator(mode="after")
    def _topic_map(self):
        """A map or fallback the file sets is checked by MQTT's rules here, whether or not the port is on; the
        defaults are those rules' own, so a file that sets neither loads no MQTT code."""
        if not {"topic_map", "fallback_topic"} & self.model_fields_set:
            return self
        from metaq.mqtt.topicmap import TopicMapError

        try:
            self.topics()
        except TopicMapError as exc:
            raise ValueError(str(exc)) from None
        return self

    def topics(self):
        """The broker's ``mqtt.topicmap.TopicMap`` of ``topic_map`` and ``fallback_topic`` (the MQTT port's)."""
        from metaq.mqtt.topicmap import TopicMap

        return TopicMap(self.topic_map, self.fallback_topic)


#: What a gRPC message needs beside its body (the topic, properties, ids): ``limits.GRPC_MAX_MESSAGE_BYTES``'s room.
GRPC_MESSAGE_ROOM = rmq5_limits.GRPC_MAX_MESSAGE_BYTES - limits.MAX_BODY_BYTES


class GrpcSection(_Section):
    """``grpc:``: RocketMQ 5's gRPC port (``apache.rocketmq.v2.MessagingService``; docs/rocketmq5.md)."""

    port: Optional[int] = Field(None, ge=0, le=65535)  # None or 0 = off; 8081 by RocketMQ's convention
    host: Optional[str] = None  # bind address; default broker.host
    advertised_host: Optional[str] = None  # the host routes name; default the bind host (a wildcard: the client's)
    max_streams_per_connection: int = Field(rmq5_limits.GRPC_MAX_STREAMS_PER_CONNECTION, ge=1, le=1 << 16)
    max_message_bytes: int = Field(rmq5_limits.GRPC_MAX_MESSAGE_BYTES, ge=1024, le=1 << 30)
    max_header_bytes: int = Field(rmq5_limits.GRPC_MAX_HEADER_BYTES, ge=1024, le=1 << 20)
    max_call_s: float = Field(rmq5_limits.GRPC_MAX_CALL_S, gt=0, le=3600)
    # per connection and flood_window_s: frames that do no work (port.FloodBudget: control, unknown, empty, tiny and
    # refused frames, small frames past their credit, WINDOW_UPDATEs for data never sent) and streams opened
    max_control_frames: int = Field(rmq5_limits.GRPC_MAX_CONTROL_FRAMES, ge=10, le=1 << 20)
    max_new_streams: int = Field(rmq5_limits.GRPC_MAX_NEW_STREAMS, ge=1, le=1 << 24)
    flood_window_s: float = Field(rmq5_limits.GRPC_FLOOD_WINDOW_S, gt=0, le=3600)
    # an address cut for flooding is refused new connections this long, doubled at each cut in a row; 0 = never
    flood_penalty_s: float = Field(rmq5_limits.GRPC_FLOOD_PENALTY_S, ge=0, le=3600)
    # a push consumer's message invisible this long from its delivery and each renewal (auto-renew)
    renew_invisible_ms: int = Field(rmq5_limits.GRPC_RENEW_INVISIBLE_MS, ge=pop_limits.POP_MIN_INVISIBLE_MS,
                                    le=pop_limits.POP_MAX_INVISIBLE_MS)

    @field_validator("host", "advertised_host")
    @classmethod
    def _named(cls, value, info):
        return _not_blank(value, "an unnamed grpc %s; leave it out for the default" % info.field_name.replace("_", " "))


class ServerConfig(_Section):
    broker: BrokerSection = BrokerSection()
    store: StoreSection = StoreSection()
    limits: LimitsSection = LimitsSection()
    zk: ZkSection = ZkSection()
    transactions: TransactionsSection = TransactionsSection()
    replication: ReplicationSection = ReplicationSection()
    remoting: RemotingSection = RemotingSection()
    delay: DelaySection = DelaySection()
    topics: List[TopicSection] = [TopicSection(name="*", partitions=1)]
    security: SecuritySection = SecuritySection()
    http: HttpSection = HttpSection()  # the HTTP port
    mqtt: MqttSection = MqttSection()  # the MQTT port
    grpc: GrpcSection = GrpcSection()  # RocketMQ 5's gRPC port

    @field_validator("topics")
    @classmethod
    def _listed_once(cls, topics):
        first = {}
        for i, t in enumerate(topics):
            if t.name in first:
                j = first[t.name]
                raise ValueError("topic %r is listed twice, as topics.%d (partitions %d) and topics.%d "
                                 "(partitions %d); only the first would count: keep one entry"
                                 % (t.name, j, topics[j].partitions, i, t.partitions))
            first[t.name] = i
        return topics

    @model_validator(mode="after")
    def _ports_distinct(self):
        """Two listeners on one address would fail at start (``address in use``) or, with SO_REUSEPORT, share it."""
        host = self.broker.host
        listeners = [("broker.port", host, self.broker.port), ("remoting.port", self.remoting.host or host,
                                                                self.remoting.port),
                     ("replication.port", host, self.replication.port),
                     ("http.port", self.http.host or host, self.http.port),
                     ("mqtt.port", self.mqtt.host or host, self.mqtt.port),
                     ("mqtt.ws_port", self.mqtt.host or host, self.mqtt.ws_port),
                     ("mqtt.wss_port", self.mqtt.host or host, self.mqtt.wss_port),
                     ("grpc.port", self.grpc.host or host, self.grpc.port)]
        seen = {}
        for name, bind, port in listeners:
            if port and (bind, port) in seen:
                raise ValueError("%s and %s are both %s:%d: each listener needs its own port"
                                 % (seen[bind, port], name, bind, port))
            if port:
                seen[bind, port] = name
        return self

    @model_validator(mode="after")
    def _grpc_message_fits_a_body(self):
        """A gRPC port whose messages could not carry a body ``limits.max_body_bytes`` allows would refuse, as too
        large for the port, sends the rest of the broker takes."""
        g = self.grpc
        if g.port and g.max_message_bytes < self.limits.max_body_bytes + GRPC_MESSAGE_ROOM:
            raise ValueError("grpc.max_message_bytes (%d) must hold a body of limits.max_body_bytes (%d) and %d bytes "
                             "for its properties: raise it to %d or more"
                             % (g.max_message_bytes, self.limits.max_body_bytes, GRPC_MESSAGE_ROOM,
                                self.limits.max_body_bytes + GRPC_MESSAGE_ROOM))
        return self

    @model_validator(mode="after")
    def _ha_needs_zookeeper(self):
        rep = self.replication
        if rep.ha != "auto":
            return self
        if not self.zk.connect:
            raise ValueError("replication.ha: auto elects the master through ZooKeeper: set zk.connect")
        if self.lease_ms() >= self.zk.session_timeout_ms:
            raise ValueError("replication.lease_ms (%d) must be below zk.session_timeout_ms (%d): a master must stop "
                             "acknowledging before its session can expire and another be elected"
                             % (self.lease_ms(), self.zk.session_timeout_ms))
        return self

    def lease_ms(self):
        """How long a master acknowledges writes after ZooKeeper last confirmed its leadership (ha: auto)."""
        return self.replication.lease_ms or self.zk.session_timeout_ms // 2

    def max_isolation_ms(self):
        """How long an ``async`` master acknowledges after it last heard from a slave or ZooKeeper
        (``replication/isolation.py``); 0: no bound. Off in ``sync`` mode (a put waits for the slaves) and without
        a replication port (a standalone broker never refuses); unset: DEFAULT_MAX_ISOLATION_MS with ``ha: auto``
        (a member may be elected without anyone deciding), off with ``ha: manual`` (a person promotes)."""
        rep = self.replication
        if rep.mode != "async" or not rep.port:
            return 0
        if rep.max_isolation_ms is not None:
            return rep.max_isolation_ms
        return DEFAULT_MAX_ISOLATION_MS if rep.ha == "auto" else 0

    @model_validator(mode="after")
    def _body_fits(self):
        overhead = 256 + limits.MAX_NAME_BYTES
        if self.limits.max_body_bytes + overhead > self.store.segment_size:
            raise ValueError(
                "limits.max_body_bytes (%d) plus record overhead must fit in store.segment_size (%d)"
                % (self.limits.max_body_bytes, self.store.segment_size)
            )
        return self

    def listen_addresses(self):
        """``(setting, bind address)`` of every listener this configuration opens."""
        host = self.broker.host
        found = [("broker.host", host)]
        if self.remoting.port:
            found.append(("remoting.host" if self.remoting.host else "broker.host", self.remoting.host or host))
        if self.replication.port:
            found.append(("broker.host", host))
        if self.http.port:
            found.append(("http.host" if self.http.host else "broker.host", self.http.host or host))
        if self.mqtt.port:
            found.append(("mqtt.host" if self.mqtt.host else "broker.host", self.mqtt.host or host))
        if self.grpc.port:
            found.append(("grpc.host" if self.grpc.host else "broker.host", self.grpc.host or host))
        return found

    @model_validator(mode="after")
    def _wss_has_tls(self):
        if self.mqtt.wss_port and self.security.tls.mode == "off":
            raise ValueError("mqtt.wss_port is WebSocket over TLS: set security.tls (docs/security.md), or use "
                             "mqtt.ws_port for plaintext")
        return self

    @model_validator(mode="after")
    def _protected(self):
        """Redis's protected mode: no listener on a non-loopback address with authentication off, unless
        ``security.insecure`` says so explicitly."""
        sec = self.security
        if sec.insecure:
            return self
        has_secret = sec.replication_secret is not None or sec.replication_secret_file is not None
        if self.replication.port and not is_loopback(self.broker.host) and not has_secret:
            raise ValueError("replication.port listens on %s, not a loopback address, with no "
                             "security.replication_secret: any host could pull the whole log as a slave. Set one "
                             "(the same on the master and its slaves), or security.insecure: true"
                             % self.broker.host)
        if self.replication.slave_of and not is_loopback(self.replication.master_address()[0]) and not has_secret:
            raise ValueError("replication.slave_of is %s, not a loopback address, with no "
                             "security.replication_secret: this slave could not tell its master from an impostor. "
                             "Set the master's secret, or security.insecure: true" % self.replication.slave_of)
        if sec.auth:
            http_host = self.http.host or self.broker.host
            if self.http.port and sec.tls.mode == "off" and not is_loopback(http_host):
                raise ValueError(
                    "http.port listens on %s, not a loopback address, with authentication on and TLS off: HTTP Basic "
                    "sends each user's secret as it is. Set security.tls (docs/security.md), bind the HTTP port to "
                    "127.0.0.1 (http.host), or set security.insecure: true to accept the risk" % http_host)
            mqtt_host = self.mqtt.host or self.broker.host
            if self.mqtt.ws_port and not is_loopback(mqtt_host):
                raise ValueError(
                    "mqtt.ws_port listens on %s, not a loopback address, with authentication on: ws:// is never TLS, "
                    "and an MQTT CONNECT sends its password as it is. Use mqtt.wss_port (security.tls), bind the MQTT "
                    "port to 127.0.0.1 (mqtt.host) behind a TLS proxy, or set security.insecure: true to accept the "
                    "risk" % mqtt_host)
            if self.mqtt.port and sec.tls.mode == "off" and not is_loopback(mqtt_host):
                raise ValueError(
                    "mqtt.port listens on %s, not a loopback address, with authentication on and TLS off: an MQTT "
                    "CONNECT sends its password as it is. Set security.tls (docs/security.md), bind the MQTT port to "
                    "127.0.0.1 (mqtt.host), or set security.insecure: true to accept the risk" % mqtt_host)
            return self
        if self.http.port and "*" in self.http.allowed_hosts:
            raise ValueError(
                'http.allowed_hosts: ["*"] with authentication off lets any web page a browser on this machine opens '
                "read and write every topic under a name of its own (DNS rebinding). Name the hosts, set "
                "security.acl_file, or set security.insecure: true to accept the risk")
        exposed = sorted({"%s %s" % (name, host) for name, host in self.listen_addresses() if not is_loopback(host)})
        if exposed:
            raise ValueError(
                "%s is not a loopback address and authentication is off: anyone who reaches it could read and "
                "write every topic. Set security.acl_file (docs/security.md), bind 127.0.0.1, or set "
                "security.insecure: true to accept the risk" % ", ".join(exposed))
        return self

    def redacted_dump(self):
        """``model_dump()`` with every secret replaced: the only form of the configuration anyone is shown."""
        return redact(self, self.model_dump())

    def redacted_text(self):
        """The parsed configuration, secrets redacted, as YAML bytes (``stats config``, ``--check-config``)."""
        return yaml.safe_dump(self.redacted_dump(), sort_keys=False).encode("utf-8")

    def checksum(self):
        """``config_checksum`` (stats, ZooKeeper, the deploy agent): the CRC-32 of ``redacted_text``. Of the
        redacted view, not the file: a checksum any user sees must not be a test of guesses at a secret."""
        return zlib.crc32(self.redacted_text())

    def max_unauthenticated(self):
        if self.limits.max_unauthenticated is not None:
            return self.limits.max_unauthenticated
        return limits.max_unauthenticated_for(self.max_connections())

    def max_connections(self):
        if self.limits.max_connections is not None:
            return self.limits.max_connections
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return limits.max_connections_for(soft, self.fd_reserve())

    def in_mqtt_cluster(self):
        """With an MQTT port and ZooKeeper a broker is in an MQTT cluster (a slave too: it may be promoted): it
        budgets for its peers' links to it and its own to them."""
        return bool(self.mqtt.port) and self.zk.connect is not None

    def fd_reserve(self):
        """Descriptors this broker keeps back from its open-files limit (``limits.fd_reserve_for``)."""
        if self.in_mqtt_cluster():
            return limits.fd_reserve_for(mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM,
                                         mqttcluster_limits.MQTT_CLUSTER_LINK_FDS)
        return limits.fd_reserve_for()

    def nofile_target(self, soft, hard):
        """The soft open-files limit this broker raises its own to at start, given its ``soft`` and ``hard``
        limits (``limits.nofile_target_for``: its reserve plus its connection cap, or DEFAULT_CONNECTION_ROOM)."""
        return limits.nofile_target_for(soft, hard, self.fd_reserve(), self.limits.max_connections)

    def replication_headroom(self):
        """Connections its replication port takes past the connection cap (``limits.replication_headroom_for``)."""
        return limits.replication_headroom_for(mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM
                                               if self.in_mqtt_cluster() else 0)

    def max_connections_per_address(self):
        if self.limits.max_connections_per_address is not None:
            return self.limits.max_connections_per_address
        return limits.max_per_address_for(self.max_connections())

    def store_config(self):
        """The ``StoreConfig`` of this schema: data dir, broker id, topics and every ``store:`` knob it takes."""
        return StoreConfig(
            data_dir=os.path.abspath(self.broker.data_dir),
            broker_id=self.broker.id,
            # first, so that no pattern can claim them: one partition per delay level; retry/DLQ topics
            topics=[TopicSpec(SCHEDULE_TOPIC, len(self.delay.levels_ms())), TopicSpec(TIMER_TOPIC, 1),
                    TopicSpec(TX_TOPIC, 1), TopicSpec(POP_TOPIC, 1),
                    TopicSpec(MQTT_SESSIONS_TOPIC, 1),
                    TopicSpec(MQTT_INBOX_TOPIC, mqttcluster_limits.MQTT_CLUSTER_INBOX_PARTITIONS)]
            + self.remoting.retry_topic_specs()
            + [TopicSpec(t.name, t.partitions) for t in self.topics],
            max_topics=self.limits.max_topics, max_partitions=self.limits.max_partitions,
            **_settings_for(StoreConfig, self.store),
        )

    def tx_config(self):
        """The transaction manager's ``TxConfig``: the ``transactions:`` section."""
        return TxConfig(**_settings_for(TxConfig, self.transactions))

def is_loopback(host):
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def advertised_ip(host):
    """An IP address clients can reach for a bind host (a wildcard bind advertises this machine's address). Here, with
    what a host setting means, so that every listener's address is made without loading the port that serves it."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except OSError:
        return "127.0.0.1"


def check_fd_limit(config, source="(defaults)", nofile=None):
    """Refuse an open-files limit that cannot hold what this broker keeps back (``config.fd_reserve()``) plus its
    connection cap (``limits.max_connections``; unset, it follows the limit and needs room for one): ConfigError,
    one line naming the limit, each part of the reserve and what to change.

    Checked when a broker starts, after it raised its limit (``raise_nofile_limit``), and by ``--check-config``
    against the limit that raise would give; not by the schema nor by another process reading the file
    (``read_config``): a deploy host's or a deploy agent's open-files limit says nothing of the one the broker
    runs with. ``nofile`` is RLIMIT_NOFILE's soft limit (default: this process's).
    """
    if nofile is None:
        nofile, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    reserve = config.fd_reserve()
    wanted = config.limits.max_connections
    if nofile >= reserve + (wanted or 1):
        return
    parts = "the store's %d (limits.FD_STORE_RESERVE), the replication port's %d (limits.REPLICATION_HEADROOM)%s" % (
        limits.FD_STORE_RESERVE, limits.REPLICATION_HEADROOM,
        ", the MQTT cluster's peers' links in %d (limits.MQTT_CLUSTER_PEER_HEADROOM) and its links out %d "
        "(limits.MQTT_CLUSTER_LINK_FDS)"
        % (mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM, mqttcluster_limits.MQTT_CLUSTER_LINK_FDS)
        if config.in_mqtt_cluster() else "")
    raise_to = "raise the hard limit (ulimit -Hn, systemd's LimitNOFILE; the broker raises its soft limit up to " \
               "it) to at least %d"
    if wanted is None:
        change = raise_to % (reserve + 1)
        cap = "room for one connection (limits.max_connections unset follows the limit)"
    else:
        change = "lower the setting (at most %d here), %s, or leave the setting out (it then follows the limit)" % (
            max(0, nofile - reserve), raise_to % (reserve + wanted))
        cap = "its connection cap (limits.max_connections is %d)" % wanted
    raise ConfigError(
        "invalid configuration in %s: the open-files limit (ulimit -n) is %d, too low for this broker: it needs %d "
        "descriptors besides its connections (%s) plus %s; %s" % (source, nofile, reserve, parts, cap, change))


def raise_nofile_limit(config):
    """Raise this process's soft RLIMIT_NOFILE to what the broker of ``config`` needs (``ServerConfig.nofile_target``:
    never lowered, never past the hard limit) and return the soft limit it then runs with, logging one line from
    what to what and why. A login's or a service's soft limit is 1024 by default where the hard one allows far
    more; the JVM raises its own to the hard limit at start, Redis to maxclients plus its reserve. A refused raise
    is a warning, not a refusal: the broker goes on with the limit it has (``check_fd_limit`` refuses only one
    that cannot hold it).

    Called by the broker's process at its start (``metaq.server.__main__``), before ``check_fd_limit`` and the
    connection cap read the limit; never by a process that only reads the file (``--check-config``, the deploy
    agent)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = config.nofile_target(soft, hard)
    if target == soft:
        return soft
    wanted = config.limits.max_connections
    why = "%d descriptors kept back besides connections and %s" % (
        config.fd_reserve(), "a connection cap of %d (limits.max_connections)" % wanted if wanted is not None else
        "room for %d connections (limits.DEFAULT_CONNECTION_ROOM: limits.max_connections unset follows the "
        "limit)" % limits.DEFAULT_CONNECTION_ROOM)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-files limit (ulimit -n) from %d to %d for %s: %s; going on with %d",
                    soft, target, why, exc, soft)
        return soft
    log.info("raised the open-files limit (ulimit -n) from %d to %d%s for %s", soft, target,
             " (the hard limit)" if target == hard else "", why)
    return target


def load_config(path=None, overrides=None, flags=None):
    """``read_config``'s configuration, refused when this process's open-files limit as it is cannot hold it
    (``check_fd_limit``): for an in-process check of a file. A broker's start raises its limit first
    (``raise_nofile_limit``). Raises ConfigError (one line)."""
    config = read_config(path, overrides, flags)
    check_fd_limit(config, path or "(defaults)")
    return config


def read_config(path=None, overrides=None, flags=None):
    """Read ``path`` (YAML; None = built-in defaults), apply ``overrides`` and validate, with no check of this
    process's open-files limit: for a process that reads a broker's file without being that broker (the deploy
    agent), whose own limit is not the one the broker runs with.

    ``overrides`` maps dotted names (``broker.port``) to values; ``flags`` maps the same names to the
    command-line flag that gave the value (``--port 70000``), which a problem with it then names.
    Raises ConfigError (one line) with every problem listed by setting name, or the file and line of a
    key written twice.
    """
    raw = {}
    source = path or "(defaults)"
    if path is not None:
        raw = read_yaml(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError("configuration file %s must contain a mapping at the top level" % path)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(node, dict):  # else the schema says the section must be a mapping
            node[leaf] = value
    try:
        config = ServerConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(ServerConfig, source, exc, flags)) from None
    return config
