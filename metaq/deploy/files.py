"""The files a broker's configuration names on its host but the inventory never holds: the ACL file, the
replication secret, the TLS certificate, key and CA, the agent's credentials file (``fab files``).

    fab files --acl conf/acl.yaml --secret secrets/replication --cert 'certs/{host}.pem' --key 'certs/{host}.key'

Each option is a local path (``{host}`` and ``{name}`` become the broker's host and name, for per-host
certificates); the file goes to the path the broker's rendered server.yaml names for it (``security.acl_file``,
``security.replication_secret_file``, ``security.tls.cert`` / ``key`` / ``ca``; the inventory's ``credentials``),
written whole (a temporary name, then a rename) with mode 0600, its directory made 0700 when missing. A file
given for a setting a broker does not set is an error naming the setting: the inventory says where each file
goes, the command line says where it comes from, and no secret is ever in the inventory. Pure: the upload is
hostops.send_files.
"""

import os

from metaq.deploy.inventory import InventoryError, server_config

__all__ = ["KINDS", "planned"]

#: Option -> (what it is, where the rendered server.yaml names its path on the host).
KINDS = {
    "acl": ("the ACL file", ("security", "acl_file")),
    "secret": ("the replication secret", ("security", "replication_secret_file")),
    "cert": ("the TLS certificate", ("security", "tls", "cert")),
    "key": ("the TLS private key", ("security", "tls", "key")),
    "ca": ("the TLS CA", ("security", "tls", "ca")),
    "credentials": ("the agent's credentials file", None),  # the inventory's own `credentials:`
}


def _setting(doc, path):
    for part in path:
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


def destination(broker, kind):
    """The path on the broker's host where the file of ``kind`` goes, or None when the broker sets none."""
    where = KINDS[kind][1]
    return broker.credentials if where is None else _setting(server_config(broker), where)


def planned(broker, given):
    """``[(kind, local path, host path)]`` for ``broker`` from ``given`` (kind -> local path template).
    InventoryError naming each problem: a kind the broker sets no path for, a local file missing."""
    out, problems = [], []
    for kind, template in sorted(given.items()):
        if not template:
            continue
        what, where = KINDS[kind]
        target = destination(broker, kind)
        if not target:
            setting = "credentials" if where is None else "server.%s" % ".".join(where)
            problems.append("%s: %s given but %s is not set for it: set where it goes in the inventory"
                            % (broker.name, what, setting))
            continue
        local = template.replace("{host}", broker.host).replace("{name}", broker.name)
        if not os.path.isfile(local):
            problems.append("%s: %s: no file %s here" % (broker.name, what, local))
            continue
        out.append((kind, local, target))
    if problems:
        raise InventoryError("; ".join(problems))
    return out
