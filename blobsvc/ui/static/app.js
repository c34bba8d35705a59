// The operator's page: reads /ui/api/* every few seconds and draws it. Plain DOM, no library;
// every text from the server goes in through textContent, never as markup.
"use strict";

const REFRESH_MS = 5000;
const PAGE = 50;
const CHART_POINTS = 50;
const view = { hosts: 0, jobs: 0, pipelines: 0, pipeline: null, openJob: null };
let previous = null; // the last overview reading, to turn counters into rates

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "text") node.textContent = value;
    else if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  return node;
}

async function get(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${(await response.text()).trim()}`);
  return response.json();
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function when(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  return new Date(seconds * 1000).toISOString().replace(/\.\d+Z$/, "Z");
}

function span(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
}

function count(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en"); }

function table(node, heads, rows) {
  const head = el("tr", {}, ...heads.map(([text, cls]) => el("th", { text, class: cls || "" })));
  node.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
}

function cell(text, cls) { return el("td", { text: String(text), class: cls || "" }); }

function pager(node, answer, key, draw) {
  const from = answer.total ? answer.offset + 1 : 0;
  const to = answer.offset + answer[key].length;
  node.replaceChildren(
    el("button", { text: "‹", onclick: () => { view[key] = Math.max(0, answer.offset - answer.limit); draw(); } }),
    el("span", { text: `${from}–${to} of ${count(answer.total)}` }),
    el("button", { text: "›", onclick: () => { view[key] = answer.offset + answer.limit; draw(); } }),
  );
  node.firstChild.disabled = answer.offset === 0;
  node.lastChild.disabled = to >= answer.total;
  node.hidden = answer.total <= answer.limit && answer.offset === 0;
}

function card(label, value, opts) {
  const options = opts || {};
  return el("div", { class: `card${options.bad ? " bad" : ""}` },
    el("div", { class: "label", text: label }),
    el("div", { class: `value${options.small ? " small" : ""}`, text: value }));
}

function drawOverview(o) {
  const now = performance.now();
  const rates = {};
  if (previous) {
    const seconds = (now - previous.at) / 1000;
    for (const [kind, total] of Object.entries(o.requests || {})) {
      rates[kind] = Math.max(0, (total - (previous.requests[kind] || 0)) / seconds);
    }
  }
  const rateText = previous
    ? Object.entries(rates).filter(([, r]) => r > 0).sort((a, b) => b[1] - a[1]).slice(0, 4)
        .map(([kind, r]) => `${kind} ${r.toFixed(1)}/s`).join(", ") || "idle"
    : "measuring…";
  previous = { at: now, requests: o.requests || {} };
  const role = document.getElementById("role");
  role.textContent = o.role;
  role.className = `badge ${o.role}`;
  const standby = document.getElementById("standby");
  standby.hidden = o.role !== "standby";
  if (o.role === "standby") {
    const text = o.leader ? `This server is a standby. The leader is ${o.leader}. ` : "This server is a standby; no leader is elected now.";
    standby.replaceChildren(text);
    if (o.leader_http) standby.append(el("a", { href: `${location.protocol}//${o.leader_http}/ui/`, text: "Open the leader's page" }));
  }
  const disk = o.disk_total_bytes ? o.disk_free_bytes / o.disk_total_bytes : 1;
  const store = o.mode === "zookeeper" ? (o.ha_store_error ? `error: ${o.ha_store_error}` : "healthy") : "none (standalone)";
  document.getElementById("overview").replaceChildren(
    card("version", o.version),
    card("role", o.mode === "zookeeper" ? `${o.role} (zookeeper)` : o.role),
    card("leader", o.mode === "zookeeper" ? (o.leader || "none elected") : "–", { small: true, bad: o.mode === "zookeeper" && !o.leader }),
    card("HA store", o.ha_store || "–", { small: true }),
    card("HA store health", store, { small: true, bad: Boolean(o.ha_store_error) }),
    card("uptime", span(o.uptime_seconds)),
    card("blobs", count(o.blobs)),
    card("stored", bytes(o.bytes)),
    card("disk free", `${bytes(o.disk_free_bytes)} (${Math.round(disk * 100)}%)`, { bad: disk < 0.1 }),
    card("connections", `${count(o.connections)} / ${count(o.max_connections)}`),
    card("requests", rateText, { small: true }),
    card("refusals (busy)", count(o.busy_refusals), { bad: o.busy_refusals > 0 }),
    card("hosts lost", count(o.hosts_lost), { bad: o.hosts_lost > 0 }),
    card("checkpoints", `${count(o.checkpoints_completed)} done, ${count(o.checkpoints_aborted)} aborted`, { small: true, bad: o.checkpoints_damaged > 0 }),
  );
}

async function drawHosts() {
  const answer = await get(`/ui/api/hosts?offset=${view.hosts}&limit=${PAGE}`);
  const rows = answer.hosts.map((h) => {
    const used = h.cache_max_bytes ? h.cache_bytes / h.cache_max_bytes : 0;
    const bar = el("span", { class: `bar${used > 0.95 ? " full" : ""}` }, el("span"));
    bar.firstChild.style.width = `${Math.min(100, Math.round(used * 100))}%`;
    const cache = el("td", {}, ...(h.cache_max_bytes ? [bar] : []), `${bytes(h.cache_bytes)} / ${h.cache_max_bytes ? bytes(h.cache_max_bytes) : "no limit"}`);
    return el("tr", { class: h.state },
      cell(h.agent), cell(h.host || "–"), el("td", {}, el("span", { class: `state ${h.state}`, text: h.state })),
      cache, cell(count(h.jobs), "num"), cell(when(h.last_seen)), cell(h.version || "–"));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "7", class: "muted", text: "No agent has reported to this server." })));
  table(document.getElementById("hosts"), [["agent"], ["host"], ["state"], ["cache used / limit"], ["jobs", "num"], ["last heartbeat (UTC)"], ["version"]], rows);
  pager(document.getElementById("hosts-pager"), answer, "hosts", drawHosts);
}

