"""A test PKI made with the real ``openssl`` command: a CA, a broker certificate for 127.0.0.1, a client
certificate, and a second CA nobody trusts (a stranger's certificate)."""

import os
import subprocess


def _openssl(*args, cwd):
    subprocess.run(("openssl",) + args, cwd=cwd, check=True, capture_output=True, timeout=60)


class Pki:
    """Paths of PEM files under ``root``: ``ca``, ``server_cert``/``server_key``, ``client_cert``/``client_key``,
    ``rogue_ca``, ``rogue_cert``/``rogue_key`` (a client certificate signed by the untrusted CA)."""

    def __init__(self, root):
        self.root = str(root)
        os.makedirs(self.root, exist_ok=True)
        p = lambda name: os.path.join(self.root, name)  # noqa: E731
        self.ca, self.ca_key = p("ca.pem"), p("ca.key")
        self.server_cert, self.server_key = p("server.pem"), p("server.key")
        self.client_cert, self.client_key = p("client.pem"), p("client.key")
        self.rogue_ca, self.rogue_ca_key = p("rogue-ca.pem"), p("rogue-ca.key")
        self.rogue_cert, self.rogue_key = p("rogue.pem"), p("rogue.key")
        if not os.path.exists(self.rogue_cert):
            self._make()

    def _ca(self, cert, key, name):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=%s" % name, cwd=self.root)

    def _signed(self, cert, key, ca, ca_key, name, ext):
        csr = cert + ".csr"
        extfile = cert + ".ext"
        with open(extfile, "w") as f:
            f.write(ext)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                 "-out", csr, "-subj", "/CN=%s" % name, cwd=self.root)
        _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", extfile, cwd=self.root)

    def _make(self):
        self._ca(self.ca, self.ca_key, "metaq test CA")
        self._signed(self.server_cert, self.server_key, self.ca, self.ca_key, "127.0.0.1",
                     "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        self._signed(self.client_cert, self.client_key, self.ca, self.ca_key, "alice",
                     "extendedKeyUsage=clientAuth\n")
        self._ca(self.rogue_ca, self.rogue_ca_key, "somebody else's CA")
        self._signed(self.rogue_cert, self.rogue_key, self.rogue_ca, self.rogue_ca_key, "mallory",
                     "extendedKeyUsage=clientAuth\n")

    def tls_config(self, mode="on", verify_clients=False):
        """The broker's ``security.tls`` section for this PKI."""
        cfg = {"mode": mode, "cert": self.server_cert, "key": self.server_key}
        if verify_clients:
            cfg.update(ca=self.ca, verify_clients=True)
        return cfg
