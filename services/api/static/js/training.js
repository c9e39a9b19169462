// Training: start a job, watch its progress (and loss, where the api reports it), see what is served;
// the versions list with promote/rollback where the api offers it.

import { formatDetail, get, metrics, post, taskPath } from "./api.js";
import { $, el, formatTime, percent, say, table } from "./util.js";

const POLL_MS = 1000;
const FINAL = new Set(["succeeded", "failed", "cancelled"]);

let state;
const jobs = new Map(); // id -> {record, losses}
let timer = null;

const storageKey = (task) => `openbook.jobs.${task}`;

function remember(task, id) {
  const ids = JSON.parse(sessionStorage.getItem(storageKey(task)) ?? "[]");
  sessionStorage.setItem(storageKey(task), JSON.stringify([id, ...ids.filter((i) => i !== id)].slice(0, 20)));
}

// The loss curve as an inline SVG polyline (numbers only, so building it from a string is safe).
function sparkline(losses) {
  if (losses.length < 2) return null;
  const [w, h] = [160, 32];
  const lo = Math.min(...losses);
  const span = Math.max(...losses) - lo || 1;
  const points = losses.map((v, i) => `${((i / (losses.length - 1)) * w).toFixed(1)},${(h - ((v - lo) / span) * h).toFixed(1)}`);
  const holder = el("span", { class: "spark", role: "img", "aria-label": `loss from ${losses[0].toFixed(3)} to ${losses.at(-1).toFixed(3)}` });
  holder.innerHTML = `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}"><polyline fill="none" stroke="currentColor" stroke-width="1.5" points="${points.join(" ")}"/></svg>`;
  return holder;
}

const score = (value) => (typeof value === "number" ? value.toFixed(3) : "—");

function result(record) {
  if (record.state === "succeeded") {
    const dev = Object.entries(record.metrics ?? {})
      .filter(([, v]) => typeof v === "number")
      .map(([k, v]) => `${k} ${Number.isInteger(v) ? v : v.toFixed(3)}`)
      .join(", ");
    const gate = record.gate;
    if (gate?.verdict === "rejected") {
      // kept as a version, never served: the promotion gate found it worse on the same dev examples than
      // the serving version, or, for a first version, than the untrained task
      const rival = gate.serving_version ? "serving" : "untrained";
      return el("span", { class: "job-rejected" }, `rejected by the gate: dev ${score(gate.candidate)} vs ${score(gate.serving)} ${rival}`);
    }
    const verdict = gate?.verdict && gate.verdict !== "first" ? ` · gate: ${gate.verdict}` : "";
    return el("span", {}, "version ", el("code", { class: "job-version" }, record.published?.version ?? "?"), dev ? ` · dev: ${dev}` : "", verdict);
  }
  if (record.state === "failed") return el("span", { class: "error-text" }, record.error ?? "failed");
  return record.error ? el("span", { class: "muted" }, record.error) : "";
}

// A job trains for a number of steps, or of epochs (passes over the task's training examples).
const budget = (config) => (config?.epochs != null ? `${config.epochs} epochs` : `${config?.steps ?? "?"} steps`);

const queuedAt = (record) => record.created ?? Number.MAX_VALUE; // not read yet: just started here

function render() {
  const task = state.task?.name;
  const rows = [...jobs.values()]
    .filter(({ record }) => record.task === task)
    .sort((a, b) => queuedAt(b.record) - queuedAt(a.record)) // newest first
    .map(({ record, losses }) =>
      el(
        "tr",
        { dataset: { job: record.id, state: record.state } },
        el("td", {}, el("code", { title: record.id }, record.id.slice(0, 8)), " ", record.method, ` · ${budget(record.train_config)}`, record.trigger === "auto" ? " · automatic" : ""),
        el("td", { class: "job-state" }, record.state === "running" && record.stage ? `running · ${record.stage}` : record.state),
        el("td", {}, el("progress", { max: 1, value: record.progress, "aria-label": `progress ${percent(record.progress)}` }), ` ${percent(record.progress)}`),
        el("td", {}, losses.length ? [`${losses.at(-1).toFixed(4)} `, sparkline(losses)] : "—"),
        el("td", { class: "job-result" }, result(record)),
      ),
    );
  $("jobs").replaceChildren(
    rows.length ? table(["job", "state", "progress", "loss", "result"], rows, "Training jobs") : el("p", { class: "muted" }, "No training job yet."),
  );
}

async function poll() {
  timer = null;
  const open = [...jobs.values()].filter(({ record }) => !FINAL.has(record.state));
  for (const entry of open) {
    try {
      const record = await get(`/v1/jobs/${encodeURIComponent(entry.record.id)}`);
      // The api may report the latest loss; keep one point per progress step to draw the curve.
      if (typeof record.loss === "number" || typeof record.loss === "string") {
        const loss = Number(record.loss);
        if (record.progress !== entry.record.progress || !entry.losses.length) entry.losses.push(loss);
      }
      const finished = !FINAL.has(entry.record.state) && FINAL.has(record.state);
      entry.record = record;
      if (finished && record.state === "succeeded") watchServing(record);
    } catch (error) {
      if (error.status === 404) entry.record = { ...entry.record, state: "failed", error: "the api no longer knows this job" };
    }
  }
  render();
  if ([...jobs.values()].some(({ record }) => !FINAL.has(record.state))) timer = setTimeout(poll, POLL_MS);
}

