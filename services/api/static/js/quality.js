// Quality: how good the served (or a recorded) version is, where it errs, below which confidence the
// task should abstain, and which examples look mislabelled (GET /v1/tasks/{task}/report), with the
// fixes one click away. Shown only when the api offers the report.

import { del, formatDetail, get, patch, request, taskPath } from "./api.js";
import { coverageChart, reliabilityChart, versionsChart } from "./charts.js";
import { LabelPicker } from "./labelpicker.js";
import { $, duration, el, labelName, percent, progressBar, say, servedAccuracy, servedEce, servesScaled, showText, table } from "./util.js";

let state;
let actions;
let report = null; // the report shown
let sliderFor = null; // the task whose threshold the slider was set from
let generation = 0; // a newer load makes older answers stale

const HEATMAP_LABELS = 20; // past this many labels the heatmap is folded away: the pairs list reads better
const LABEL_ROWS_IN_VIEW = 14; // per-label rows the box shows before it scrolls (and says so)

const fixed = (value, digits = 3) => (typeof value === "number" ? value.toFixed(digits) : "—");
const failure = (error) => `${error.status || ""} ${formatDetail(error.detail)}`.trim();
const threshold = (value) => String(Number(value.toFixed(3))); // 0.6, not 0.6000000000000001

const SCORED_BY = {
  "leave-one-out": (r) => `Scored leave-one-out over ${r.examples} labelled examples: each classified with itself out of the store.`,
  dev: (r) => `Scored as served (the store included) on the ${r.examples} dev examples held out when version ${r.model_version} was made: the accuracy the promotion gate compared.`,
  train: (r) => `Scored on the ${r.examples} examples version ${r.model_version} was trained on (it had no dev split): optimistic.`,
};

function stat(name, value, key) {
  return el("div", { class: "stat", dataset: { stat: key } }, el("span", { class: "stat-value" }, value), el("span", { class: "muted" }, name));
}

// One calibration error per version, the served confidence's (util.servedEce), and what temperature
// scaling did or would do to it, in words.
function calibrationLine(r) {
  const c = r.calibration;
  if (!c) return ["Calibration: needs at least 2 scored examples."];
  const error = fixed(servedEce(c));
  const folds = `measured on ${c.folds} held-out folds`;
  if (servesScaled(c)) {
    return [`Calibration error ${error} after temperature scaling (T = ${fixed(c.temperature, 2)}, ${folds}); ${fixed(c.ece_before)} before it. This version serves the scaled confidences.`];
  }
  if (r.scored_by === "leave-one-out") {
    const would = c.adopted ? `would bring it to ${fixed(c.ece_after)} (${folds})` : `would not lower it (${folds})`;
    return [`Calibration error ${error}: the untrained model serves its confidences unscaled. Temperature scaling ${would}; a trained version adopts it where it helps.`];
  }
  return [`Calibration error ${error}: temperature scaling did not lower it (${folds}), so this version serves its confidences unscaled.`];
}

// Each reader alone on the same examples, beside the served accuracy of the headline: the prompt (P_LM)
// and the book (P_kNN over the stored examples, keyed by the task's sentence reader or the slot vectors).
function readersLine(r) {
  const readers = r.readers;
  if (!readers) return [];
  const figure = (value) => (typeof value === "number" ? percent(value) : "—");
  const lam = typeof readers.lam === "number" ? `, the book weighted λ = ${fixed(readers.lam, 2)}` : "";
  return [`Each reader alone: the prompt ${figure(readers.prompt)}, the book of examples (keyed by ${readers.book_keyed_by}) ${figure(readers.book)}; served, both read${lam}: ${percent(r.accuracy)}.`];
}

