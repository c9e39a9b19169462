// Try it: classify texts, see why (P_LM, P_kNN, neighbours, demonstrations), and correct a prediction.

import { LIMITS, formatDetail, post, taskPath } from "./api.js";
import { LabelPicker } from "./labelpicker.js";
import { $, el, isPairTask, percent, say, showText, table, textId, textLength } from "./util.js";

const DEMONSTRATIONS_SHOWN = 5; // cards whose demonstrations load at once; the rest load when opened
const PROBABILITY_ROWS = 10; // labels whose probabilities show at once, the most probable (past: folded)
const BUTTON_LABELS = 8; // a correction offers a button per label up to this many, a picker past it
const PAIR_SEPARATOR = /\t|\|\|/; // a tab, or "||" since Tab moves the focus out of a text box

let state;

function parseLines() {
  const pair = isPairTask(state.task);
  const texts = [];
  const problems = [];
  $("try-texts").value.split("\n").forEach((raw, index) => {
    const line = raw.trim();
    if (!line) return;
    const text = pair ? line.split(PAIR_SEPARATOR).map((part) => part.trim()) : line;
    if (pair && (text.length !== 2 || !text[0] || !text[1])) {
      problems.push(`line ${index + 1}: a pair task takes two texts separated by a tab or ||`);
    } else if (textLength(text) > LIMITS.maxTextChars) {
      problems.push(`line ${index + 1}: over ${LIMITS.maxTextChars} characters`);
    } else texts.push(text);
  });
  return { texts, problems };
}

function bar(p, kind, label) {
  const node = el("span", { class: `bar ${kind}`, role: "img", "aria-label": `${label} ${percent(p)}` });
  node.style.setProperty("--p", String(Math.max(0, Math.min(1, p))));
  return el("span", { class: "bar-cell" }, node, el("span", { class: "num" }, percent(p)));
}

function probabilityRow(prediction, label) {
  return el(
    "tr",
    { class: label === prediction.label ? "predicted" : "", dataset: { label } },
    el("th", { scope: "row" }, `${label} `, el("span", { class: "muted" }, state.task.labels[label])),
    el("td", {}, bar(prediction.probabilities[label] ?? 0, "final", `P(${label})`)),
    el("td", {}, bar(prediction.p_lm[label] ?? 0, "lm", `P_LM(${label})`)),
    el("td", {}, prediction.p_knn ? bar(prediction.p_knn[label] ?? 0, "knn", `P_kNN(${label})`) : "—"),
  );
}

// A few labels in the task's order; many, the most probable first, and past PROBABILITY_ROWS folded.
function probabilities(prediction) {
  const headers = ["label", "P", "P_LM", "P_kNN"];
  const labels = Object.keys(state.task.labels);
  if (labels.length <= PROBABILITY_ROWS) {
    return table(headers, labels.map((label) => probabilityRow(prediction, label)), "Probabilities per label");
  }
  const ranked = labels.slice().sort((a, b) => (prediction.probabilities[b] ?? 0) - (prediction.probabilities[a] ?? 0));
  const rest = ranked.slice(PROBABILITY_ROWS);
  const more = el("details", { class: "more-labels" }, el("summary", {}, `The other ${rest.length} labels`));
  more.addEventListener("toggle", () => {
    if (more.open && more.children.length === 1) more.append(table(headers, rest.map((label) => probabilityRow(prediction, label)), "Probabilities of the other labels"));
  });
  return el("div", {}, table(headers, ranked.slice(0, PROBABILITY_ROWS).map((label) => probabilityRow(prediction, label)), `The ${PROBABILITY_ROWS} most probable labels`), more);
}

function neighbours(prediction) {
  const list = prediction.neighbours ?? [];
  const body = list.length
    ? table(
        ["text", "label", "similarity"],
        list.map((n) =>
          el("tr", {}, el("td", {}, showText(n.text)), el("td", {}, n.label), el("td", { class: "num" }, n.similarity.toFixed(3))),
        ),
        "Neighbours that voted",
      )
    : el("p", { class: "muted" }, "The store is empty: the language model alone answered.");
  return el("details", { open: true, class: "neighbours" }, el("summary", {}, `Neighbours that voted (${list.length})`), body);
}

async function loadDemonstrations(text, target) {
  target.replaceChildren(el("p", { class: "muted" }, "Retrieving…"));
  try {
    const answer = await post(taskPath(state.task.name, "/demonstrations"), { text });
    target.replaceChildren(
      ...answer.demonstrations.map((demo) =>
        el(
          "div",
          { class: "demo-class" },
          el("h4", {}, `${demo.label} `, el("span", { class: "muted" }, state.task.labels[demo.label] ?? "")),
          demo.neighbours.length
            ? el("ul", {}, demo.neighbours.map((n) =>
                el("li", {}, showText(n.text), " ", el("span", { class: "muted" }, `sim ${n.similarity.toFixed(3)} · weight ${n.weight.toFixed(2)}`)),
              ))
            : el("p", { class: "muted" }, "no example of this class yet"),
        ),
      ),
    );
  } catch (error) {
    target.replaceChildren(el("p", { class: "status", dataset: { kind: "error" } }, `Not retrieved: ${error.message}`));
  }
}

