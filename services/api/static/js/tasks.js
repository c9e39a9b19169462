// Tasks: the list, one task's spec, creating one (with its prompt previewed) and deleting one.

import { del, formatDetail, post, taskPath } from "./api.js";
import { $, el, labelText, say } from "./util.js";

let actions;
let state;
// Whether the api's TaskCreate schema has automatic training settings (`training: {auto, every}`).
let canAutoTrain = false;

function labelRow(label = "", word = "") {
  const index = $("label-rows").children.length + 1;
  const row = el(
    "div",
    { class: "row label-row" },
    el("label", { for: `label-${index}` }, "Label"),
    el("input", { id: `label-${index}`, class: "label-name", value: label, required: true, size: 8 }),
    el("label", { for: `word-${index}` }, "word"),
    el("input", { id: `word-${index}`, class: "label-word", value: word, required: true, size: 12 }),
    el("button", { type: "button", class: "secondary", "aria-label": `Remove label ${index}`, onclick: () => {
      row.remove();
      preview();
    } }, "✕"),
  );
  row.addEventListener("input", preview);
  $("label-rows").append(row);
}

function labelsFromForm() {
  const labels = {};
  for (const row of document.querySelectorAll(".label-row")) {
    const name = row.querySelector(".label-name").value.trim();
    if (name) labels[name] = row.querySelector(".label-word").value.trim();
  }
  return labels;
}

// The prompt as the backbone will see it: {text} (or {text_a}/{text_b}) filled in, the slot marked.
function preview() {
  const template = $("new-template").value;
  const pair = template.includes("{text_a}");
  $("preview-text-b").hidden = !pair;
  const sample = $("preview-text").value;
  const filled = pair
    ? template.replaceAll("{text_a}", sample).replaceAll("{text_b}", $("preview-text-b").value)
    : template.replaceAll("{text}", sample);
  const words = Object.values(labelsFromForm()).filter(Boolean);
  const [before, ...after] = filled.split("{mask}");
  $("template-preview").replaceChildren(before, ...(after.length ? [el("mark", { title: "the mask: where the label word goes" }, `[${words.join(" | ") || "label word"}]`), after.join("{mask}")] : []));
  const problems = [];
  if (!template.includes("{mask}")) problems.push("The template needs one {mask}.");
  if (!pair && !template.includes("{text}")) problems.push("The template needs {text} (or {text_a} and {text_b}).");
  const note = problems.length
    ? problems.join(" ")
    : `The mask is where the label word goes: the backbone scores ${words.map((w) => `“${w}”`).join(", ") || "each label's word"} there.` +
      (template.trimEnd().endsWith("{mask}") ? "" : " A causal backbone (the default) needs the template to end at {mask}.");
  $("template-note").textContent = note;
  $("template-note").dataset.kind = problems.length ? "error" : "";
}

function renderList() {
  const list = $("task-list");
  list.replaceChildren(
    ...state.tasks.map((task) =>
      el(
        "li",
        {},
        el("button", {
          type: "button",
          class: task.name === state.task?.name ? "link current" : "link",
          "aria-current": task.name === state.task?.name ? "true" : undefined,
          onclick: () => actions.selectTask(task.name),
        }, task.name),
      ),
    ),
  );
  if (!state.tasks.length) list.append(el("li", { class: "muted" }, "No tasks yet: create one."));
  const task = state.task;
  $("task-delete").hidden = !task;
  $("task-spec").replaceChildren(
    ...(task
      ? [
          el("dl", { class: "spec" },
            el("dt", {}, "Template"), el("dd", {}, el("pre", {}, task.template)),
            el("dt", {}, "Labels"), el("dd", {}, Object.entries(task.labels).map(([l, w]) => labelText(l, w)).join(", ")),
            el("dt", {}, "Backbone"), el("dd", {}, task.backbone),
            el("dt", {}, "Method"), el("dd", {}, task.method),
            el("dt", {}, "Second reader"), el("dd", {}, task.reader ?? "none: the prompt's slot vectors key the examples"),
            el("dt", {}, "kNN"), el("dd", {}, `k=${task.knn.k}, T=${task.knn.temperature}, λ=${task.knn.lam ?? "chosen on the examples"}`),
          ),
        ]
      : []),
  );
}

async function create(event) {
  event.preventDefault();
  const status = $("create-status");
  const body = {
    name: $("new-name").value.trim(),
    template: $("new-template").value,
    labels: labelsFromForm(),
  };
  if ($("new-method").value.trim()) body.method = $("new-method").value.trim();
  if ($("new-backbone").value.trim()) body.backbone = $("new-backbone").value.trim();
  if ($("new-reader").value.trim()) body.reader = $("new-reader").value.trim();
  if (canAutoTrain) {
    body.training = { auto: $("new-auto").checked };
    if ($("new-every").value) body.training.every = Number($("new-every").value);
  }
  if (Object.keys(body.labels).length < 2) {
    say(status, "A task needs at least two labels.", "error");
    return;
  }
  say(status, `Creating ${body.name} (loading its backbone)…`);
  try {
    await post("/v1/tasks", body);
    say(status, `Created ${body.name}.`, "ok");
    $("new-name").value = "";
    await actions.refreshTasks(body.name);
    actions.showTab("try");
  } catch (error) {
    say(status, `Not created: ${error.status ? `${error.status} ` : ""}${formatDetail(error.detail)}`, "error");
  }
}

async function remove() {
  const task = state.task;
  if (!task) return;
  const status = $("task-delete-status");
  if (!window.confirm(`Delete the task “${task.name}” with all its examples and versions? This cannot be undone.`)) return;
  try {
    await del(taskPath(task.name));
    say(status, `Deleted ${task.name}.`, "ok");
    await actions.refreshTasks();
  } catch (error) {
    say(status, `Not deleted: ${error.status} ${formatDetail(error.detail)}`, "error");
  }
}

export function init(shared, wired) {
  state = shared;
  actions = wired;
  labelRow("0", "negative");
  labelRow("1", "positive");
  $("add-label-row").addEventListener("click", () => labelRow());
  for (const id of ["new-template", "preview-text", "preview-text-b"]) $(id).addEventListener("input", preview);
  $("create-form").addEventListener("submit", create);
  $("task-delete").addEventListener("click", remove);
  canAutoTrain = state.caps.properties("TaskCreate").includes("training");
  $("auto-train").hidden = !canAutoTrain;
  // the api's defaults, shown: empty fields take them
  $("new-method").placeholder = state.caps.defaultOf("TaskCreate", "method") ?? "";
  $("new-auto").checked = state.caps.defaultOf("TrainingSettings", "auto") ?? true;
  $("new-every").placeholder = state.caps.defaultOf("TrainingSettings", "every") ?? "";
  preview();
}

export function taskChanged() {
  renderList();
}
