"""A deployed broker as a systemd service: the unit ``fab deploy`` writes for it, and where.

    [Service] runs <install_dir>/current/venv/bin/metaq-server -c <install_dir>/conf/server.yaml as the deploying
    user, restarted on failure, started at boot (multi-user.target), LimitNOFILE from its connection limits.

``fab deploy`` always writes the unit to ``<install_dir>/conf/metaq-<name>.service`` (what would run, for an
operator to read or install); on a host whose init is systemd, deploying as root, it installs it in
``UNIT_DIR``, reloads systemd and enables it, and the deploy agent then starts and stops the broker through
``systemctl``. Elsewhere the agent runs the broker as a daemon of its own (no start at boot), as before.
"""

import posixpath
import resource

#: Where a host's own units live (systemd's directory for the administrator's units).
UNIT_DIR = "/etc/systemd/system"
#: How long systemd waits after a start failure before the next try, and for a stop before SIGKILL.
RESTART_SEC = 2
STOP_TIMEOUT_SEC = 60


def unit_name(broker_name):
    """``metaq-<name>.service`` (broker names are ``[A-Za-z0-9._-]``: a valid unit name as they are)."""
    return "metaq-%s.service" % broker_name


def installed_path(broker_name):
    """Where the unit of ``broker_name`` is installed on a host that runs systemd."""
    return posixpath.join(UNIT_DIR, unit_name(broker_name))


def nofile(config):
    """The open-files limit the broker of ``config`` (a ServerConfig) wants: what it keeps back for its files and
    links plus its connection cap (``limits.max_connections``; unset, DEFAULT_CONNECTION_ROOM), the figure it
    raises its own soft limit to at start when the hard limit allows (``ServerConfig.nofile_target``)."""
    return config.nofile_target(0, resource.RLIM_INFINITY)


def unit_text(layout, broker_name, cluster_name, user, open_files):
    """The unit's text for the broker ``broker_name`` installed under ``layout`` (a deploy Layout), run as
    ``user`` with ``LimitNOFILE=open_files``."""
    server = posixpath.join(layout.current, "venv", "bin", "metaq-server")
    return "\n".join([
        "# metaq broker %s of cluster %s. Written by `fab deploy` from the cluster inventory: the next deploy"
        % (broker_name, cluster_name),
        "# replaces it.",
        "[Unit]",
        "Description=metaq broker %s (cluster %s)" % (broker_name, cluster_name),
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        "User=%s" % user,
        "WorkingDirectory=%s" % layout.home,
        "ExecStart=%s -c %s" % (server, layout.config),
        "Restart=on-failure",
        "RestartSec=%d" % RESTART_SEC,
        "KillSignal=SIGTERM",
        "TimeoutStopSec=%d" % STOP_TIMEOUT_SEC,
        "LimitNOFILE=%d" % open_files,
        "StandardOutput=append:%s" % layout.log,
        "StandardError=inherit",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])