function renderHeadline(r) {
  const c = r.calibration;
  $("quality-headline").replaceChildren(
    stat("accuracy", percent(r.accuracy), "accuracy"),
    stat("macro-F1", fixed(r.macro_f1), "macro-f1"),
    stat(c && servesScaled(c) ? "calibration error (after scaling)" : "calibration error", fixed(c ? servedEce(c) : r.ece), "ece"),
    stat("examples scored", String(r.examples), "examples"),
  );
  $("quality-scored").replaceChildren(
    (SCORED_BY[r.scored_by] ?? (() => `Scored by ${r.scored_by}.`))(r),
    " Model ", el("code", { id: "quality-model" }, r.model_version),
    " · store ", el("code", {}, r.store_version),
    " · ", el("code", { id: "quality-scored-by" }, r.scored_by),
  );
  $("quality-calibration").replaceChildren(...calibrationLine(r));
  $("quality-readers").replaceChildren(...readersLine(r));
}

// Cells shaded by their share of the row (the labelled examples of one label): the diagonal in the
// accent colour, confusions in the error colour.
function heatmap({ labels, matrix }) {
  const head = el("tr", {}, el("th", { scope: "col" }, "labelled \\ predicted"), labels.map((label) => el("th", { scope: "col" }, label)));
  const rows = matrix.map((row, gold) => {
    const total = row.reduce((sum, count) => sum + count, 0);
    const cells = row.map((count, predicted) => {
      const share = total ? count / total : 0;
      const colour = gold === predicted ? "--accent" : "--error";
      const cell = el("td", {
        class: `cell${share > 0.55 ? " strong" : ""}`,
        title: `labelled ${labels[gold]}, predicted ${labels[predicted]}: ${count} (${percent(share)} of ${labels[gold]})`,
        dataset: { gold: labels[gold], predicted: labels[predicted] },
      }, String(count));
      cell.style.background = `color-mix(in srgb, var(${colour}) ${Math.round(share * 85)}%, transparent)`;
      return cell;
    });
    return el("tr", {}, el("th", { scope: "row" }, labels[gold]), cells);
  });
  return el("table", { class: "confusion" }, el("caption", { class: "visually-hidden" }, "Confusion matrix"), el("thead", {}, head), el("tbody", {}, rows));
}

// Up to HEATMAP_LABELS labels, the heatmap; past that, folded under a toggle (built when opened) and
// scrolling both ways in its box: 150 × 150 cells are for looking something up, not for reading.
function renderConfusion(confusion) {
  const count = confusion.labels.length;
  if (count <= HEATMAP_LABELS) {
    $("quality-confusion").replaceChildren(heatmap(confusion));
    return;
  }
  const body = el("div", { class: "scroll" });
  const details = el("details", { class: "heatmap-fold" }, el("summary", {}, `The whole ${count} × ${count} matrix (scrolls)`), body);
  details.addEventListener("toggle", () => details.open && !body.firstChild && body.append(heatmap(confusion)));
  $("quality-confusion").replaceChildren(details);
}

function renderConfused({ confused_pairs: pairs = [], per_label: perLabel }) {
  $("quality-confused").replaceChildren(
    ...(pairs.length
      ? pairs.map(({ label, predicted, count }) =>
          el("li", { dataset: { label, predicted } },
            el("strong", { class: "label-text", title: label }, label), " → ",
            el("strong", { class: "label-text", title: predicted }, predicted), `: ${count}`,
            el("span", { class: "muted" }, ` (${percent(count / (perLabel[label]?.support || 1))} of ${label})`),
          ))
      : [el("li", { class: "muted" }, "No confusion: every scored example was predicted as its own label.")]),
  );
}

// Worst first: the lowest F1, then the lowest recall; labels with no example scored say nothing, so last.
export function worstFirst(perLabel) {
  return Object.entries(perLabel).sort(([a, x], [b, y]) =>
    (x.support === 0) - (y.support === 0) || x.f1 - y.f1 || x.recall - y.recall || a.localeCompare(b),
  );
}

