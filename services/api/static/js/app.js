// The console's shell: tabs, the task picker, the API key and the panels it wires together.

import { Capabilities, apiKey, get, setApiKey } from "./api.js";
import * as health from "./health.js";
import * as quality from "./quality.js";
import * as suggestions from "./suggestions.js";
import * as tasks from "./tasks.js";
import * as teach from "./teach.js";
import * as training from "./training.js";
import * as tryIt from "./try.js";
import { $, el, isPairTask, wordSaysMore } from "./util.js";

const TAB_NAMES = ["try", "teach", "suggestions", "training", "quality", "tasks", "health"];
const TASK_STORAGE = "openbook.task";
const SUMMARY_LABELS = 6; // the header names a task's labels up to this many, and counts them past it

// What every panel reads: the tasks, the selected one, and what the api offers.
export const state = { tasks: [], task: null, caps: new Capabilities(null) };
const panels = [tryIt, teach, suggestions, training, quality, tasks, health];

function visibleTabs() {
  return TAB_NAMES.map((name) => $(`tab-${name}`)).filter((tab) => !tab.hidden);
}

function showTab(name, { focus = false } = {}) {
  if ($(`tab-${name}`)?.hidden || !TAB_NAMES.includes(name)) name = "try";
  for (const other of TAB_NAMES) {
    const tab = $(`tab-${other}`);
    const selected = other === name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(`panel-${other}`).hidden = !selected;
  }
  if (focus) $(`tab-${name}`).focus();
  history.replaceState(null, "", `#${name}`);
  for (const panel of panels) panel.shown?.(name, state);
}

function wireTabs() {
  for (const name of TAB_NAMES) $(`tab-${name}`).addEventListener("click", () => showTab(name));
  // Arrow keys move between tabs, as in the WAI-ARIA tabs pattern.
  $("tab-try").parentElement.addEventListener("keydown", (event) => {
    const tabs = visibleTabs();
    const at = tabs.indexOf(document.activeElement);
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    let next = null;
    if (step) next = tabs[(at + step + tabs.length) % tabs.length];
    else if (event.key === "Home") next = tabs[0];
    else if (event.key === "End") next = tabs.at(-1);
    if (next) {
      event.preventDefault();
      showTab(next.id.slice(4), { focus: true });
    }
  });
}

export function currentTab() {
  return TAB_NAMES.find((name) => $(`tab-${name}`).getAttribute("aria-selected") === "true") ?? "try";
}

// Reloads the task list; keeps the selection when it still exists, else selects `prefer` or the first.
export async function refreshTasks(prefer) {
  state.tasks = await get("/v1/tasks");
  const names = state.tasks.map((t) => t.name);
  const wanted = [prefer, state.task?.name, sessionStorage.getItem(TASK_STORAGE)].find((n) => names.includes(n));
  const select = $("task-select");
  select.replaceChildren(...state.tasks.map((t) => el("option", { value: t.name }, t.name)));
  if (!state.tasks.length) select.append(el("option", { value: "" }, "no tasks yet"));
  selectTask(wanted ?? names[0] ?? null);
}

export function selectTask(name) {
  state.task = state.tasks.find((t) => t.name === name) ?? null;
  $("task-select").value = name ?? "";
  if (name) sessionStorage.setItem(TASK_STORAGE, name);
  const task = state.task;
  const labels = Object.entries(task?.labels ?? {}).map(([l, w]) => (wordSaysMore(l, w) ? `${l}=${w}` : l));
  // A few labels are spelled out; many are counted (all of them in the tooltip and in Tasks).
  const named = labels.length <= SUMMARY_LABELS ? labels.join(", ") : `${labels.length} labels`;
  $("task-summary").textContent = task ? `${named} · ${task.method} · ${task.backbone}` : "";
  $("task-summary").title = labels.length > SUMMARY_LABELS ? labels.join(", ") : "";
  for (const node of document.querySelectorAll(".pair-only")) node.hidden = !isPairTask(task);
  for (const panel of panels) panel.taskChanged?.(state);
  for (const panel of panels) panel.shown?.(currentTab(), state);
}

function openKeyDialog(why) {
  $("key-why").textContent = why ?? "Sent as X-API-Key with every request; kept for this browser tab only.";
  $("key-input").value = apiKey();
  $("key-dialog").showModal();
  $("key-input").focus();
}

let askedForKey = false;

function wireKey() {
  const updateButton = () => {
    $("key-button").textContent = apiKey() ? "API key ✓" : "API key";
  };
  updateButton();
  $("key-button").addEventListener("click", () => openKeyDialog());
  $("auth-enter").addEventListener("click", () => openKeyDialog());
  $("key-dialog").addEventListener("close", () => {
    const action = $("key-dialog").returnValue;
    if (action === "save" && $("key-input").value.trim()) setApiKey($("key-input").value.trim());
    if (action === "clear") setApiKey("");
    if (action === "save" || action === "clear") {
      $("auth-banner").hidden = true;
      updateButton();
      refreshTasks().catch(() => {});
    }
  });
  window.addEventListener("openbook-auth", ({ detail: error }) => {
    const write = error.method !== "GET";
    const message = !apiKey()
      ? write
        ? "This api takes writes only with a key: without one the console is read-only."
        : "This api answers only with a key."
      : `The api refused the key (${error.status}): ${write ? "the console is read-only without the right key" : "it cannot read"}.`;
    $("auth-message").textContent = message;
    $("auth-banner").hidden = false;
    if (!askedForKey && !apiKey()) {
      askedForKey = true; // ask once; the banner stays to offer it again
      openKeyDialog(message);
    }
  });
}

async function main() {
  wireTabs();
  wireKey();
  $("task-select").addEventListener("change", (event) => selectTask(event.target.value));
  state.caps = await Capabilities.load();
  // A panel that changes the task's examples tells the others, so that none shows a stale copy.
  const examplesChanged = () => panels.forEach((panel) => panel.examplesChanged?.(state));
  for (const panel of panels) panel.init?.(state, { refreshTasks, selectTask, showTab, examplesChanged });
  try {
    await refreshTasks();
  } catch (error) {
    $("task-summary").textContent = `Tasks could not be read: ${error.message}`;
  }
  showTab(state.tasks.length ? location.hash.slice(1) || "try" : "tasks"); // no task yet: the form that makes one
  document.body.dataset.ready = "true"; // the console has loaded its tasks
}

main();
