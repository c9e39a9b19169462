// Training: start a job (with the task's own settings unless told otherwise), watch each stage of it, see
// the version it made being loaded and then served; the versions list with promote/rollback where the api
// offers it.

import { formatDetail, get, metrics, post, taskPath } from "./api.js";
import { $, duration, el, formatTime, percent, progressBar, say, servedAccuracy, table } from "./util.js";

const POLL_MS = 1000;
const FINAL = new Set(["succeeded", "failed", "cancelled"]);
const LOAD_TRIES = 300; // a published version is watched this many POLL_MS for the api to serve it

// What a running job's stage does, in words (JobOut.stage): only `training` counts its steps.
const STAGES = {
  preparing: "the backbone loaded, the score to beat taken",
  reader: "the sentence reader's top layers tuned on the training examples",
  "reader-again": "the sentence reader tuned again on every example, dev's too, for the served version",
  finishing: "kNN and calibration chosen on dev, the store embedded anew",
  judging: "the promotion gate, then publishing",
};

let state;
const jobs = new Map(); // id -> {record, losses, stageSince}
const loading = new Map(); // version -> when this page saw it published, while the api loads it
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

const accuracy = (value) => (typeof value === "number" ? percent(value) : "—");

// The gate's verdict in words: what the candidate scored against what it would replace, on the same dev.
function verdict(gate) {
  if (!gate?.verdict) return null;
  const rival = gate.serving_version ? `serving ${gate.serving_version}` : "the untrained task";
  const against = typeof gate.serving === "number" ? ` ${accuracy(gate.candidate)} vs ${accuracy(gate.serving)} for ${rival}` : "";
  return {
    promoted: `promoted:${against}`,
    first: `first version:${against || " nothing to beat"}`,
    rejected: `rejected by the gate:${against}; kept, not served`,
    forced: "served without the gate (forced)",
  }[gate.verdict] ?? gate.verdict;
}

const figure = (value) => (typeof value !== "number" ? String(value) : Number.isInteger(value) ? String(value) : value.toFixed(3));

// Everything the job recorded, for whoever wants it: the metrics as measured, the gate's record.
function details(record) {
  const rows = [];
  for (const [key, value] of Object.entries(record.metrics ?? {})) {
    if (key === "calibration" && value && typeof value === "object") {
      for (const [name, v] of Object.entries(value)) rows.push([`calibration ${name}`, figure(v)]);
    } else if (key === "accuracy" && typeof record.metrics.accuracy_with_knn === "number") {
      rows.push(["accuracy of the LM alone (no store)", figure(value)]);
    } else rows.push([key.replaceAll("_", " "), typeof value === "object" ? JSON.stringify(value) : figure(value)]);
  }
  for (const [key, value] of Object.entries(record.gate ?? {})) rows.push([`gate ${key.replaceAll("_", " ")}`, figure(value ?? "—")]);
  return el(
    "details",
    { class: "job-details" },
    el("summary", {}, "details"),
    el("dl", { class: "spec" }, rows.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)])),
  );
}

// A finished job in a line: its version, dev accuracy as served, steps, and the gate's verdict.
function result(record) {
  if (record.state === "succeeded") {
    const m = record.metrics ?? {};
    const steps = typeof m.steps_run === "number" ? `${m.steps_run} steps` : null;
    const dev = servedAccuracy(record.gate, m);
    const said = verdict(record.gate);
    const version = record.published?.version;
    const scores = [dev === null ? null : `dev accuracy ${percent(dev)}`, steps].filter(Boolean).join(" · ");
    return el(
      "div",
      { class: record.gate?.verdict === "rejected" ? "job-rejected" : "" },
      version ? ["version ", el("code", { class: "job-version" }, version), scores ? ` · ${scores}` : ""] : scores,
      said ? el("div", { class: "job-verdict" }, said) : "",
      details(record),
    );
  }
  if (record.state === "failed") return el("span", { class: "error-text" }, record.error ?? "failed");
  return record.error ? el("span", { class: "muted" }, record.error) : "";
}

// A job trains for a number of steps, or of epochs (passes over the task's training examples).
const budget = (config) => (config?.epochs != null ? `${config.epochs} epochs` : `${config?.steps ?? "?"} steps`);

