// Teach: add examples one by one or from a file, browse, search and delete them, count them per label.

import { del, formatDetail, get, post, taskPath } from "./api.js";
import { LabelPicker } from "./labelpicker.js";
import { batches, checkRows, readRows } from "./upload.js";
import { $, el, isPairTask, labelName, say, showText, table, textId } from "./util.js";

const PAGE_SIZE = 1000; // examples per GET (the api's largest page)
const MAX_PAGES = 50; // past 50,000 examples the browser shows the first ones only
const ROWS_SHOWN = 100; // table rows rendered per "Show more"
const PREVIEW_ROWS = 200;
const CHIPS_SHOWN = 24; // past this many labels, the counts show the labels with the fewest examples first

let state;
let actions;
let examples = []; // the loaded examples of the selected task
let loadedFor = null;
let shownRows = ROWS_SHOWN;
let pending = null; // a checked upload waiting for its button
let complete = true; // every page was read (false past MAX_PAGES)
let addPicker; // the label of the example added by the form
let filterPicker; // shows one label's examples only; none picked: all
let allChips = false; // every label's count shown, not only the fewest

async function loadExamples() {
  const task = state.task;
  if (!task) return;
  loadedFor = task.name;
  const loaded = [];
  let after = -1;
  complete = false;
  for (let page = 0; page < MAX_PAGES; page++) {
    const answer = await get(taskPath(task.name, `/examples?after=${after}&limit=${PAGE_SIZE}`));
    if (state.task?.name !== task.name) return; // another task was selected meanwhile
    loaded.push(...answer.examples);
    if (answer.next_after === null) {
      complete = true;
      break;
    }
    after = answer.next_after;
  }
  examples = loaded;
  renderCounts();
  renderExamples();
}

// Examples per label: a few labels in the task's order; many, the fewest examples first (the labels that
// need teaching), CHIPS_SHOWN of them until asked for all.
function renderCounts() {
  $("example-total").textContent = `(${examples.length}${complete ? "" : "+, the first ones shown"})`;
  const counts = Object.fromEntries(Object.keys(state.task.labels).map((label) => [label, 0]));
  for (const example of examples) counts[example.label] = (counts[example.label] ?? 0) + 1;
  let entries = Object.entries(counts);
  const many = entries.length > CHIPS_SHOWN;
  if (many) entries = entries.sort(([a, x], [b, y]) => x - y || a.localeCompare(b));
  const shown = many && !allChips ? entries.slice(0, CHIPS_SHOWN) : entries;
  $("label-counts").replaceChildren(
    ...shown.map(([label, count]) =>
      el("span", { class: "count", dataset: { label } }, el("strong", {}, String(count)), " ", labelName(label, state.task.labels[label])),
    ),
  );
  $("label-counts-note").hidden = !many;
  $("label-counts-note").textContent = `${shown.length} of ${entries.length} labels, the fewest examples first.`;
  $("label-counts-more").hidden = !many;
  $("label-counts-more").textContent = allChips ? `Show the ${CHIPS_SHOWN} with the fewest` : `Show all ${entries.length} labels`;
}

function matches(example, query) {
  if (!query) return true;
  const q = query.toLowerCase();
  return showText(example.text).toLowerCase().includes(q) || example.label.toLowerCase() === q || String(example.id) === q;
}

function renderExamples() {
  const query = $("example-search").value.trim();
  const label = filterPicker.value;
  const found = examples.filter((e) => matches(e, query) && (!label || e.label === label));
  const rows = found.slice(0, shownRows).map((example) =>
    el(
      "tr",
      { dataset: { id: String(example.id) } },
      el("td", { class: "num" }, String(example.id)),
      el("td", {}, showText(example.text)),
      el("td", {}, labelName(example.label)),
      el("td", {}, el("button", { type: "button", class: "secondary small", "aria-label": `Delete example ${example.id}`, onclick: () => remove(example) }, "Delete")),
    ),
  );
  $("examples-table").replaceChildren(
    found.length ? table(["id", "text", "label", ""], rows, "Examples") : el("p", { class: "muted" }, examples.length ? "Nothing matches." : "No examples yet."),
  );
  $("examples-more").hidden = found.length <= shownRows;
  $("examples-more").textContent = `Show more (${found.length - shownRows} hidden)`;
}

