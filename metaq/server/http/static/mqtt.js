/* An MQTT 3.1.1 client over a WebSocket (subprotocol "mqtt", binary frames), for the dashboard's topic page:
   CONNECT with a user name and password, SUBSCRIBE, PUBLISH at QoS 0 and 1 both ways (PUBACK), a PINGREQ when
   nothing was sent for the keep-alive, DISCONNECT. Bounded: a packet longer than maxPacket is refused at its length
   field and closes the connection; at most maxInflight QoS 1 PUBLISHes and SUBSCRIBEs wait for their answer.
   The password is sent in the CONNECT and dropped then. Callbacks (set on the client): onconnect(),
   onrefused(code, words), onmessage({topic, qos, retain, payload}), onsuback(filter, code), onpuback(topic),
   onclose({why, unacked}) with the topics of the PUBLISHes never acknowledged. */
"use strict";

const MqttClient = (function () {
  const CONNACK_WORDS = {1: "unacceptable protocol version", 2: "client identifier rejected",
                         3: "server unavailable", 4: "bad user name or password", 5: "not authorized"};
  const encoder = new TextEncoder();
  const decoder = new TextDecoder("utf-8");

  function utf8String(s) {
    const b = encoder.encode(s);
    if (b.length > 65535) throw new Error("longer than 65535 bytes in UTF-8");
    const out = new Uint8Array(2 + b.length);
    out[0] = b.length >> 8;
    out[1] = b.length & 255;
    out.set(b, 2);
    return out;
  }

  function u16(n) { return new Uint8Array([n >> 8, n & 255]); }

  // one control packet: its first byte, the Remaining Length, then the parts
  function packet(first, parts) {
    let length = 0;
    for (const p of parts) length += p.length;
    const head = [first];
    let n = length;
    do {
      let digit = n % 128;
      n = Math.floor(n / 128);
      if (n > 0) digit |= 128;
      head.push(digit);
    } while (n > 0);
    const out = new Uint8Array(head.length + length);
    out.set(head, 0);
    let at = head.length;
    for (const p of parts) { out.set(p, at); at += p.length; }
    return out;
  }

  class Client {
    /* url: ws:// or wss://; opts: clientId, user, password, keepalive (s), maxPacket, maxInflight */
    constructor(url, opts) {
      this.opts = Object.assign({}, opts);
      this.buf = new Uint8Array(0);
      this.waiting = new Map();  // packet id -> {kind: "publish" | "subscribe", topic or filter}
      this.nextId = 1;
      this.connected = false;
      this.failure = null;
      this.lastSent = 0;
      this.pingSent = 0;
      this.ws = new WebSocket(url, ["mqtt"]);
      this.ws.binaryType = "arraybuffer";
      this.opened = false;
      this.ws.onopen = () => { this.opened = true; this.sendConnect(); };
      this.ws.onmessage = (e) => this.received(e.data);
      this.ws.onclose = (e) => this.closed(e);
      this.timer = setInterval(() => this.tick(), 1000);
    }

    send(bytes) {
      this.ws.send(bytes);
      this.lastSent = Date.now();
    }

    sendConnect() {
      const o = this.opts;
      let flags = 0x02;  // a clean session: the page's subscriptions end with it
      const parts = [utf8String("MQTT"), new Uint8Array([4]), null, u16(o.keepalive), utf8String(o.clientId)];
      if (o.user) { flags |= 0x80; parts.push(utf8String(o.user)); }
      if (o.user && o.password) { flags |= 0x40; parts.push(utf8String(o.password)); }
      parts[2] = new Uint8Array([flags]);
      this.send(packet(0x10, parts));
      this.opts.password = null;  // sent: kept nowhere
    }

    freeId() {
      for (let i = 0; i < 65535; i++) {
        const id = this.nextId;
        this.nextId = id === 65535 ? 1 : id + 1;
        if (!this.waiting.has(id)) return id;
      }
      throw new Error("no free packet identifier");
    }

    /* Subscribe to filter at qos (0 or 1); an Error (said to the user) when the page's limits refuse it. */
    subscribe(filter, qos) {
      this.mayWait();
      const id = this.freeId();
      this.waiting.set(id, {kind: "subscribe", name: filter});
      this.send(packet(0x82, [u16(id), utf8String(filter), new Uint8Array([qos])]));
    }

    /* Publish payload (Uint8Array) to topic at qos 0 or 1; an Error when the page's limits refuse it. */
    publish(topic, payload, qos, retain) {
      const name = utf8String(topic);
      const size = 5 + name.length + 2 + payload.length;
      if (size > this.opts.maxPacket) {
        throw new Error("a PUBLISH of " + size + " bytes passes the page's " + this.opts.maxPacket +
                        " (limits.DASHBOARD_MAX_PACKET_BYTES)");
      }
      const first = 0x30 | (qos << 1) | (retain ? 1 : 0);
      if (qos === 0) {
        this.send(packet(first, [name, payload]));
        return;
      }
      this.mayWait();
      const id = this.freeId();
      this.waiting.set(id, {kind: "publish", name: topic});
      this.send(packet(first, [name, u16(id), payload]));
    }

    mayWait() {
      if (!this.connected) throw new Error("not connected");
      if (this.waiting.size >= this.opts.maxInflight) {
        throw new Error(this.waiting.size + " packets wait for the broker's answer (limits.DASHBOARD_MAX_INFLIGHT): " +
                        "wait for their acknowledgements");
      }
    }

    disconnect() {
      if (this.ws.readyState === WebSocket.OPEN) {
        this.failure = "disconnected";
        this.send(new Uint8Array([0xE0, 0]));
        this.ws.close(1000);
      }
    }

    fail(why) {
      if (this.failure === null) this.failure = why;
      this.ws.close(1000);
    }

    tick() {
      if (!this.connected) return;
      const now = Date.now(), keep = this.opts.keepalive * 1000;
      if (this.pingSent && now - this.pingSent > keep) {
        this.fail("no PINGRESP within the keep-alive (" + this.opts.keepalive + " s)");
      } else if (!this.pingSent && now - this.lastSent >= keep) {
        this.send(new Uint8Array([0xC0, 0]));
        this.pingSent = now;
      }
    }

    received(data) {
      if (!(data instanceof ArrayBuffer)) return this.fail("a text frame: MQTT over WebSocket is binary");
      const chunk = new Uint8Array(data);
      const joined = new Uint8Array(this.buf.length + chunk.length);
      joined.set(this.buf, 0);
      joined.set(chunk, this.buf.length);
      let at = 0;
      while (this.failure === null) {
        // the fixed header: a type byte and 1 to 4 bytes of Remaining Length
        let length = 0, mult = 1, i = at + 1, done = false;
        for (; i < joined.length && i < at + 5; i++) {
          length += (joined[i] & 127) * mult;
          mult *= 128;
          if ((joined[i] & 128) === 0) { done = true; i++; break; }
        }
        if (!done) {
          if (joined.length - at >= 5) this.fail("a Remaining Length longer than 4 bytes");
          break;
        }
        const total = (i - at) + length;
        if (total > this.opts.maxPacket) {
          this.fail("a packet of " + total + " bytes passes the page's limit of " + this.opts.maxPacket +
                    " bytes (limits.DASHBOARD_MAX_PACKET_BYTES)");
          break;
        }
        if (joined.length - at < total) break;
        this.handle(joined[at], joined.subarray(i, at + total));
        at += total;
      }
      this.buf = joined.slice(at);
    }

    handle(first, body) {
      const type = first >> 4;
      if (type === 2) {  // CONNACK
        const code = body[1];
        if (code === 0) {
          this.connected = true;
          if (this.onconnect) this.onconnect();
        } else {
          this.failure = "refused: CONNACK " + code + " (" + (CONNACK_WORDS[code] || "unknown") + ")";
          if (this.onrefused) this.onrefused(code, CONNACK_WORDS[code] || "unknown");
          this.ws.close(1000);
        }
      } else if (type === 3) {  // PUBLISH
        const qos = (first >> 1) & 3, retain = (first & 1) === 1;
        const n = (body[0] << 8) | body[1];
        const topic = decoder.decode(body.subarray(2, 2 + n));
        let at = 2 + n;
        if (qos > 1) return this.fail("a QoS 2 PUBLISH: the page subscribes at QoS 1 at most");
        if (qos === 1) {
          this.send(packet(0x40, [body.subarray(at, at + 2)]));  // PUBACK
          at += 2;
        }
        if (this.onmessage) this.onmessage({topic: topic, qos: qos, retain: retain, payload: body.subarray(at)});
      } else if (type === 4) {  // PUBACK
        const id = (body[0] << 8) | body[1], w = this.waiting.get(id);
        this.waiting.delete(id);
        if (w && this.onpuback) this.onpuback(w.name);
      } else if (type === 9) {  // SUBACK
        const id = (body[0] << 8) | body[1], w = this.waiting.get(id);
        this.waiting.delete(id);
        if (w && this.onsuback) this.onsuback(w.name, body[2]);
      } else if (type === 13) {  // PINGRESP
        this.pingSent = 0;
      } else {
        this.fail("an unexpected packet of type " + type);
      }
    }

    closed(e) {
      clearInterval(this.timer);
      this.connected = false;
      const unacked = [];
      for (const w of this.waiting.values()) if (w.kind === "publish") unacked.push(w.name);
      this.waiting.clear();
      let why = this.failure || ("the broker closed the connection (WebSocket close " + e.code + ")");
      if (!this.opened) {
        why = "the WebSocket did not open: the listener refused the handshake (is this page's origin, " +
              location.origin + ", missing from mqtt.ws_allowed_origins?) or is not reachable";
      }
      if (this.onclose) this.onclose({why: why, unacked: unacked});
    }
  }

  return Client;
})();
