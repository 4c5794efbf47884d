// The metaq dashboard's refresh: fetch the JSON API, fill the tables (textContent only: names are user
// data), topic rates between two fetches, Burrow's status per group partition (metaq/spark/burrow.py).
"use strict";
(function () {
  var REFRESH_MS = 1000 * (parseInt(document.body.getAttribute("data-refresh"), 10) || 5);
  var WINDOW = 10;            // commits kept per group partition (Burrow's "intervals")
  var previous = null;        // {at: ms, topics: {name: {puts, gets}}}
  var windows = {};           // "group\u0000topic\u0000partition" -> [{ts, offset, lag}]

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (cls) { td.className = cls; }
    tr.appendChild(td);
    return td;
  }

  function fill(id, rows, columns) {
    var body = document.querySelector("#" + id + " tbody");
    var fresh = document.createElement("tbody");
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (value, i) { cell(tr, value, columns && columns[i] ? columns[i](value) : null); });
      fresh.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr");
      tr.className = "empty";
      var td = cell(tr, "none");
      td.colSpan = document.querySelectorAll("#" + id + " thead th").length || 2;
      fresh.appendChild(tr);
    }
    body.parentNode.replaceChild(fresh, body);
  }

  // Burrow's rules, in Burrow's order (metaq/spark/burrow.py partition_status).
  function partitionStatus(window, lag, now) {
    if (lag === null || lag === undefined) { return "NOTFOUND"; }
    if (!window.length) { return "OK"; }
    if (lag === 0 || window.some(function (c) { return c.lag === 0; })) { return "OK"; }
    var pairs = [];
    for (var i = 1; i < window.length; i++) { pairs.push([window[i - 1], window[i]]); }
    if (pairs.some(function (p) { return p[1].offset < p[0].offset; })) { return "REWIND"; }
    var first = window[0], last = window[window.length - 1];
    if (now - last.ts > last.ts - first.ts) { return "STOP"; }
    if (pairs.every(function (p) { return p[1].offset === p[0].offset; })) { return "STALL"; }
    if (pairs.every(function (p) { return p[1].lag >= p[0].lag; })) { return "WARN"; }
    return "OK";
  }

  function remember(g) {
    var key = [g.group, g.topic, g.partition].join("\u0000");
    var w = windows[key] || (windows[key] = []);
    var ts = g.commit_ms / 1000.0;
    if (!w.length || w[w.length - 1].ts !== ts) {
      w.push({ts: ts, offset: g.offset, lag: g.lag});
      if (w.length > WINDOW) { w.shift(); }
    } else {
      w[w.length - 1].lag = g.lag;  // the same commit, the partition's end moved on
    }
    return w;
  }

  function rate(now, topic, field) {
    if (!previous || !previous.topics[topic.topic]) { return "…"; }
    var dt = (now - previous.at) / 1000.0;
    if (dt <= 0) { return "…"; }
    return ((topic[field] - previous.topics[topic.topic][field]) / dt).toFixed(1);
  }

  function get(path) {
    return fetch(path, {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (!r.ok) { throw new Error(path + ": HTTP " + r.status); }
      return r.json();
    });
  }

  function refresh() {
    Promise.all([get("/api/broker"), get("/api/topics"), get("/api/groups"), get("/api/replication")])
      .then(function (got) {
        var broker = got[0], topics = got[1].topics, groups = got[2].groups, repl = got[3];
        var now = Date.now();
        fill("broker", [
          ["broker id", broker.broker_id], ["version", broker.version], ["uptime (s)", broker.uptime],
          ["ready", broker.ready ? "yes" : "no: " + broker.not_ready_reason],
          ["disk usage", (100 * (broker.disk_usage || 0)).toFixed(1) + " %"],
          ["writes refused", broker.writes_refused], ["connections (text port)", broker.curr_connections],
          ["messages", broker.total_messages]]);
        fill("replication", Object.keys(repl).sort().map(function (k) { return [k, repl[k]]; }));
        fill("topics", topics.map(function (t) {
          return [t.topic, t.partitions, t.messages, t.bytes, rate(now, t, "puts_total"), rate(now, t, "gets_total")];
        }));
        var seconds = now / 1000.0;
        fill("groups", groups.map(function (g) {
          var status = partitionStatus(remember(g), g.lag, seconds);
          return [g.group, g.topic, g.partition, g.offset, g.max_offset, g.lag, status];
        }), [null, null, null, null, null, null, function (status) { return status; }]);
        previous = {at: now, topics: {}};
        topics.forEach(function (t) { previous.topics[t.topic] = {puts_total: t.puts_total, gets_total: t.gets_total}; });
        document.getElementById("status").textContent =
          "updated " + new Date(now).toLocaleTimeString() + "; refreshing every " + REFRESH_MS / 1000 + " s";
      })
      .catch(function (err) {
        document.getElementById("status").textContent = "refresh failed: " + err.message;
      });
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
}());
