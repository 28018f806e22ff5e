// The Queen dashboard: a client of the broker's HTTP API like any other.
// Every value from the broker is put into the page as text (textContent),
// never as HTML, so a queue or partition name cannot inject markup. The
// current page reloads its data every 5 s. With JWT on, a 401 asks for a
// token, kept for the tab in sessionStorage and sent as a Bearer; the
// token's role hides the buttons the broker would refuse.
"use strict";

const REFRESH_MS = 5000;
const PAGE = 50;
let timer = null;
let charts = [];

// ---------------------------------------------------------------- helpers

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const fmt = (n) => (n === null || n === undefined ? "-" : typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 2 }) : String(n));
const enc = encodeURIComponent;

function age(iso) {
  if (!iso) return "-";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function toast(text, bad) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.className = bad ? "bad" : "";
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.className = "hidden"), 4000);
}

// ---------------------------------------------------------------- the API

function token() {
  return sessionStorage.getItem("queen-token");
}

// The tenant an admin across tenants picked in the selector (sent as
// x-queen-tenant on every call); none: the caller's own.
function pickedTenant() {
  return sessionStorage.getItem("queen-tenant");
}

function headersFor(extra) {
  const h = Object.assign({}, extra);
  if (token()) h.authorization = "Bearer " + token();
  if (pickedTenant()) h["x-queen-tenant"] = pickedTenant();
  return h;
}

// Who the token names, as the broker reads it (GET /auth/me: the role
// claims' names are the broker's configuration, so the page does not
// decode the token itself), shown in the header; the role hides the
// buttons the broker would refuse.
async function applyRole() {
  let me = null;
  try {
    const r = await fetch("/auth/me", { headers: headersFor({}) });
    if (r.ok) me = await r.json();
  } catch (e) { me = null; }
  const role = me && me.role;
  document.body.classList.toggle("readonly", !!role && role !== "admin" && role !== "read-write");
  document.body.classList.toggle("notadmin", !!role && role !== "admin");
  const who = me && !me.standalone ? [`${me.subject || "(no subject)"} · ${me.role}`] : [];
  // With tenancy on the page shows one tenant's data: say whose.
  if (me && me.tenancy) who.push(`tenant ${me.tenant}`);
  document.getElementById("whoami").textContent = who.join(" · ");
  await tenantSelector(me);
}

// An admin across tenants picks the tenant the page shows, among those
// GET /api/v1/resources/tenants lists; anyone else sees their own only.
async function tenantSelector(me) {
  const select = document.getElementById("tenant");
  if (!me || !me.adminAllTenants) {
    select.classList.add("hidden");
    return;
  }
  let listed = [];
  try {
    listed = (await get("/api/v1/resources/tenants")).tenants.map((t) => t.tenant);
  } catch (e) { listed = []; }
  const ids = [...new Set([me.tenant, ...listed])].sort();
  select.replaceChildren(...ids.map((t) => el("option", { value: t }, t)));
  select.value = me.tenant;
  select.classList.remove("hidden");
}

async function api(method, path, body) {
  const headers = headersFor({ "content-type": "application/json" });
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401) {
    document.getElementById("signin").classList.remove("hidden");
    throw new Error("the broker wants a token: sign in");
  }
  const text = await r.text();
  const data = text ? JSON.parse(text) : null;
  if (!r.ok) throw new Error(`${r.status} ${(data && (data.error || data.detail)) || text}`);
  return data;
}

const get = (p) => api("GET", p);

async function act(what, fn) {
  try {
    await fn();
    toast(what + ": done");
    route();
  } catch (e) {
    toast(what + " failed: " + e.message, true);
  }
}

function confirmAct(question, what, fn) {
  if (window.confirm(question)) act(what, fn);
}

// ---------------------------------------------------------------- tables