function demonstrations(text, index) {
  const body = el("div", { class: "demos" });
  const details = el("details", { class: "demonstrations" }, el("summary", {}, "Demonstrations per class"), body);
  let loaded = false;
  const load = () => {
    if (loaded) return;
    loaded = true;
    loadDemonstrations(text, body);
  };
  details.addEventListener("toggle", () => details.open && load());
  // the toggle event loads it; a task of many labels has one list per class: folded, read when opened
  if (index < DEMONSTRATIONS_SHOWN && Object.keys(state.task.labels).length <= PROBABILITY_ROWS) details.open = true;
  return details;
}

// One click turns the prediction into a labelled example; the id comes from the text, so clicking
// again (or retrying after a lost answer) writes nothing twice. A few labels are buttons; more, a
// picker that searches them.
function correction(text, prediction) {
  const status = el("p", { class: "status", role: "status", "aria-live": "polite" });
  const id = textId(text);
  const add = async (label) => {
    say(status, "Adding…");
    try {
      const ack = await post(taskPath(state.task.name, "/examples"), { examples: [{ text, label, id }] });
      const [first] = ack.examples;
      say(status, first.created ? `Added as example #${first.id} (${label}).` : `Already in the book as example #${first.id}.`, "ok");
    } catch (error) {
      const message = error.status === 409
        ? `This text is already in the book with another label: delete example #${id} in Teach to relabel it.`
        : `Not added: ${error.status || ""} ${formatDetail(error.detail)}`;
      say(status, message, "error");
    }
  };
  const labels = Object.entries(state.task.labels);
  if (labels.length > BUTTON_LABELS) {
    const picker = new LabelPicker({ name: `Add “${showText(text)}” as an example of`, placeholder: "type to find the right label", onPick: add });
    picker.setLabels(state.task.labels);
    return el("div", { class: "correct" }, el("label", { for: picker.input.id, class: "muted" }, "Correct it, as an example of:"), picker.node, status);
  }
  const buttons = labels.map(([label, word]) =>
    el(
      "button",
      {
        type: "button",
        class: label === prediction.label ? "secondary" : "",
        "aria-label": `Add this text as an example of ${label} (${word})`,
        onclick: () => add(label),
      },
      `${label} · ${word}`,
    ),
  );
  return el("div", { class: "correct" }, el("span", { class: "muted" }, "Correct it, as an example of:"), el("div", { class: "row" }, buttons), status);
}

// Below the task's min_confidence a prediction abstains: no label, its probabilities kept.
function verdict(prediction) {
  if (prediction.label !== null) {
    return [el("strong", { class: "label" }, prediction.label), " ", el("span", { class: "muted" }, state.task.labels[prediction.label] ?? "")];
  }
  const [best, p] = Object.entries(prediction.probabilities).reduce((top, entry) => (entry[1] > top[1] ? entry : top));
  // The same four decimals for both, so that a guess just under the threshold never reads as equal to it.
  const threshold = state.task.min_confidence;
  const below = threshold === null || threshold === undefined ? "" : ` ${threshold.toFixed(4)}`;
  return [
    el("strong", { class: "label abstained" }, "abstained"),
    " ",
    el("span", { class: "muted" }, `its best guess, ${best} at ${p.toFixed(4)}, is below the threshold${below}`),
  ];
}

function card(text, prediction, index) {
  return el(
    "article",
    { class: "card prediction", "aria-label": `Prediction for: ${showText(text)}` },
    el(
      "header",
      {},
      el("q", {}, showText(text)),
      " → ",
      ...verdict(prediction),
      prediction.truncated ? el("span", { class: "badge warn", title: "the text was cut to fit the prompt length" }, "truncated") : null,
    ),
    el("div", { class: "prediction-body" }, el("div", { class: "scroll-x" }, probabilities(prediction)), correction(text, prediction)),
    el("div", { class: "columns" }, neighbours(prediction), demonstrations(text, index)),
  );
}

async function classify(event) {
  event?.preventDefault();
  const status = $("try-status");
  if (!state.task) {
    say(status, "Create a task first (Tasks).", "error");
    return;
  }
  const { texts, problems } = parseLines();
  if (problems.length) {
    say(status, problems.join("; "), "error");
    return;
  }
  if (!texts.length) {
    say(status, "Type a text to classify.", "error");
    return;
  }
  say(status, `Classifying ${texts.length} text${texts.length > 1 ? "s" : ""}…`);
  const results = $("try-results");
  results.replaceChildren();
  try {
    let versions = null;
    for (let start = 0; start < texts.length; start += LIMITS.maxBatch) {
      const chunk = texts.slice(start, start + LIMITS.maxBatch);
      const answer = await post(taskPath(state.task.name, "/classify"), { texts: chunk, neighbours: true });
      versions = answer;
      answer.predictions.forEach((prediction, i) => results.append(card(chunk[i], prediction, start + i)));
    }
    say(status, "");
    status.replaceChildren(
      "Served by model ",
      el("code", { id: "model-version" }, versions.model_version),
      " on store ",
      el("code", { id: "store-version" }, versions.store_version),
    );
    status.dataset.kind = "ok";
  } catch (error) {
    say(status, `Not classified: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
  }
}

export function init(shared) {
  state = shared;
  $("try-form").addEventListener("submit", classify);
  $("try-texts").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) classify(event);
  });
}

export function taskChanged() {
  $("try-results").replaceChildren();
  say($("try-status"), "");
  $("try-pair-hint").textContent = isPairTask(state.task) ? "(two texts per line, separated by a tab or ||)" : "";
}
