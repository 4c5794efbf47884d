"""A TLS-terminating proxy in front of a plaintext broker (a thread of the test process): clients speak TLS to
it, it forwards the bytes to the broker. For testing clients' TLS before (or without) TLS on the broker itself.

``TlsProxy(target, cert, key, ca=None)``: with ``ca``, client certificates are required and verified against
it. ``accepted`` counts completed TLS handshakes, ``refused`` failed ones, ``peer_names`` the client
certificates' common names seen."""

import socket
import ssl
import threading


class TlsProxy:
    def __init__(self, target, cert, key, ca=None):
        self.target = target
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        if ca is not None:
            self.ctx.load_verify_locations(ca)
            self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.accepted = self.refused = 0
        self.peer_names = []
        self._stop = threading.Event()
        self._threads = []
        self._socks = []
        self._thread = threading.Thread(target=self._accept_loop, name="tls-proxy", daemon=True)

    @property
    def url(self):
        return "meta://127.0.0.1:%d" % self.port

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.listener.close()
        for s in list(self._socks):
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, raw):
        raw.settimeout(10)
        try:
            tls = self.ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            self.refused += 1
            raw.close()
            return
        self.accepted += 1
        cert = tls.getpeercert()
        if cert:
            self.peer_names.append(dict(x[0] for x in cert["subject"])["commonName"])
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            tls.close()
            return
        tls.settimeout(None)
        upstream.settimeout(None)
        self._socks += [tls, upstream]
        back = threading.Thread(target=self._pump, args=(upstream, tls), daemon=True)
        self._threads.append(back)
        back.start()
        self._pump(tls, upstream)

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
