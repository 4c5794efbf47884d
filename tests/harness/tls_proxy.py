"""A TLS-terminating proxy in front of a plaintext broker (a thread of the test process): clients speak TLS to
it, it forwards the bytes to the broker. For testing clients' TLS before (or without) TLS on the broker itself.

``TlsProxy(target, cert, key, ca=None)``: with ``ca``, client certificates are required and verified against
it. ``accepted`` counts completed TLS handshakes, ``refused`` failed ones, ``peer_names`` the client
certificates' common names seen."""

import select
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
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            tls.close()
            return
        self._socks += [tls, upstream]
        self._relay(tls, upstream)

    def _relay(self, tls, upstream):
        """Both directions in this one thread: an SSLSocket must not be read and written by two threads at once."""
        tls.settimeout(1.0)
        upstream.settimeout(1.0)
        try:
            while not self._stop.is_set():
                ready = [tls] if tls.pending() else select.select([tls, upstream], [], [], 0.2)[0]
                if tls in ready:
                    try:
                        data = tls.recv(65536)
                    except (ssl.SSLWantReadError, socket.timeout):
                        data = None  # a partial record: more to come
                    if data == b"":
                        break
                    if data:
                        upstream.sendall(data)
                if upstream in ready:
                    data = upstream.recv(65536)
                    if not data:
                        break
                    tls.sendall(data)
        except OSError:
            pass
        for s in (tls, upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