async function drawJobs() {
  const answer = await get(`/ui/api/jobs?offset=${view.jobs}&limit=${PAGE}`);
  const rows = [];
  for (const job of answer.jobs) {
    rows.push(el("tr", {}, cell(job.job), cell(count(job.blobs), "num"), cell(bytes(job.bytes), "num"),
      el("td", {}, el("button", { text: view.openJob === job.job ? "hide names" : "names", onclick: () => toggleJob(job.job) }))));
    if (view.openJob === job.job) rows.push(await jobNames(job.job));
  }
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "4", class: "muted", text: "No job-scoped blob is stored." })));
  table(document.getElementById("jobs"), [["job"], ["blobs", "num"], ["bytes", "num"], [""]], rows);
  pager(document.getElementById("jobs-pager"), answer, "jobs", drawJobs);
}

async function jobNames(job) {
  const answer = await get(`/ui/api/jobs/${job}?limit=100`);
  const items = answer.names.map((n) => el("li", { text: `${n.name} (${bytes(n.size)})` }));
  const more = answer.total > answer.names.length ? [el("li", { class: "muted", text: `… ${count(answer.total - answer.names.length)} more` })] : [];
  return el("tr", { class: "names" }, el("td", { colspan: "4" }, el("ul", {}, ...items, ...more)));
}

function toggleJob(job) {
  view.openJob = view.openJob === job ? null : job;
  drawJobs().catch(report);
}

async function drawPipelines() {
  const answer = await get(`/ui/api/pipelines?offset=${view.pipelines}&limit=${PAGE}`);
  if (!answer.pipelines.includes(view.pipeline)) view.pipeline = answer.pipelines[0] || null;
  document.getElementById("pipelines").replaceChildren(...answer.pipelines.map((name) =>
    el("button", { text: name, class: name === view.pipeline ? "selected" : "", onclick: () => { view.pipeline = name; drawPipelines().catch(report); } })));
  pager(document.getElementById("pipelines-pager"), answer, "pipelines", drawPipelines);
  const history = document.getElementById("history");
  const charts = document.getElementById("charts");
  if (!view.pipeline) {
    table(history, [["checkpoints"]], [el("tr", {}, el("td", { class: "muted", text: "No pipeline has checkpoints on this server." }))]);
    charts.replaceChildren();
    return;
  }
  const { history: checkpoints } = await get(`/ui/api/pipelines/${encodeURIComponent(view.pipeline)}`);
  const rows = checkpoints.map((c) => el("tr", {},
    cell(c.id, "num"), cell(c.kind), el("td", {}, el("span", { class: `state ${c.status}`, text: c.status.replace("_", " ") })),
    el("td", { class: "reason", text: c.reason || "" }), cell(when(c.trigger_time)), cell(span(c.duration), "num"),
    cell(c.expected === null ? count(c.acknowledged) : `${count(c.acknowledged)} / ${count(c.expected)}`, "num"),
    cell(bytes(c.state_bytes), "num"), cell(bytes(c.bytes_sent), "num"), cell(bytes(c.bytes_reused), "num")));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "10", class: "muted", text: "No checkpoint yet." })));
  table(history, [["id", "num"], ["kind"], ["status"], ["reason"], ["triggered (UTC)"], ["duration", "num"],
    ["acknowledged", "num"], ["state size", "num"], ["sent", "num"], ["reused", "num"]], rows);
  const done = checkpoints.filter((c) => c.status === "completed" || c.status === "subsumed").slice(0, CHART_POINTS).reverse();
  charts.replaceChildren(
    chart(`${view.pipeline}: duration of the last ${done.length} checkpoints`, done, (c) => c.duration || 0, span),
    chart(`${view.pipeline}: state size`, done, (c) => c.state_bytes || 0, bytes),
  );
}

function chart(title, points, value, label) {
  const width = 600, height = 180, left = 8, top = 24, bottom = 24;
  const plot = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  const max = Math.max(...points.map(value), 0);
  const step = (width - 2 * left) / Math.max(points.length, 1);
  plot.append(svg("line", { x1: left, x2: width - left, y1: height - bottom, y2: height - bottom, stroke: "#cbd5e0" }));
  points.forEach((c, i) => {
    const h = max ? ((height - top - bottom) * value(c)) / max : 0;
    const wide = Math.min(Math.max(step - 2, 1), 28);
    const bar = svg("rect", { x: left + i * step + (step - wide) / 2, y: height - bottom - h, width: wide, height: h, fill: "#2b6cb0" });
    bar.append(svg("title"));
    bar.firstChild.textContent = `#${c.id}: ${label(value(c))}`;
    plot.append(bar);
  });
  const caption = svg("text", { x: left, y: 16 });
  caption.textContent = `${title} (max ${label(max)})`;
  const axis = svg("text", { x: left, y: height - 6 });
  axis.textContent = points.length ? `#${points[0].id} … #${points[points.length - 1].id}` : "no completed checkpoint yet";
  plot.append(caption, axis);
  return el("div", { class: "chart" }, plot);
}

function report(error) {
  const problem = document.getElementById("problem");
  problem.textContent = `Cannot read the server: ${error.message}`;
  problem.hidden = false;
}

async function refresh() {
  try {
    drawOverview(await get("/ui/api/overview"));
    await Promise.all([drawHosts(), drawJobs(), drawPipelines()]);
    document.getElementById("problem").hidden = true;
    document.getElementById("refreshed").textContent = `updated ${when(Date.now() / 1000)}`;
  } catch (error) {
    report(error);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
