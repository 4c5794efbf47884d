"""A real OpenSSH server (Debian's ``openssh-server``) on 127.0.0.1 and 127.0.0.2, for deploy tests.

``SshServer(workdir).start()`` generates a host key and a client key in ``workdir``, writes an
sshd_config (a free port on both addresses, the generated key authorized for root, SFTP on,
no PAM, no passwords) and runs ``/usr/sbin/sshd -D -e`` in the foreground until both addresses
greet with an SSH banner. ``stop()`` acts on its own PID. Both "hosts" are this machine.
"""

import os
import shutil
import socket
import subprocess
import time

from metaq.client.local import free_port

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
ADDRESSES = ("127.0.0.1", "127.0.0.2")


def sshd_missing_reason():
    """Why real-SSH tests cannot run here, or None."""
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        return "needs Debian's openssh-server (/usr/sbin/sshd; make test installs it)"
    if os.geteuid() != 0:
        return "needs root (sshd's privilege separation, login as root)"
    return None


def _free_on_all(addresses):
    """A port free on every address right now."""
    for _ in range(50):
        port = free_port(addresses[0])  # below the kernel's ephemeral range (metaq.client.local.free_port)
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on all of %s" % (addresses,))


def _banner(address, port, timeout=0.5):
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


class SshServer:
    def __init__(self, workdir, addresses=ADDRESSES):
        self.dir = str(workdir)
        self.addresses = addresses
        self.port = None
        self.proc = None
        self.key = os.path.join(self.dir, "id_ed25519")
        self.log_path = os.path.join(self.dir, "sshd.log")

    def _keys(self):
        os.makedirs(self.dir, exist_ok=True)
        os.chmod(self.dir, 0o700)
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for path, comment in ((os.path.join(self.dir, "ssh_host_ed25519_key"), "host"), (self.key, "fabric-test")):
            if not os.path.exists(path):
                subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path], check=True)
        shutil.copy(self.key + ".pub", os.path.join(self.dir, "authorized_keys"))
        os.chmod(os.path.join(self.dir, "authorized_keys"), 0o600)

    def _config(self):
        lines = ["Port %d" % self.port] + ["ListenAddress %s" % a for a in self.addresses] + [
            "HostKey %s/ssh_host_ed25519_key" % self.dir,
            "PidFile %s/sshd.pid" % self.dir,
            "AuthorizedKeysFile %s/authorized_keys" % self.dir,
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 100",
            "MaxSessions 50",
            "Subsystem sftp internal-sftp",
        ]
        path = os.path.join(self.dir, "sshd_config")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self, timeout=10.0):
        self._keys()
        for _attempt in range(3):
            self.port = _free_on_all(self.addresses)
            config = self._config()
            subprocess.run([SSHD, "-t", "-f", config], check=True, capture_output=True)
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                if all(_banner(a, self.port) for a in self.addresses):
                    return self
                time.sleep(0.05)
            self.stop()  # the port was taken meanwhile, or sshd is slow: try another port
        raise RuntimeError("sshd did not come up:\n%s" % self.log_text())

    def log_text(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