function startPolling() {
  if (timer === null) timer = setTimeout(poll, 0);
}

async function servedVersion(task) {
  const info = (await metrics()).find((s) => s.name === "openbook_task_version_info" && s.labels.task === task);
  return info?.labels.model ?? null;
}

async function showServing() {
  const task = state.task?.name;
  if (!task) return;
  try {
    const model = await servedVersion(task);
    if (task === state.task?.name) {
      $("serving").replaceChildren("Serving model ", el("code", { id: "serving-version" }, model ?? "—"));
    }
  } catch {
    $("serving").textContent = "";
  }
}

// A published version is loaded by the api in the background; show it once it is the one served.
async function watchServing(record) {
  const version = record.published?.version;
  for (let tries = 0; version && tries < 120; tries++) {
    try {
      if ((await servedVersion(record.task)) === version) break;
    } catch {
      // metrics unreadable for a moment: try again
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
  showServing();
  loadVersions();
}

async function start(event) {
  event.preventDefault();
  const status = $("train-status");
  if (!state.task) return;
  const body = { steps: Number($("train-steps").value) || 32 };
  if ($("train-method").value.trim()) body.method = $("train-method").value.trim();
  try {
    const record = await post(taskPath(state.task.name, "/train"), body);
    jobs.set(record.id, { record, losses: [] });
    remember(record.task, record.id);
    say(status, `Queued job ${record.id.slice(0, 8)}.`, "ok");
    render();
    startPolling();
  } catch (error) {
    say(status, `Not started: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

async function loadVersions() {
  if (!state.caps.has("GET", "/v1/tasks/{}/versions") || !state.task) return;
  const task = state.task.name;
  const status = $("versions-status");
  try {
    const answer = await get(taskPath(task, "/versions"));
    const versions = Array.isArray(answer) ? answer : answer.versions ?? [];
    const canPromote = state.caps.has("POST", "/v1/tasks/{}/versions/{}/promote");
    const rows = versions.map((v) => {
      const name = v.version ?? v.id;
      const scores = v.dev ?? v.metrics ?? v.dev_metrics ?? {};
      return el(
        "tr",
        { dataset: { version: name, state: v.state ?? "" } },
        el("td", {}, el("code", {}, name)),
        el("td", {}, v.method ?? "—"),
        el("td", {}, v.state ?? "—"),
        el("td", {}, Object.entries(scores).filter(([, s]) => typeof s === "number").map(([k, s]) => `${k} ${s.toFixed(3)}`).join(", ") || "—"),
        el("td", {}, formatTime(v.created)),
        el("td", {}, canPromote && v.state !== "serving"
          ? el("button", { type: "button", class: "secondary small", onclick: () => promote(task, name) }, v.state === "retired" ? "Roll back to it" : "Promote")
          : ""),
      );
    });
    $("versions").replaceChildren(
      rows.length ? table(["version", "method", "state", "dev scores", "created", ""], rows, "Versions") : el("p", { class: "muted" }, "No trained version yet."),
    );
  } catch (error) {
    say(status, `Versions not read: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

async function promote(task, version) {
  if (!window.confirm(`Serve version ${version} for ${task}?`)) return;
  try {
    await post(taskPath(task, `/versions/${encodeURIComponent(version)}/promote`));
    say($("versions-status"), `Promoted ${version}.`, "ok");
  } catch (error) {
    say($("versions-status"), `Not promoted: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
  loadVersions();
  watchServing({ task, published: { version } });
}

export function init(shared) {
  state = shared;
  $("train-form").addEventListener("submit", start);
  $("versions-card").hidden = !state.caps.has("GET", "/v1/tasks/{}/versions");
}

// The task's recent jobs, automatic ones included, where the api lists them; else the ones this tab started.
async function loadJobs(task) {
  if (state.caps.has("GET", "/v1/tasks/{}/jobs")) {
    try {
      for (const record of await get(taskPath(task, "/jobs?limit=10"))) {
        const known = jobs.get(record.id);
        if (known) known.record = record;
        else jobs.set(record.id, { record, losses: [] });
      }
    } catch {
      // unreadable for now: the next change of task or tab asks again
    }
  }
  for (const id of JSON.parse(sessionStorage.getItem(storageKey(task)) ?? "[]")) {
    if (!jobs.has(id)) jobs.set(id, { record: { id, task, method: "?", state: "queued", progress: 0 }, losses: [] });
  }
  render();
  startPolling();
}

export function taskChanged() {
  const task = state.task?.name;
  say($("train-status"), "");
  $("train-method").placeholder = state.task ? `the task's method: ${state.task.method}` : "";
  if (task) loadJobs(task);
  else render();
}

export function shown(tab) {
  if (tab !== "training") return;
  if (state.task) loadJobs(state.task.name);
  showServing();
  loadVersions();
}
