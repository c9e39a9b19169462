// Suggestions: texts the served model is least sure of, labelled with one key press (1..9).
// Shown only when the api offers GET /v1/tasks/{task}/suggestions.

import { formatDetail, get, post, taskPath } from "./api.js";
import { $, el, percent, say, showText } from "./util.js";

const COUNT = 10;

let state;
let loadedFor = null;

const labels = () => Object.keys(state.task?.labels ?? {});

function keyHint() {
  $("suggestion-keys").textContent = labels()
    .slice(0, 9)
    .map((label, i) => `${i + 1} = ${label} (${state.task.labels[label]})`)
    .join(", ");
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
    el("span", { class: "row" }, labels().slice(0, 9).map((label, i) =>
      el("button", { type: "button", class: "secondary small", tabindex: "-1", onclick: () => labelSuggestion(node, suggestion, label) }, `${i + 1} ${label}`),
    )),
  );
  node.addEventListener("keydown", (event) => {
    const index = Number(event.key) - 1;
    if (Number.isInteger(index) && index >= 0 && index < Math.min(9, labels().length)) {
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
    say(status, `Labelled #${suggestion.id} as ${label}.`, "ok");
    const next = node.nextElementSibling ?? node.previousElementSibling;
    node.remove();
    next?.focus();
    if (!$("suggestions").children.length) load();
  } catch (error) {
    say(status, `Not labelled: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

async function load() {
  const status = $("suggestions-status");
  if (!state.task) return;
  loadedFor = state.task.name;
  try {
    const answer = await get(taskPath(state.task.name, `/suggestions?n=${COUNT}`));
    const suggestions = Array.isArray(answer) ? answer : answer.suggestions ?? [];
    $("suggestions").replaceChildren(...suggestions.map(item));
    if (!suggestions.length) say(status, "Nothing waits in the pool.");
    $("suggestions").firstElementChild?.focus();
  } catch (error) {
    say(status, `Suggestions not read: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

export function init(shared) {
  state = shared;
  $("tab-suggestions").hidden = !state.caps.has("GET", "/v1/tasks/{}/suggestions");
  $("suggestions-refresh").addEventListener("click", load);
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