function renderLabels(perLabel) {
  const words = state.task?.labels ?? {};
  const rows = worstFirst(perLabel).map(([label, s]) =>
    el("tr", { dataset: { label } },
      el("th", { scope: "row" }, labelName(label, words[label])),
      el("td", { class: "num" }, fixed(s.precision)),
      el("td", { class: "num" }, fixed(s.recall)),
      el("td", { class: "num" }, fixed(s.f1)),
      el("td", { class: "num" }, String(s.support)),
    ),
  );
  const scores = table(["label", "precision", "recall", "F1 ↑", "labelled"], rows, "Scores per label, the lowest F1 first");
  scores.querySelectorAll("th")[3].setAttribute("aria-sort", "ascending");
  const many = rows.length > LABEL_ROWS_IN_VIEW ? el("p", { class: "muted" }, `All ${rows.length} labels, in a box that scrolls.`) : null;
  $("quality-labels").replaceChildren(scores);
  $("quality-labels-note").replaceChildren(...(many ? [many] : []));
}

function renderMinConfidence() {
  const current = state.task?.min_confidence ?? null;
  $("quality-min-confidence").replaceChildren(
    ...(current === null
      ? ["The task never abstains (no min_confidence)."]
      : ["The task abstains below ", el("strong", { id: "quality-current-threshold" }, threshold(current)), "."]),
  );
  $("quality-clear").disabled = current === null;
}

function renderThreshold() {
  const curve = report.coverage;
  const point = curve[Number($("quality-threshold").value)] ?? curve[0];
  const shown = threshold(point.threshold);
  $("quality-threshold-value").textContent = shown;
  $("quality-threshold").setAttribute("aria-valuetext", shown);
  const answered = Math.round(point.coverage * report.examples);
  $("quality-at-threshold").textContent = point.accuracy === null
    ? `At ${shown}: every prediction abstains (none of the ${report.examples} scored is that sure).`
    : `At ${shown}: answers ${answered} of ${report.examples} (${percent(point.coverage)}), ${percent(point.accuracy)} of them right; abstains on ${report.examples - answered}.`;
  $("quality-coverage").replaceChildren(coverageChart(curve, point.threshold, state.task?.min_confidence ?? null));
}

// The slider moves over the report's thresholds; it starts at the task's min_confidence.
function placeSlider() {
  const slider = $("quality-threshold");
  slider.max = String(report.coverage.length - 1);
  if (sliderFor === state.task.name) return;
  sliderFor = state.task.name;
  const current = state.task.min_confidence ?? 0;
  const distances = report.coverage.map((p) => Math.abs(p.threshold - current));
  slider.value = String(distances.indexOf(Math.min(...distances)));
}

async function setThreshold(value) {
  const status = $("threshold-status");
  try {
    Object.assign(state.task, await patch(taskPath(state.task.name), { min_confidence: value }));
    say(status, value === null ? "The task no longer abstains." : `The task now abstains below ${threshold(value)}.`, "ok");
  } catch (error) {
    say(status, `Not set: ${failure(error)}`, "error");
  }
  renderMinConfidence();
  if (report) renderThreshold();
}

// "Or as…": the labels other than the one it has and the one predicted, searched as one types.
function otherLabel(suspect, gone) {
  const picker = new LabelPicker({
    name: `Relabel example ${suspect.id} as another label`,
    placeholder: "or as…",
    exclude: [suspect.label, suspect.predicted],
    disabled: gone,
    onPick: (label) => relabel(suspect, label),
  });
  picker.setLabels(state.task.labels);
  picker.node.classList.add("small");
  return picker.node;
}

function suspectRow(suspect) {
  const gone = suspect.text === null;
  const others = Object.keys(state.task.labels).filter((l) => l !== suspect.label && l !== suspect.predicted);
  return el(
    "tr",
    { dataset: { id: String(suspect.id) } },
    el("td", { class: "num" }, String(suspect.id)),
    el("td", {}, gone ? el("span", { class: "muted" }, "deleted since it was scored") : showText(suspect.text)),
    el("td", {}, suspect.label),
    el("td", { class: "num" }, `${suspect.predicted} `, el("span", { class: "muted" }, percent(suspect.confidence))),
    el("td", {}, el("div", { class: "actions" },
      el("button", { type: "button", class: "small", disabled: gone, "aria-label": `Relabel example ${suspect.id} as ${suspect.predicted}`, onclick: () => relabel(suspect, suspect.predicted) }, `Relabel as ${suspect.predicted}`),
      others.length ? otherLabel(suspect, gone) : null,
      el("button", { type: "button", class: "danger small", disabled: gone, "aria-label": `Delete example ${suspect.id}`, onclick: () => remove(suspect) }, "Delete"),
    )),
  );
}

