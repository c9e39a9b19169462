// Suggestions: texts the served model is least sure of, labelled with one key press (1..9).
// Shown only when the api offers GET /v1/tasks/{task}/suggestions.

import { formatDetail, get, post, taskPath } from "./api.js";
import { LabelPicker } from "./labelpicker.js";
import { $, el, labelText, percent, say, showText } from "./util.js";

const COUNT = 10;
const KEYED_LABELS = 9; // up to 9 labels, keys 1..9 pick them; past that, a picker that searches them

let state;
let loadedFor = null;

const labels = () => Object.keys(state.task?.labels ?? {});
const keyed = () => labels().length <= KEYED_LABELS;

function keyHint() {
  $("suggestion-keys").textContent = keyed()
    ? `Select one and press a number key to label it: ${labels().map((label, i) => `${i + 1} = ${labelText(label, state.task.labels[label])}`).join(", ")}`
    : `Type part of a label in a text's label box, then pick it with the arrows and Enter (or a click).`;
}

// The label buttons of a task with few labels, or the picker of one with many.
function labelControl(node, suggestion) {
  if (keyed()) {
    return el("span", { class: "row" }, labels().map((label, i) =>
      el("button", { type: "button", class: "secondary small", tabindex: "-1", onclick: () => labelSuggestion(node, suggestion, label) }, `${i + 1} ${label}`),
    ));
  }
  const picker = new LabelPicker({ name: `Label “${showText(suggestion.text)}” as`, onPick: (label) => labelSuggestion(node, suggestion, label) });
  picker.setLabels(state.task.labels);
  return picker.node;
}

function item(suggestion) {
  const prediction = suggestion.prediction ?? suggestion;
  const top = prediction.probabilities?.[prediction.label];
  // below the task's min_confidence the prediction abstains: no label
  const predicted = prediction.abstained ? "abstained" : `predicted ${prediction.label ?? "?"}`;
  const node = el(
    "li",
    { tabindex: "0", class: "suggestion", dataset: { id: String(suggestion.id) }, "aria-label": `${showText(suggestion.text)}; ${predicted}` },
    el("span", { class: "suggestion-text" }, showText(suggestion.text)),
    el("span", { class: "muted" }, ` ${predicted}${top === undefined ? "" : ` (${percent(top)})`}`),
  );
  node.append(labelControl(node, suggestion));
  node.addEventListener("keydown", (event) => {
    if (event.target !== node) return; // keys typed in the picker are its own
    const index = Number(event.key) - 1;
    if (keyed() && Number.isInteger(index) && index >= 0 && index < labels().length) {
      event.preventDefault();
      labelSuggestion(node, suggestion, labels()[index]);
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      (event.key === "ArrowDown" ? node.nextElementSibling : node.previousElementSibling)?.focus();
    }
  });
  return node;
}

// The suggestion's id becomes the example's id: the api can then take it out of the pool, and a
// retried key press writes nothing twice.
async function labelSuggestion(node, suggestion, label) {
  const status = $("suggestions-status");
  try {
    await post(taskPath(state.task.name, "/examples"), { examples: [{ text: suggestion.text, label, id: suggestion.id }] });
    const done = `Labelled #${suggestion.id} as ${label}.`;
    say(status, done, "ok");
    const next = node.nextElementSibling ?? node.previousElementSibling;
    node.remove();
    next?.focus();
    if (!$("suggestions").children.length) load(done);
  } catch (error) {
    say(status, `Not labelled: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

// `done`: what was just labelled, still said when the pool turns out empty.
async function load(done = "") {
  const status = $("suggestions-status");
  if (!state.task) return;
  loadedFor = state.task.name;
  try {
    const answer = await get(taskPath(state.task.name, `/suggestions?n=${COUNT}`));
    const suggestions = Array.isArray(answer) ? answer : answer.suggestions ?? [];
    $("suggestions").replaceChildren(...suggestions.map(item));
    if (!suggestions.length) say(status, `${done} Nothing waits in the pool.`.trim(), done ? "ok" : "");
    $("suggestions").firstElementChild?.focus();
  } catch (error) {
    say(status, `Suggestions not read: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

export function init(shared) {
  state = shared;
  $("tab-suggestions").hidden = !state.caps.has("GET", "/v1/tasks/{}/suggestions");
  $("suggestions-refresh").addEventListener("click", () => load());
}

export function taskChanged() {
  loadedFor = null;
  $("suggestions").replaceChildren();
  say($("suggestions-status"), "");
  keyHint();
}

export function shown(tab) {
  if (tab === "suggestions" && !$("tab-suggestions").hidden && loadedFor !== state.task?.name) load();
}