// A table of `rows`; `cols` are {key, label, num?, render?(row) -> node|text}.
// Sorting by a header click; paging by PAGE rows.
function table(cols, rows, opts = {}) {
  const state = opts.state || { sort: null, dir: 1, page: 0 };
  const wrap = el("div", {});
  const draw = () => {
    let sorted = rows.slice();
    if (state.sort) {
      const c = cols.find((c) => c.key === state.sort);
      const val = c.sortValue || ((r) => r[c.key]);
      sorted.sort((a, b) => {
        const x = val(a), y = val(b);
        return (x > y ? 1 : x < y ? -1 : 0) * state.dir;
      });
    }
    const pages = Math.max(1, Math.ceil(sorted.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const shown = sorted.slice(state.page * PAGE, state.page * PAGE + PAGE);
    const head = el("tr", {}, cols.map((c) => el("th", {
      class: (c.num ? "num " : "") + (c.nosort ? "" : "sortable"),
      onclick: c.nosort ? null : () => { state.dir = state.sort === c.key ? -state.dir : 1; state.sort = c.key; draw(); },
    }, c.label + (state.sort === c.key ? (state.dir > 0 ? " ▲" : " ▼") : ""))));
    const body = shown.map((r) => el("tr", { "data-key": opts.key ? opts.key(r) : null },
      cols.map((c) => el("td", { class: c.num ? "num" : "" }, c.render ? c.render(r) : fmt(r[c.key])))));
    const pager = pages > 1 ? el("div", { class: "pager" },
      el("button", { onclick: () => { state.page = Math.max(0, state.page - 1); draw(); } }, "‹ previous"),
      `page ${state.page + 1} of ${pages} (${sorted.length} rows)`,
      el("button", { onclick: () => { state.page = Math.min(pages - 1, state.page + 1); draw(); } }, "next ›")) : null;
    wrap.replaceChildren(el("table", { class: opts.class || "" }, el("thead", {}, head), el("tbody", {}, body.length ? body : el("tr", {}, el("td", { colspan: cols.length, class: "muted" }, opts.empty || "nothing here")))), pager || "");
  };
  draw();
  return wrap;
}

const link = (href, text) => el("a", { href }, text);

// ---------------------------------------------------------------- charts

// A line chart over the window [from, to] (epoch seconds), so that a
// window with few samples still reads as time.
function chart(title, labels, times, series, from, to) {
  const box = el("div", { class: "chart" }, el("div", { class: "muted" }, title));
  const colors = ["#6b3fa0", "#1e7bd8", "#1e7b34", "#b3261e"];
  const opts = {
    width: 600, height: 220,
    series: [{}].concat(labels.map((l, i) => ({ label: l, stroke: colors[i % colors.length], width: 1.5 }))),
    axes: [{}, { size: 60 }],
    scales: { x: { time: true, range: [from, to] }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
  };
  requestAnimationFrame(() => {
    opts.width = Math.max(300, box.clientWidth - 16);
    charts.push(new uPlot(opts, [times].concat(series), box));
  });
  return box;
}

// ---------------------------------------------------------------- pages

const pages = {};
let tableState = {};

pages.overview = async () => {
  const range = sessionStorage.getItem("queen-range") || "hour";
  const from = new Date(Date.now() - (range === "day" ? 86400e3 : 3600e3)).toISOString();
  const fromS = Date.parse(from) / 1000, nowS = Date.now() / 1000;
  const interval = range === "day" ? "hour" : "minute";
  const [s, broker, traffic, ops, brokers] = await Promise.all([
    get("/api/v1/status"), get("/status"),
    get(`/api/v1/status/analytics?from=${enc(from)}&interval=${interval}`),
    get(`/api/v1/analytics/queue-ops?from=${enc(from)}&interval=${interval}&limit=1000`),
    // Admin only: a reader without the role sees this broker alone.
    get("/api/v1/system/brokers").catch(() => null),
  ]);
  const card = (k, v, id) => el("div", { class: "card", id }, el("div", { class: "k" }, k), el("div", { class: "v" }, fmt(v)));
  const t = traffic.series.map((p) => Date.parse(p.bucket) / 1000);
  const dlq = new Map();
  for (const q of ops.queues) for (const p of q.series) dlq.set(p.t, (dlq.get(p.t) || 0) + (p.deadLettered || 0));
  const dt = [...dlq.keys()].sort();
  return [
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      card("queues", s.queues, "total-queues"), card("partitions", s.partitions, "total-partitions"),
      card("pending messages", s.messages.pending, "total-pending"), card("messages", s.messages.total, "total-messages"),
      card("consumer groups", s.consumerGroups, "total-groups"), card("dead letters", s.deadLetters, "total-dlq"),
      card("max lag (s)", s.maxLagSeconds, "max-lag"), card("active leases", s.leases.active, "leases")),
    el("div", { class: "toolbar" }, "Range:",
      el("select", { id: "range", onchange: (e) => { sessionStorage.setItem("queen-range", e.target.value); route(); } },
        el("option", { value: "hour", selected: range === "hour" }, "last hour"), el("option", { value: "day", selected: range === "day" }, "last day"))),
    el("div", { class: "charts" },
      chart(`messages per ${interval}`, ["pushed", "popped", "acked"], t,
        [traffic.series.map((p) => p.pushed), traffic.series.map((p) => p.popped), traffic.series.map((p) => p.acked)], fromS, nowS),
      chart(`dead letters per ${interval}`, ["dead-lettered"], dt.map((x) => Date.parse(x) / 1000), [dt.map((x) => dlq.get(x))], fromS, nowS)),
    el("h2", {}, "Broker"),
    el("div", { class: "cards" },
      card("version", broker.version), card("uptime", age(new Date(Date.now() - broker.uptimeSeconds * 1000).toISOString())),
      card("database", broker.database && broker.database.reachable ? `up (${fmt(broker.database.roundTripMs)} ms)` : "unreachable"),
      card("server", broker.serverId)),
    brokers ? [el("h2", {}, `Brokers on this database (${brokers.live} live)`), table([
      { key: "serverId", label: "Server", render: (b) => b.serverId + (b.self ? " (this one)" : "") },
      { key: "version", label: "Version" }, { key: "startedAt", label: "Started", render: (b) => age(b.startedAt) + " ago" },
      { key: "secondsSinceHeartbeat", label: "Last heartbeat (s)", num: true },
      { key: "live", label: "State", render: (b) => el("span", { class: b.live ? "ok" : "bad" }, b.live ? "live" : "silent") },
    ], brokers.brokers, { class: "brokers" })] : [],
  ];
};

pages.queues = async () => {
  const [work, lag] = await Promise.all([get("/api/v1/analytics/workload?limit=1000"), get("/api/v1/analytics/queue-lag?limit=1000")]);
  const oldest = new Map((lag.queues || []).map((q) => [q.queue, q.oldestPendingAt]));
  const rows = work.queues.map((q) => ({ ...q, oldestPendingAt: oldest.get(q.queue) || null }));
  const filter = (sessionStorage.getItem("queen-filter") || "").toLowerCase();
  const shown = rows.filter((r) => r.queue.toLowerCase().includes(filter));
  tableState.queues = tableState.queues || { sort: "pendingMessages", dir: -1, page: 0 };
  return [
    el("h1", {}, "Queues"),
    el("div", { class: "toolbar" }, el("input", { id: "queue-filter", placeholder: "search queues", value: filter,
      oninput: (e) => { sessionStorage.setItem("queen-filter", e.target.value); route(true); } })),
    table([
      { key: "queue", label: "Queue", render: (r) => link(`#/queue/${enc(r.queue)}`, r.queue) },
      { key: "pendingMessages", label: "Pending", num: true },
      { key: "partitions", label: "Partitions", num: true },
      { key: "groups", label: "Groups", num: true },
      { key: "pushPerSecond", label: "Push/s", num: true },
      { key: "ackPerSecond", label: "Ack/s", num: true },
      { key: "oldestPendingAt", label: "Oldest pending", render: (r) => age(r.oldestPendingAt) },
    ], shown, { state: tableState.queues, key: (r) => r.queue, class: "queues", empty: "no queues" }),
  ];
};

const OPTIONS = ["leaseTime", "retryLimit", "maxSize", "ttl", "retentionSeconds", "completedRetentionSeconds", "delayedProcessing",
  "windowBuffer", "dedupWindowSeconds", "maxWaitTimeSeconds", "dlqAfterMaxRetries", "encryptionEnabled", "priority"];

pages.queue = async (name) => {
  const [q, recent] = await Promise.all([get(`/api/v1/status/queues/${enc(name)}`), get(`/api/v1/status/queues/${enc(name)}/messages?limit=20`)]);
  const opts = q.queue.options || {};
  const inputs = {};
  const form = el("form", { class: "options", onsubmit: (e) => {
    e.preventDefault();
    const options = {};
    for (const [k, i] of Object.entries(inputs)) {
      if (i.value === "" || String(opts[k]) === i.value) continue;
      options[k] = i.value === "true" ? true : i.value === "false" ? false : isNaN(Number(i.value)) ? i.value : Number(i.value);
    }
    act("configure", () => api("POST", "/api/v1/configure", { queue: name, options }));
  } }, OPTIONS.filter((k) => k in opts).map((k) => [el("label", {}, k), (inputs[k] = el("input", { name: k, value: String(opts[k]) }))]),
  el("span", {}), el("button", { class: "primary write", type: "submit" }, "Save"));
  tableState["p:" + name] = tableState["p:" + name] || { sort: null, dir: 1, page: 0 };
  return [
    el("h1", {}, "Queue ", el("span", { id: "queue-name" }, name)),
    el("div", { class: "cards" },
      el("div", { class: "card" }, el("div", { class: "k" }, "messages"), el("div", { class: "v" }, fmt(q.messages.total))),
      el("div", { class: "card" }, el("div", { class: "k" }, "pending"), el("div", { class: "v", id: "queue-pending" }, fmt(q.messages.pending))),
      el("div", { class: "card" }, el("div", { class: "k" }, "partitions"), el("div", { class: "v" }, fmt(q.partitions.length))),
      el("div", { class: "card" }, el("div", { class: "k" }, "dead letters"), el("div", { class: "v" }, fmt(q.deadLetters)))),
    el("h2", {}, "Consumer groups"),
    table([
      { key: "name", label: "Group", render: (g) => link(`#/group/${enc(g.name)}`, g.name || "(queue mode)") },
      { key: "pending", label: "Lag (messages)", num: true },
      { key: "lagSeconds", label: "Lag (s)", num: true },
      { key: "activeLeases", label: "Leases", num: true },
    ], q.groups || [], { empty: "no consumer group has read it" }),
    el("h2", {}, "Configuration"), form,
    el("h2", {}, "Partitions"),
    table([
      { key: "name", label: "Partition" }, { key: "messages", label: "Messages", num: true },
      { key: "pending", label: "Pending", num: true }, { key: "lastWriteAt", label: "Last write", render: (p) => age(p.lastWriteAt) + " ago" },
    ], q.partitions, { state: tableState["p:" + name], class: "partitions" }),
    el("h2", {}, "Recent messages"),
    table([
      { key: "transactionId", label: "Transaction", render: (m) => link(`#/message/${enc(m.partitionId)}/${enc(m.transactionId)}`, m.transactionId) },
      { key: "partition", label: "Partition" }, { key: "status", label: "Status" }, { key: "createdAt", label: "Created" },
      { key: "data", label: "Payload", nosort: true, render: (m) => el("pre", {}, JSON.stringify(m.data ?? m.payload)) },
    ], recent.messages || []),
  ];
};

pages.groups = async () => {
  const gs = await get("/api/v1/consumer-groups");
  return [el("h1", {}, "Consumer groups"), table([
    { key: "name", label: "Group", render: (g) => link(`#/group/${enc(g.name)}`, g.name) },
    { key: "queues", label: "Queues", render: (g) => g.queues.join(", ") },
    { key: "totalLag", label: "Lag (messages)", num: true }, { key: "maxTimeLag", label: "Lag (s)", num: true },
    { key: "members", label: "Leases", num: true }, { key: "state", label: "State" }, { key: "subscriptionMode", label: "Subscription" },
  ], gs, { class: "groups", empty: "no consumer groups" })];
};

pages.group = async (name) => {
  const g = await get(`/api/v1/consumer-groups/${enc(name)}`);
  const out = [el("h1", {}, "Consumer group ", el("span", { id: "group-name" }, name))];
  for (const [queue, q] of Object.entries(g)) {
    const ts = el("input", { type: "datetime-local", class: "write" });
    out.push(el("h2", {}, "on ", link(`#/queue/${enc(queue)}`, queue)),
      el("div", { class: "toolbar" },
        el("button", { class: "write seek-end", onclick: () => confirmAct(`Move ${name} on ${queue} past every message?`, "seek", () => api("POST", `/api/v1/consumer-groups/${enc(name)}/queues/${enc(queue)}/seek`, { toEnd: true })) }, "Seek to end"),
        ts, el("button", { class: "write", onclick: () => ts.value && confirmAct(`Move ${name} on ${queue} to ${ts.value}?`, "seek", () => api("POST", `/api/v1/consumer-groups/${enc(name)}/queues/${enc(queue)}/seek`, { timestamp: new Date(ts.value).toISOString() })) }, "Seek to time"),
        el("button", { class: "danger admin", onclick: () => confirmAct(`Delete ${name}'s cursors on ${queue}?`, "delete", () => api("DELETE", `/api/v1/consumer-groups/${enc(name)}/queues/${enc(queue)}`)) }, "Delete")),
      table([
        { key: "partition", label: "Partition" }, { key: "committedOffset", label: "Committed", num: true },
        { key: "offsetLag", label: "Lag (messages)", num: true }, { key: "timeLagSeconds", label: "Lag (s)", num: true },
        { key: "leaseActive", label: "Leased" }, { key: "lastConsumedAt", label: "Last consumed", render: (p) => age(p.lastConsumedAt) },
      ], q.partitions, { class: "cursors" }));
  }
  if (out.length === 1) out.push(el("p", { class: "muted" }, "This group has no cursors."));
  return out;
};

pages.dlq = async () => {
  const queues = (await get("/api/v1/resources/queues?limit=1000")).queues.map((q) => q.name);
  const queue = sessionStorage.getItem("queen-dlq-queue") || queues[0];
  const group = sessionStorage.getItem("queen-dlq-group") || "";
  const head = [el("h1", {}, "Dead letters"), el("div", { class: "toolbar" }, "Queue",
    el("select", { id: "dlq-queue", onchange: (e) => { sessionStorage.setItem("queen-dlq-queue", e.target.value); route(); } },
      queues.map((q) => el("option", { value: q, selected: q === queue }, q))),
    "Group", el("input", { id: "dlq-group", value: group, placeholder: "any", onchange: (e) => { sessionStorage.setItem("queen-dlq-group", e.target.value); route(); } }))];
  if (!queue) return head.concat(el("p", { class: "muted" }, "No queues."));
  const d = await get(`/api/v1/dlq?queue=${enc(queue)}&limit=200${group ? "&consumerGroup=" + enc(group) : ""}`);
  const picked = new Set();
  const retry = (m) => api("POST", `/api/v1/dlq/${enc(m.id)}/replay`, {});
  const drop = (m) => api("DELETE", `/api/v1/messages/${enc(m.partitionId)}/${enc(m.transactionId)}`);
  const selected = () => d.messages.filter((m) => picked.has(m.id));
  return head.concat(
    el("div", { class: "toolbar" }, el("span", { id: "dlq-total" }, `${d.total} dead letters`),
      el("button", { class: "write", onclick: () => selected().length && confirmAct(`Retry ${selected().length} dead letters?`, "retry", () => Promise.all(selected().map(retry))) }, "Retry selected"),
      el("button", { class: "danger write", onclick: () => selected().length && confirmAct(`Delete ${selected().length} dead letters?`, "delete", () => Promise.all(selected().map(drop))) }, "Delete selected")),
    table([
      { key: "pick", label: "", nosort: true, render: (m) => el("input", { type: "checkbox", class: "write", onchange: (e) => (e.target.checked ? picked.add(m.id) : picked.delete(m.id)) }) },
      { key: "id", label: "Id" }, { key: "partition", label: "Partition" }, { key: "consumerGroup", label: "Group" },
      { key: "errorMessage", label: "Error" }, { key: "retryCount", label: "Retries", num: true },
      { key: "data", label: "Payload", nosort: true, render: (m) => el("pre", {}, JSON.stringify(m.data)) },
      { key: "act", label: "", nosort: true, render: (m) => el("span", {},
        el("button", { class: "write retry", onclick: () => confirmAct(`Retry dead letter ${m.id}?`, "retry", () => retry(m)) }, "Retry"), " ",
        el("button", { class: "danger write", onclick: () => confirmAct(`Delete dead letter ${m.id}?`, "delete", () => drop(m)) }, "Delete")) },
    ], d.messages, { class: "dlq", key: (m) => m.id, empty: "no dead letters" }));
};

pages.messages = async () => {
  const pid = el("input", { id: "msg-partition", placeholder: "partitionId" });
  const txn = el("input", { id: "msg-txn", placeholder: "transactionId" });
  return [el("h1", {}, "Find a message"), el("div", { class: "toolbar" }, pid, txn,
    el("button", { class: "primary", onclick: () => { location.hash = `#/message/${enc(pid.value)}/${enc(txn.value)}`; } }, "Show")),
    el("p", { class: "muted" }, "The partitionId and transactionId are on every message a pop answers, and in the queue page's recent messages.")];
};

pages.message = async (pid, txn) => {
  const [m, traces] = await Promise.all([get(`/api/v1/messages/${enc(pid)}/${enc(txn)}`), get(`/api/v1/traces/${enc(pid)}/${enc(txn)}`).catch(() => ({ traces: [] }))]);
  const rows = Object.entries(m).filter(([k]) => !["data", "payload", "consumerGroups"].includes(k)).map(([k, v]) => ({ k, v: typeof v === "object" ? JSON.stringify(v) : v }));
  return [el("h1", {}, "Message ", txn),
    table([{ key: "k", label: "Field" }, { key: "v", label: "Value" }], rows),
    el("h2", {}, "Payload"), el("pre", { id: "msg-payload" }, JSON.stringify(m.data ?? m.payload, null, 2)),
    el("h2", {}, "Status per group"), el("pre", {}, JSON.stringify(m.consumerGroups ?? m.groups ?? [], null, 2)),
    el("h2", {}, "Traces"), table([{ key: "createdAt", label: "At" }, { key: "eventType", label: "Event" }, { key: "consumerGroup", label: "Group" },
      { key: "data", label: "Data", nosort: true, render: (t) => el("pre", {}, JSON.stringify(t.data)) }], traces.traces || [], { empty: "no traces" })];
};

pages.system = async () => {
  const [b, push, pop, kv, eph] = await Promise.all([get("/status"), get("/api/v1/system/maintenance"), get("/api/v1/system/maintenance/pop"),
    get("/api/v1/system/kv-timers"), get("/api/v1/system/ephemeral")]);
  const sw = (label, on, path, body) => el("tr", {}, el("td", {}, label), el("td", { class: on ? "bad" : "ok" }, on ? "on" : "off"),
    el("td", {}, el("button", { class: "admin", onclick: () => confirmAct(`Turn ${label} ${on ? "off" : "on"}?`, label, () => api("POST", path, body(!on))) }, on ? "Turn off" : "Turn on")));
  const en = (label, enabled, path) => el("tr", {}, el("td", {}, label), el("td", { class: enabled ? "ok" : "bad" }, enabled ? "serving" : "switched off"),
    el("td", {}, el("button", { class: "admin", onclick: () => confirmAct(`${enabled ? "Switch off" : "Switch on"} ${label}?`, label, () => api("POST", path, { enabled: !enabled })) }, enabled ? "Switch off" : "Switch on")));
  return [el("h1", {}, "System"),
    el("table", {}, el("tbody", {},
      sw("push maintenance (pushes go to the spool)", push.enabled, "/api/v1/system/maintenance", (v) => ({ enabled: v })),
      sw("pop maintenance (every pop answers 204)", pop.enabled, "/api/v1/system/maintenance/pop", (v) => ({ enabled: v })),
      en("KV and timers", kv.enabled, "/api/v1/system/kv-timers"),
      en("ephemeral queues", eph.enabled, "/api/v1/system/ephemeral"))),
    el("h2", {}, "This broker"),
    table([{ key: "k", label: "" }, { key: "v", label: "" }], [
      { k: "version", v: b.version }, { k: "server", v: b.serverId }, { k: "uptime", v: `${fmt(b.uptimeSeconds)} s` },
      { k: "database", v: JSON.stringify(b.database) }, { k: "spool", v: JSON.stringify(b.spool) },
      { k: "encryption", v: JSON.stringify(b.encryption) }, { k: "ephemeral memory", v: `${fmt(eph.usedBytes)} of ${fmt(eph.maxBytes)} bytes` },
    ])];
};

// ---------------------------------------------------------------- routing

// The header's "live" mark: while refreshes fail (the broker restarting, or
// answering 503 while PostgreSQL fails over) the page keeps the last numbers
// it had, and says since when they are stale and why.
let staleSince = null;
function showLive(err) {
  const live = document.getElementById("live");
  if (!err) {
    staleSince = null;
    live.textContent = "live";
    live.classList.remove("stale");
    return;
  }
  staleSince = staleSince || new Date();
  live.textContent = `stale since ${staleSince.toLocaleTimeString()}: ${err.message}`;
  live.classList.add("stale");
}

async function route(quiet) {
  const parts = (location.hash.replace(/^#\/?/, "") || "overview").split("/").map(decodeURIComponent);
  const [name, ...args] = parts;
  const page = pages[name] ? name : "overview";
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page || (a.dataset.page + "s") === page || a.dataset.page === page + "s"));
  const view = document.getElementById("view");
  const focused = document.activeElement && document.activeElement.id;
  try {
    const nodes = await pages[page](...args);
    charts.forEach((c) => c.destroy());
    charts = [];
    view.replaceChildren(...[].concat(nodes).flat(Infinity));
    view.dataset.page = page;
    view.dataset.loaded = String(Date.now());
    showLive(null);
    if (focused && document.getElementById(focused)) {
      const f = document.getElementById(focused);
      f.focus();
      if (f.setSelectionRange && f.value) f.setSelectionRange(f.value.length, f.value.length);
    }
  } catch (e) {
    if (!quiet) view.replaceChildren(el("h1", {}, "Cannot show this page"), el("p", { class: "bad", id: "error" }, e.message));
    showLive(e);
  }
  clearTimeout(timer);
  timer = setTimeout(() => {
    // No refresh while someone is typing in a form of the page.
    const a = document.activeElement;
    if (a && a.tagName === "INPUT" && a.form) timer = setTimeout(route, REFRESH_MS);
    else route(true);
  }, REFRESH_MS);
}

document.getElementById("signin").addEventListener("click", () => {
  const t = window.prompt("Bearer token (JWT) for this broker:");
  if (t) {
    sessionStorage.setItem("queen-token", t.trim());
    document.getElementById("signin").classList.add("hidden");
    applyRole().then(() => route());
  }
});
document.getElementById("tenant").addEventListener("change", (e) => {
  sessionStorage.setItem("queen-tenant", e.target.value);
  applyRole().then(() => route());
});
window.addEventListener("hashchange", () => route());
applyRole().then(() => route());