// Training counts its steps; the other stages take their time with no count: a moving bar and the time so far.
function progress(entry) {
  const { record } = entry;
  if (record.state === "running" && record.stage && record.stage !== "training") {
    // since the stage began, as the worker recorded it (else since this page saw it begin)
    const began = typeof record.stage_since === "number" ? record.stage_since * 1000 : entry.stageSince;
    const since = duration((Date.now() - began) / 1000);
    return [progressBar(null, `${record.stage}, ${since} so far`), ` ${since}`];
  }
  if (record.state === "queued") return [progressBar(null, "waiting for a trainer"), " waiting"];
  return [progressBar(record.progress, `progress ${percent(record.progress)}`), ` ${percent(record.progress)}`];
}

function stateCell(record) {
  if (record.state !== "running" || !record.stage) return [record.state];
  const doing = STAGES[record.stage];
  return [`running · ${record.stage}`, doing ? el("div", { class: "muted stage-note" }, doing) : ""];
}

const queuedAt = (record) => record.created ?? Number.MAX_VALUE; // not read yet: just started here

function render() {
  const task = state.task?.name;
  const rows = [...jobs.values()]
    .filter(({ record }) => record.task === task)
    .sort((a, b) => queuedAt(b.record) - queuedAt(a.record)) // newest first
    .map((entry) => {
      const { record, losses } = entry;
      return el(
        "tr",
        { dataset: { job: record.id, state: record.state } },
        el("td", {}, el("code", { title: record.id }, record.id.slice(0, 8)), " ", record.method, ` · ${budget(record.train_config)}`, record.trigger === "auto" ? " · automatic" : ""),
        el("td", { class: "job-state" }, stateCell(record)),
        el("td", { class: "job-progress" }, progress(entry)),
        el("td", {}, losses.length ? [`${losses.at(-1).toFixed(4)} `, sparkline(losses)] : "—"),
        el("td", { class: "job-result" }, result(record)),
      );
    });
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
      entry.losses = keepLoss(entry.losses, entry.record, record);
      if (record.stage !== entry.record.stage) entry.stageSince = Date.now();
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

// What the api serves, and a version it is loading: "version … loading" with the time so far, then served.
async function showServing() {
  const task = state.task?.name;
  if (!task) return;
  try {
    const model = await servedVersion(task);
    if (task !== state.task?.name) return;
    const served = el("code", { id: "serving-version" }, model ?? "—");
    const pending = [...loading].filter(([version]) => version !== model);
    if (!pending.length) {
      $("serving").replaceChildren("Serving model ", served);
      return;
    }
    const [version, since] = pending.at(-1);
    const waited = duration((Date.now() - since) / 1000);
    $("serving").replaceChildren(
      el("span", { id: "serving-loading" }, "Version ", el("code", {}, version), ` loading into the api (${waited}) `, progressBar(null, `version ${version} loading`)),
      el("br"),
      "Serving model ", served, " until it is ready",
    );
  } catch {
    $("serving").textContent = "";
  }
}

// A published version is loaded by the api in the background: listed at once, shown loading until served.
async function watchServing(record) {
  const version = record.published?.version;
  if (!version || record.gate?.verdict === "rejected") {
    loadVersions();
    return;
  }
  loading.set(version, Date.now());
  loadVersions();
  for (let tries = 0; tries < LOAD_TRIES; tries++) {
    try {
      if ((await servedVersion(record.task)) === version) break;
    } catch {
      // metrics unreadable for a moment: try again
    }
    if (record.task === state.task?.name) {
      showServing();
      if (tries === 0) loadVersions();
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
  loading.delete(version);
  showServing();
  loadVersions();
}

// The budget and method a job takes when the form leaves them empty: the task's own training settings, as
// the api applies them (POST /train takes what the body leaves out from the task's `training`).
function describeTaskBudget() {
  const training = state.task?.training ?? {};
  if (training.steps != null) return `${training.steps} steps`;
  const cap = training.max_steps != null ? `, at most ${training.max_steps} steps` : "";
  const floor = training.min_steps != null ? `, at least ${training.min_steps}` : "";
  if (training.epochs != null) return `${training.epochs} epochs${floor}${cap}`;
  // the default budget, in the api's own words (TrainIn's `steps`, in its OpenAPI document): its first
  // clause, and whether it makes a whole pass over a large set
  const help = state.caps.schemas.TrainIn?.properties?.steps?.description ?? "";
  const said = help.split("the default budget, ")[1]?.split(";")[0];
  const pass = help.includes("at least one epoch") ? ", and at least one whole pass over the examples" : "";
  return `the default budget${said ? `, ${said}${pass}` : ""}${cap}`;
}

function showTaskSettings() {
  const task = state.task;
  const method = task?.training?.method ?? task?.method ?? "";
  $("train-method").placeholder = task ? `the task's: ${method}` : "";
  $("train-steps").placeholder = task ? "the task's budget" : "";
  $("train-budget").textContent = task
    ? `Left empty, a job trains as the task's own jobs do: ${method}, ${describeTaskBudget()}. A value typed here is sent in its place.`
    : "";
}

async function start(event) {
  event.preventDefault();
  const status = $("train-status");
  if (!state.task) return;
  const body = {}; // what the form leaves empty the api takes from the task's training settings
  const steps = $("train-steps").value.trim();
  if (steps) body.steps = Number(steps);
  if ($("train-method").value.trim()) body.method = $("train-method").value.trim();
  try {
    const record = await post(taskPath(state.task.name, "/train"), body);
    jobs.set(record.id, { record, losses: [], stageSince: Date.now() });
    remember(record.task, record.id);
    say(status, `Queued job ${record.id.slice(0, 8)}: ${record.method}, ${budget(record.train_config)}.`, "ok");
    render();
    startPolling();
  } catch (error) {
    say(status, `Not started: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

const versionState = (v) => (v.state === "serving" && loading.has(v.version) ? "serving next: loading into the api…" : v.state ?? "—");

async function loadVersions() {
  if (!state.caps.has("GET", "/v1/tasks/{}/versions") || !state.task) return;
  const task = state.task.name;
  const status = $("versions-status");
  try {
    const answer = await get(taskPath(task, "/versions"));
    if (task !== state.task?.name) return;
    const versions = Array.isArray(answer) ? answer : answer.versions ?? [];
    const canPromote = state.caps.has("POST", "/v1/tasks/{}/versions/{}/promote");
    const rows = versions.map((v) => {
      const name = v.version ?? v.id;
      const dev = servedAccuracy(v.gate, v.dev_metrics ?? v.dev ?? v.metrics);
      return el(
        "tr",
        { dataset: { version: name, state: v.state ?? "" } },
        el("td", {}, el("code", {}, name)),
        el("td", {}, v.method ?? "—"),
        el("td", { class: "version-state" }, versionState(v)),
        el("td", { class: "num" }, dev === null ? "—" : percent(dev)),
        el("td", {}, formatTime(v.created)),
        el("td", {}, canPromote && v.state !== "serving"
          ? el("button", { type: "button", class: "secondary small", onclick: () => promote(task, name) }, v.state === "retired" ? "Roll back to it" : "Promote")
          : ""),
      );
    });
    $("versions").replaceChildren(
      rows.length ? table(["version", "method", "state", "dev accuracy", "created", ""], rows, "Versions") : el("p", { class: "muted" }, "No trained version yet."),
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
  watchServing({ task, published: { version } });
}

// The api reports a job's latest loss: the curve keeps one point per progress step of the prompt's
// training alone (a sentence reader's tuning reports its own loss and steps, in its own stages), and
// starts again when the training stage begins. `before` is the job's record as last seen.
export function keepLoss(losses, before, record) {
  if (record.stage && record.stage !== "training") return losses;
  const kept = record.stage !== before.stage ? [] : losses;
  if (typeof record.loss !== "number" && typeof record.loss !== "string") return kept;
  return record.progress !== before.progress || !kept.length ? [...kept, Number(record.loss)] : kept;
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
        else jobs.set(record.id, { record, losses: [], stageSince: Date.now() });
      }
    } catch {
      // unreadable for now: the next change of task or tab asks again
    }
  }
  for (const id of JSON.parse(sessionStorage.getItem(storageKey(task)) ?? "[]")) {
    if (!jobs.has(id)) jobs.set(id, { record: { id, task, method: "?", state: "queued", progress: 0 }, losses: [], stageSince: Date.now() });
  }
  render();
  startPolling();
}

export function taskChanged() {
  const task = state.task?.name;
  say($("train-status"), "");
  $("train-steps").value = "";
  showTaskSettings();
  if (task) loadJobs(task);
  else render();
}

export function shown(tab) {
  if (tab !== "training") return;
  if (state.task) loadJobs(state.task.name);
  showServing();
  loadVersions();
}
