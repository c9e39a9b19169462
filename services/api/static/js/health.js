// Health: readiness (also the header badge), what each task serves, and request latency from /metrics.

import { metrics } from "./api.js";
import { $, el, say, table } from "./util.js";

const READY_EVERY_MS = 5000;
const METRICS_EVERY_MS = 5000;
const LATENCY = "openbook_request_seconds";

let state;
let previous = null; // the last scrape's latency histograms, to show the latest window
let polling = false; // a metrics loop is running (it stops itself once the panel is hidden)

async function checkReady() {
  const badge = $("ready");
  let text;
  let ready = false;
  try {
    const response = await fetch("/readyz", { headers: { Accept: "application/json" } });
    const body = await response.json().catch(() => ({}));
    ready = response.ok;
    text = ready ? `ready · ${body.tasks ?? "?"} task${body.tasks === 1 ? "" : "s"}` : `not ready: ${body.reason ?? response.status}`;
    if (body.workers?.length) text += ` · trainer${body.workers.length > 1 ? "s" : ""}: ${body.workers.join(", ")}`;
    if (body.warning) text += ` · ${body.warning}`;
  } catch {
    text = "the api does not answer";
  }
  badge.textContent = ready ? "ready" : "not ready";
  badge.dataset.kind = ready ? "ok" : "error";
  badge.title = text;
  say($("health-ready"), text, ready ? "ok" : "error");
  setTimeout(checkReady, READY_EVERY_MS);
}

// Per (method, route): {buckets: Map(le -> cumulative count), count, sum}.
function histograms(samples) {
  const routes = new Map();
  const entry = (labels) => {
    const key = `${labels.method} ${labels.route}`;
    if (!routes.has(key)) routes.set(key, { method: labels.method, route: labels.route, buckets: new Map(), count: 0, sum: 0 });
    return routes.get(key);
  };
  for (const { name, labels, value } of samples) {
    if (name === `${LATENCY}_bucket`) {
      const h = entry(labels);
      const le = labels.le === "+Inf" ? Infinity : Number(labels.le);
      h.buckets.set(le, (h.buckets.get(le) ?? 0) + value); // summed over status codes
    } else if (name === `${LATENCY}_count`) entry(labels).count += value;
    else if (name === `${LATENCY}_sum`) entry(labels).sum += value;
  }
  return routes;
}

// Prometheus's histogram_quantile: linear within the bucket that holds the q-th observation.
export function quantile(q, buckets) {
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  const total = buckets.get(Infinity) ?? 0;
  if (!total) return null;
  const rank = q * total;
  let lower = 0;
  let below = 0;
  for (const bound of bounds) {
    const count = buckets.get(bound);
    if (count >= rank) {
      if (bound === Infinity) return lower;
      return lower + ((bound - lower) * (rank - below)) / Math.max(count - below, 1e-12);
    }
    lower = bound;
    below = count;
  }
  return lower;
}

function difference(now, before) {
  const out = new Map();
  for (const [key, h] of now) {
    const old = before.get(key);
    if (!old) {
      out.set(key, h);
      continue;
    }
    const buckets = new Map([...h.buckets].map(([le, c]) => [le, c - (old.buckets.get(le) ?? 0)]));
    out.set(key, { ...h, buckets, count: h.count - old.count, sum: h.sum - old.sum });
  }
  return out;
}

function ms(seconds) {
  if (seconds === null) return "—";
  return seconds >= 1 ? `${seconds.toFixed(1)} s` : `${(seconds * 1000).toFixed(seconds < 0.1 ? 1 : 0)} ms`;
}

function renderLatency(now) {
  const latest = previous ? difference(now, previous) : null;
  const recent = latest !== null && [...latest.values()].some((h) => h.count > 0);
  const measured = recent ? latest : now;
  $("latency-window").textContent = recent
    ? `Requests in the last ${METRICS_EVERY_MS / 1000} s, this console's own included; p50 and p95 are interpolated within the histogram's buckets.`
    : "Requests since the api started; p50 and p95 are interpolated within the histogram's buckets.";
  const rows = [...measured.values()]
    .filter((h) => h.count > 0 && h.route !== "unmatched")
    .sort((a, b) => b.count - a.count)
    .map((h) =>
      el(
        "tr",
        {},
        el("td", {}, el("code", {}, `${h.method} ${h.route}`)),
        el("td", { class: "num" }, String(h.count)),
        el("td", { class: "num" }, ms(h.sum / h.count)),
        el("td", { class: "num" }, ms(quantile(0.5, h.buckets))),
        el("td", { class: "num" }, ms(quantile(0.95, h.buckets))),
      ),
    );
  $("health-latency").replaceChildren(rows.length ? table(["route", "requests", "mean", "p50", "p95"], rows, "Latency per route") : el("p", { class: "muted" }, "No requests measured yet."));
}

function renderTasks(samples) {
  const sizes = new Map(samples.filter((s) => s.name === "openbook_store_examples").map((s) => [s.labels.task, s.value]));
  const versions = new Map(samples.filter((s) => s.name === "openbook_task_version_info").map((s) => [s.labels.task, s.labels]));
  const names = [...new Set([...sizes.keys(), ...versions.keys()])].sort();
  const rows = names.map((name) =>
    el(
      "tr",
      { dataset: { task: name } },
      el("td", {}, name),
      el("td", { class: "num" }, String(sizes.get(name) ?? "—")),
      el("td", {}, el("code", {}, versions.get(name)?.model ?? "—")),
      el("td", {}, el("code", {}, versions.get(name)?.store ?? "—")),
    ),
  );
  $("health-tasks").replaceChildren(rows.length ? table(["task", "examples in the store", "model version", "store version"], rows, "Tasks served") : el("p", { class: "muted" }, "No task loaded yet."));
}

async function refreshMetrics() {
  if ($("panel-health").hidden) {
    polling = false;
    return;
  }
  try {
    const samples = await metrics();
    renderTasks(samples);
    const now = histograms(samples);
    renderLatency(now);
    previous = now;
  } catch (error) {
    $("health-latency").replaceChildren(el("p", { class: "status", dataset: { kind: "error" } }, `Metrics not read: ${error.message}`));
  }
  setTimeout(refreshMetrics, METRICS_EVERY_MS);
}

export function init(shared) {
  state = shared;
  checkReady();
}

export function shown(tab) {
  if (tab === "health" && !polling && state) {
    polling = true;
    previous = null;
    refreshMetrics();
  }
}
