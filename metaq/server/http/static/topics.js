/* The dashboard's topic page (metaq/server/http/topicview.py): connects to the broker's MQTT WebSocket listener on
   the host the page came from with the name and secret typed in (kept in the form only), subscribes to the filters
   typed, shows each message as it arrives (the newest DASHBOARD_MAX_MESSAGES rows) and publishes one. Everything
   is written as text, never as markup. */
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const data = document.body.dataset;
  const limits = {messages: +data.maxMessages, packet: +data.maxPacket, shown: +data.shownPayload,
                  inflight: +data.maxInflight, keepalive: +data.keepalive};
  let client = null, received = 0;

  // ws:// beside a page over http, wss:// beside one over https (a page over https may not open ws://)
  function endpoint() {
    const secure = location.protocol === "https:";
    const port = secure ? data.wssPort : (data.wsPort || data.wssPort);
    if (!port) {
      return {error: secure ? "off for a page over https: the broker has no mqtt.wss_port"
                            : "off: the broker has neither mqtt.ws_port nor mqtt.wss_port"};
    }
    const scheme = (secure || !data.wsPort) ? "wss" : "ws";
    return {url: scheme + "://" + location.hostname + ":" + port + data.wsPath};
  }

  function say(id, text) { $(id).textContent = text; }

  function note(listId, text) {
    const li = document.createElement("li");
    li.textContent = text;
    const list = $(listId);
    list.insertBefore(li, list.firstChild);
    while (list.children.length > limits.messages) list.removeChild(list.lastChild);
    return li;
  }

  // text when the bytes are UTF-8 without control characters (but tab and line ends), else hex
  function shown(payload) {
    const part = payload.subarray(0, limits.shown);
    let text;
    try {
      text = new TextDecoder("utf-8", {fatal: true}).decode(part);
      if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/.test(text)) text = null;
    } catch (e) {
      text = null;  // not UTF-8, or cut inside a character: hex
    }
    if (text === null) {
      text = "hex: " + Array.from(part, (b) => b.toString(16).padStart(2, "0")).join(" ");
    }
    if (payload.length > part.length) text += " … (" + payload.length + " bytes, the first " + part.length + " shown)";
    return text;
  }

  function addMessage(m) {
    received += 1;
    const tr = document.createElement("tr");
    for (const v of [received, m.topic, m.qos, m.retain ? "yes" : "no", shown(m.payload)]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.appendChild(td);
    }
    const body = $("messages").tBodies[0];
    body.appendChild(tr);
    while (body.rows.length > limits.messages) body.deleteRow(0);
  }

  function connected(on) {
    $("connect").disabled = on;
    $("disconnect").disabled = !on;
    $("subscribe").disabled = !on;
    $("send").disabled = !on;
  }

  function connect(event) {
    event.preventDefault();
    const where = endpoint();
    if (where.error) return;
    if (client) client.disconnect();
    const user = $("user").value;
    const id = new Uint8Array(6);
    crypto.getRandomValues(id);
    const clientId = "dashboard-" + Array.from(id, (b) => b.toString(16).padStart(2, "0")).join("");
    say("state", "connecting to " + where.url + " as " + (user || "no user") + " …");
    const c = new MqttClient(where.url, {clientId: clientId, user: user, password: $("secret").value,
                                         keepalive: limits.keepalive, maxPacket: limits.packet,
                                         maxInflight: limits.inflight});
    $("secret").value = "";  // in the CONNECT only: not left in the form
    client = c;
    c.onconnect = () => {
      say("state", "connected to " + where.url + " as " + (user || "no user") + " (client id " + clientId + ")");
      connected(true);
    };
    c.onrefused = (code, words) => say("state", "refused by the broker: CONNACK " + code + " (" + words + ")");
    c.onmessage = addMessage;
    c.onsuback = (filter, code) => {
      note("subscriptions", filter + ": " + (code === 0x80 ? "refused by the broker (SUBACK 0x80: not permitted, " +
                                                             "or not a valid filter)" : "granted QoS " + code));
    };
    c.onpuback = (topic) => note("published", topic + ": acknowledged (PUBACK)");
    c.onclose = (e) => {
      if (client !== c) return;
      client = null;
      connected(false);
      let text = "not connected: " + e.why;
      if (e.unacked.length) {
        text += "; unacknowledged: " + e.unacked.join(", ") + " (MQTT 3.1.1 refuses a PUBLISH by closing the " +
                "connection: not permitted, or not a valid topic)";
      }
      say("state", text);
    };
  }

  function subscribe(event) {
    event.preventDefault();
    const filter = $("filter").value;
    try {
      client.subscribe(filter, +$("sub-qos").value);
      note("subscriptions", filter + ": asked");
    } catch (e) {
      note("subscriptions", filter + ": refused in the page: " + e.message);
    }
  }

  function publish(event) {
    event.preventDefault();
    const topic = $("pub-topic").value, qos = +$("pub-qos").value;
    try {
      if (!topic) throw new Error("a topic name is needed");
      client.publish(topic, new TextEncoder().encode($("pub-payload").value), qos, $("pub-retain").checked);
      note("published", topic + ": " + (qos === 0 ? "sent (QoS 0: no acknowledgement)" : "sent, waiting for PUBACK"));
    } catch (e) {
      note("published", topic + ": refused in the page: " + e.message);
    }
  }

  const where = endpoint();
  say("endpoint", "MQTT over WebSocket: " + (where.url || where.error));
  $("connect").disabled = !!where.error;
  $("login").addEventListener("submit", connect);
  $("disconnect").addEventListener("click", () => { if (client) client.disconnect(); });
  $("watch").addEventListener("submit", subscribe);
  $("publish").addEventListener("submit", publish);
})();