async function remove(example) {
  if (!window.confirm(`Delete example #${example.id}: “${showText(example.text).slice(0, 80)}”?`)) return;
  try {
    await del(taskPath(state.task.name, `/examples/${example.id}`));
    examples = examples.filter((e) => e.id !== example.id);
    renderCounts();
    renderExamples();
    say($("examples-status"), `Deleted example #${example.id}.`, "ok");
  } catch (error) {
    say($("examples-status"), `Not deleted: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

async function addOne(event) {
  event.preventDefault();
  const status = $("add-status");
  const pair = isPairTask(state.task);
  const text = pair ? [$("add-text").value.trim(), $("add-text-b").value.trim()] : $("add-text").value.trim();
  if (!addPicker.value) {
    say(status, "Pick a label: type part of its name in the Label box, then choose it from the list.", "error");
    $("add-label").focus();
    return;
  }
  const { examples: valid, errors } = checkRows([{ line: 1, text, label: addPicker.value }], state.task, pair);
  if (errors.length) {
    say(status, errors[0].error, "error");
    return;
  }
  try {
    const ack = await post(taskPath(state.task.name, "/examples"), { examples: valid });
    const [first] = ack.examples;
    say(status, first.created ? `Added example #${first.id}.` : `Already there as example #${first.id}.`, "ok");
    $("add-text").value = "";
    $("add-text-b").value = "";
    $("add-text").focus();
    await loadExamples();
  } catch (error) {
    const message = error.status === 409
      ? `This text is already in the book with another label (example #${textId(text)}).`
      : `Not added: ${error.status || ""} ${formatDetail(error.detail)}`;
    say(status, message, "error");
  }
}

function renderPreview(checked) {
  const withErrors = checked.rows.filter((r) => r.error);
  const shown = [...withErrors, ...checked.rows.filter((r) => !r.error)].slice(0, PREVIEW_ROWS);
  const rows = shown.map((row) =>
    el(
      "tr",
      { class: row.error ? "bad" : "" },
      el("td", { class: "num" }, String(row.line)),
      el("td", {}, showText(row.text)),
      el("td", {}, String(row.label ?? "")),
      el("td", { class: "num" }, row.id === undefined ? "" : String(row.id)),
      el("td", {}, row.error ?? "ok"),
    ),
  );
  $("upload-preview").replaceChildren(table(["line", "text", "label", "id", "check"], rows, "Upload preview"));
}

async function readFile() {
  const file = $("upload-file").files[0];
  const summary = $("upload-summary");
  pending = null;
  $("upload-send").disabled = true;
  $("upload-preview").replaceChildren();
  $("upload-progress").hidden = true;
  say($("upload-status"), "");
  if (!file || !state.task) return;
  let rows;
  try {
    rows = readRows(file.name, await file.text());
  } catch (error) {
    say(summary, `${file.name}: ${error.message}`, "error");
    return;
  }
  const createLabels = $("upload-create-labels").checked;
  const checked = checkRows(rows, state.task, isPairTask(state.task), createLabels);
  renderPreview(checked);
  if (checked.errors.length) {
    say(summary, `${file.name}: ${checked.errors.length} of ${checked.rows.length} rows have errors; nothing will be written until they are fixed.`, "error");
    return;
  }
  if (!checked.examples.length) {
    say(summary, `${file.name}: no rows.`, "error");
    return;
  }
  pending = { examples: checked.examples, newLabels: checked.newLabels, createLabels };
  const creates = checked.newLabels.length
    ? ` Creates ${checked.newLabels.length} label(s): ${checked.newLabels.join(", ")}.`
    : "";
  say(summary, `${file.name}: ${pending.examples.length} rows, all good.${creates}`, "ok");
  $("upload-send").disabled = false;
}

// Batches go one after another; the first refusal stops the upload. Batches already acknowledged
// stay written, and since every row has an id, sending the file again after a fix adds each row once.
async function send() {
  if (!pending) return;
  const task = state.task;
  const status = $("upload-status");
  const progress = $("upload-progress");
  const { examples: rows, newLabels, createLabels } = pending;
  const parts = batches(rows);
  $("upload-send").disabled = true;
  progress.hidden = false;
  progress.max = rows.length;
  progress.value = 0;
  let sent = 0;
  let created = 0;
  for (const [index, batch] of parts.entries()) {
    say(status, `Sending batch ${index + 1} of ${parts.length}…`);
    try {
      // Each batch creates the labels it names that the task lacks, with its examples or not at all.
      const body = createLabels ? { examples: batch, create_labels: true } : { examples: batch };
      const ack = await post(taskPath(task.name, "/examples"), body);
      created += ack.examples.filter((e) => e.created).length;
    } catch (error) {
      await afterUpload(task, sent > 0 && newLabels.length > 0);
      say(status, `Stopped at batch ${index + 1} of ${parts.length} (rows ${sent + 1}–${sent + batch.length}): ${error.status || ""} ${formatDetail(error.detail)}. ${sent} rows before it were written.`, "error");
      return;
    }
    sent += batch.length;
    progress.value = sent;
  }
  pending = null;
  $("upload-file").value = "";
  $("upload-preview").replaceChildren();
  await afterUpload(task, newLabels.length > 0);
  const labelled = newLabels.length ? ` New labels: ${newLabels.join(", ")}.` : "";
  say(status, `Uploaded ${sent} rows: ${created} new, ${sent - created} already there.${labelled}`, "ok");
}

// Labels created: the task is read again (its labels, everywhere in the page; that clears the upload's
// status, said after it), and its examples with it.
async function afterUpload(task, labelsChanged) {
  if (labelsChanged) await actions.refreshTasks(task.name);
  await loadExamples();
}

async function addLabel(event) {
  event.preventDefault();
  const status = $("label-status");
  try {
    await post(taskPath(state.task.name, "/labels"), { label: $("new-label").value.trim(), word: $("new-label-word").value.trim() });
    say(status, `Added label ${$("new-label").value.trim()}.`, "ok");
    $("new-label").value = "";
    $("new-label-word").value = "";
    await actions.refreshTasks(state.task.name);
  } catch (error) {
    say(status, `Not added: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

export function init(shared, wired) {
  state = shared;
  actions = wired;
  addPicker = new LabelPicker({ id: "add-label" });
  $("add-label-slot").replaceWith(addPicker.node);
  const refilter = () => {
    shownRows = ROWS_SHOWN;
    renderExamples();
  };
  filterPicker = new LabelPicker({ id: "example-label", placeholder: "any label", onPick: refilter });
  filterPicker.input.addEventListener("input", refilter); // emptied: every label; a label typed whole: its own
  $("example-label-slot").replaceWith(filterPicker.node);
  $("add-form").addEventListener("submit", addOne);
  // Cleared on each pick so that choosing the same file again (after fixing it) reads it again.
  $("upload-file").addEventListener("click", (event) => {
    event.target.value = "";
  });
  $("upload-file").addEventListener("change", readFile);
  $("upload-send").addEventListener("click", send);
  $("upload-create-labels").addEventListener("change", readFile); // the same file, checked again
  $("upload-create-labels").closest("label").hidden = !state.caps.has("POST", "/v1/tasks/{}/labels");
  $("example-search").addEventListener("input", () => {
    shownRows = ROWS_SHOWN;
    renderExamples();
  });
  $("examples-refresh").addEventListener("click", () =>
    loadExamples().catch((error) => say($("examples-status"), `Not read: ${error.message}`, "error")),
  );
  $("examples-more").addEventListener("click", () => {
    shownRows += ROWS_SHOWN;
    renderExamples();
  });
  $("label-counts-more").addEventListener("click", () => {
    allChips = !allChips;
    renderCounts();
  });
  $("label-form").hidden = !state.caps.has("POST", "/v1/tasks/{}/labels");
  $("label-form").addEventListener("submit", addLabel);
}

export function taskChanged() {
  examples = [];
  allChips = false;
  loadedFor = null;
  pending = null;
  $("upload-send").disabled = true;
  $("upload-preview").replaceChildren();
  for (const id of ["upload-summary", "upload-status", "add-status", "examples-status"]) say($(id), "");
  addPicker.setLabels(state.task?.labels ?? {});
  filterPicker.setLabels(state.task?.labels ?? {});
}

export function examplesChanged() {
  loadedFor = null; // read them again when the tab is next shown
}

export function shown(tab) {
  if (tab === "teach" && state.task && loadedFor !== state.task.name) {
    loadExamples().catch((error) => say($("examples-status"), `Examples not read: ${error.message}`, "error"));
  }
}