function renderSuspects(r) {
  $("quality-suspects").replaceChildren(
    r.suspect_examples.length
      ? table(["id", "text", "labelled", "predicted", ""], r.suspect_examples.map(suspectRow), "Suspect examples")
      : el("p", { class: "muted" }, "No suspect: no example is predicted as another label with confidence of 50% or more."),
  );
}

// A trained version's report was scored when the version was made: fixes show at the next training.
const laterNote = () => (report && report.scored_by !== "leave-one-out" ? " This version was scored when it was made: the next training sees the change." : "");

async function relabel(suspect, label) {
  const status = $("suspects-status");
  say(status, `Relabelling #${suspect.id}…`);
  try {
    await patch(taskPath(state.task.name, `/examples/${suspect.id}`), { label });
    say(status, `Relabelled #${suspect.id} as ${label}.${laterNote()}`, "ok");
    actions.examplesChanged();
  } catch (error) {
    say(status, `Not relabelled: ${failure(error)}`, "error");
  }
  await load({ keepStatus: true });
}

async function remove(suspect) {
  if (!window.confirm(`Delete example #${suspect.id}: “${showText(suspect.text).slice(0, 80)}”?`)) return;
  const status = $("suspects-status");
  try {
    await del(taskPath(state.task.name, `/examples/${suspect.id}`));
    say(status, `Deleted #${suspect.id}.${laterNote()}`, "ok");
    actions.examplesChanged();
  } catch (error) {
    say(status, `Not deleted: ${failure(error)}`, "error");
  }
  await load({ keepStatus: true });
}

function showReport(version) {
  $("quality-version").value = version;
  load();
  $("quality-version").scrollIntoView({ block: "nearest" });
}

// One accuracy and one calibration error per version, as its report gives them: the served prediction's.
function renderVersions(versions) {
  const oldestFirst = versions.slice().reverse().map((v) => ({ ...v, accuracy: servedAccuracy(v.gate, v.dev_metrics) }));
  const rows = oldestFirst.map((v, i) => {
    const c = v.dev_metrics?.calibration;
    return el("tr", { dataset: { version: v.version, state: v.state } },
      el("td", { class: "num" }, `#${i + 1}`),
      el("td", {}, el("code", {}, v.version)),
      el("td", {}, v.method),
      el("td", {}, v.state),
      el("td", { class: "num" }, typeof v.accuracy === "number" ? percent(v.accuracy) : "—"),
      el("td", { class: "num" }, c ? `${fixed(servedEce(c))} ${servesScaled(c) ? "after scaling" : "unscaled"}` : "—"),
      el("td", {}, el("button", { type: "button", class: "secondary small", onclick: () => showReport(v.version) }, "Its report")),
    );
  });
  $("quality-versions").replaceChildren(
    ...(versions.length
      ? [versionsChart(oldestFirst), el("div", { class: "scroll-x" }, table(["", "version", "method", "state", "dev accuracy", "calibration error", ""], rows, "Versions"))]
      : [el("p", { class: "muted" }, "No trained version yet: the report scores the base model leave-one-out over the store.")]),
  );
  const select = $("quality-version");
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "" }, "the version served"), ...versions.map((v) => el("option", { value: v.version }, `${v.version} (${v.state})`)));
  select.value = versions.some((v) => v.version === chosen) ? chosen : "";
}

async function loadVersions(task, mine) {
  if (!state.caps.has("GET", "/v1/tasks/{}/versions")) return;
  try {
    const answer = await get(taskPath(task, "/versions"));
    if (mine === generation) renderVersions(answer.versions ?? []);
  } catch (error) {
    if (mine === generation) $("quality-versions").replaceChildren(el("p", { class: "status", dataset: { kind: "error" } }, `Versions not read: ${failure(error)}`));
  }
}

function render() {
  renderHeadline(report);
  renderConfused(report);
  renderConfusion(report.confusion);
  renderLabels(report.per_label);
  $("quality-reliability").replaceChildren(reliabilityChart(report.reliability));
  placeSlider();
  renderThreshold();
  renderMinConfidence();
  renderSuspects(report);
}

function clear() {
  report = null;
  for (const id of ["quality-headline", "quality-scored", "quality-calibration", "quality-confused", "quality-confusion", "quality-labels", "quality-labels-note", "quality-reliability", "quality-coverage", "quality-suspects"]) {
    $(id).replaceChildren();
  }
  $("quality-report").hidden = true;
}

// The report, asked for without waiting where the api can answer 202 with its progress (an untrained task's
// leave-one-out pass takes a minute and more at 150 labels): a bar until it is done. Null when a newer
// load made this one stale.
async function fetchReport(path, mine) {
  if (!state.caps.schemas.ReportPending) return get(path);
  const status = $("quality-status");
  const shown = $("quality-progress");
  const joiner = path.includes("?") ? "&" : "?";
  try {
    for (;;) {
      const answer = await request("GET", `${path}${joiner}wait=false`);
      if (mine !== generation) return null;
      if (answer.status !== 202) return answer.body;
      const p = answer.body;
      const left = p.scored > 0 ? ` · about ${duration((p.elapsed_s * (p.examples - p.scored)) / p.scored)} left` : "";
      say(status, p.examples
        ? `Scoring leave-one-out: ${p.scored} of ${p.examples} examples (${percent(p.progress)}) · ${duration(p.elapsed_s)}${left}`
        : `Starting the report · ${duration(p.elapsed_s)}`);
      shown.replaceChildren(progressBar(p.examples ? p.progress : null, "report progress"));
      shown.hidden = false;
      await new Promise((resolve) => setTimeout(resolve, 1000));
      if (mine !== generation) return null;
    }
  } finally {
    if (mine === generation) shown.hidden = true;
  }
}

// `keepStatus`: a fix's own message stays up while the report it changed is read again.
async function load({ keepStatus = false } = {}) {
  const task = state.task?.name;
  if (!task) return;
  const mine = ++generation;
  if (!keepStatus) for (const id of ["threshold-status", "suspects-status"]) say($(id), "");
  const version = $("quality-version").value;
  const status = $("quality-status");
  say(status, "Scoring…");
  const versions = loadVersions(task, mine);
  try {
    const answer = await fetchReport(taskPath(task, `/report${version ? `?version=${encodeURIComponent(version)}` : ""}`), mine);
    if (mine !== generation || answer === null) return;
    report = answer;
    state.task.min_confidence = answer.min_confidence; // the report reads the task as it is now
    $("quality-report").hidden = false;
    render();
    say(status, "");
  } catch (error) {
    if (mine !== generation) return;
    clear();
    // 409: nothing scored yet (no labelled example, or a version that kept no dev scores)
    if (error.status === 409) say(status, `Nothing to report yet: ${formatDetail(error.detail)}.`);
    else say(status, `Report not read: ${failure(error)}`, "error");
  }
  await versions;
}

export function init(shared, wired) {
  state = shared;
  actions = wired;
  $("tab-quality").hidden = !state.caps.has("GET", "/v1/tasks/{}/report");
  $("quality-versions-card").hidden = !state.caps.has("GET", "/v1/tasks/{}/versions");
  $("quality-refresh").addEventListener("click", () => load());
  $("quality-version").addEventListener("change", () => load());
  $("quality-threshold").addEventListener("input", () => report && renderThreshold());
  $("quality-use").addEventListener("click", () => report && setThreshold(report.coverage[Number($("quality-threshold").value)].threshold));
  $("quality-clear").addEventListener("click", () => setThreshold(null));
  clear();
}

export function taskChanged() {
  generation++;
  sliderFor = null;
  $("quality-version").replaceChildren(el("option", { value: "" }, "the version served"));
  $("quality-versions").replaceChildren();
  for (const id of ["quality-status", "threshold-status", "suspects-status"]) say($(id), "");
  clear();
}

export function shown(tab) {
  if (tab === "quality" && !$("tab-quality").hidden) load();
}
