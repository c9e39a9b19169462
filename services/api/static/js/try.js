// Try it: classify texts, see why (P_LM, P_kNN, neighbours, demonstrations), and correct a prediction.

import { LIMITS, del, formatDetail, post, taskPath } from "./api.js";
import { LabelPicker } from "./labelpicker.js";
import { $, el, isPairTask, labelName, percent, say, showText, table, textId, textLength, toast, wordSaysMore } from "./util.js";

const DEMONSTRATIONS_SHOWN = 5; // cards whose demonstrations load at once; the rest load when opened
const PROBABILITY_ROWS = 10; // labels whose probabilities show at once, the most probable (past: folded)
const BUTTON_LABELS = 8; // a correction offers a button per label up to this many, a picker past it
const DEMO_CLASSES = 3; // past PROBABILITY_ROWS labels, the demonstrations of the most probable few (the rest: folded)
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
    el("th", { scope: "row" }, labelName(label, state.task.labels[label])),
    el("td", {}, bar(prediction.probabilities[label] ?? 0, "final", `P(${label})`)),
    el("td", {}, bar(prediction.p_lm[label] ?? 0, "lm", `P_LM(${label})`)),
    el("td", {}, prediction.p_knn ? bar(prediction.p_knn[label] ?? 0, "knn", `P_kNN(${label})`) : "—"),
  );
}

// The two readers: the prompt's P_LM, and P_kNN from the neighbours, in the task's sentence reader's space
// where it names one (its folder's last part for a path), else in the prompt's slot vectors'.
const readerName = () => state.task.reader?.split("/").filter(Boolean).pop();
const knnHeader = () => (state.task.reader ? `P_kNN (${readerName()})` : "P_kNN");

// A few labels in the task's order; many, the most probable first, and past PROBABILITY_ROWS folded.
function probabilities(prediction) {
  const headers = ["label", "P", "P_LM (prompt)", knnHeader()];
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

// The neighbours' similarity is the kNN's: with `similarity: centred` (the default), the cosine after the
// store's mean key is taken away; the demonstrations' is the plain cosine, on another scale.
const neighbourScale = () => (state.task.knn?.similarity === "cosine" ? "cosine" : "centred cosine");

function neighbours(prediction) {
  const list = prediction.neighbours ?? [];
  const body = list.length
    ? table(
        ["text", "label", neighbourScale()], // the similarity, named by its scale
        list.map((n) =>
          el("tr", {}, el("td", {}, showText(n.text)), el("td", {}, labelName(n.label, state.task.labels[n.label])), el("td", { class: "num" }, n.similarity.toFixed(3))),
        ),
        "Neighbours that voted",
      )
    : el("p", { class: "muted" }, "The store is empty: the language model alone answered.");
  const space = state.task.reader ? `, read by ${readerName()}` : "";
  return el("details", { open: true, class: "neighbours" }, el("summary", {}, `Neighbours that voted (${list.length})${space}`), body);
}

function demoClass(demo) {
  return el(
    "div",
    { class: "demo-class", dataset: { label: demo.label } },
    el("h4", {}, labelName(demo.label, state.task.labels[demo.label])),
    demo.neighbours.length
      ? el("ul", {}, demo.neighbours.map((n) =>
          el("li", {}, showText(n.text), " ", el("span", { class: "muted" }, `cosine ${n.similarity.toFixed(3)} · weight ${n.weight.toFixed(2)}`)),
        ))
      : el("p", { class: "muted" }, "no example of this class yet"),
  );
}

// A few labels: every class. Many: the classes the prediction found most probable, the rest folded.
async function loadDemonstrations(text, prediction, body, summary) {
  body.replaceChildren(el("p", { class: "muted" }, "Retrieving…"));
  try {
    const answer = await post(taskPath(state.task.name, "/demonstrations"), { text });
    summary.textContent = answer.read_by_model
      ? "Demonstrations the model read, per class"
      : "Nearest examples per class (this model reads no demonstrations)";
    const scale = neighbourScale() === "cosine"
      ? null
      : el("p", { class: "muted demo-scale" }, "Plain cosine of the examples' vectors: a scale of its own, not the neighbours' centred one.");
    const all = answer.demonstrations;
    if (all.length <= PROBABILITY_ROWS) {
      body.replaceChildren(...all.map(demoClass), scale ?? "");
      return;
    }
    const p = (demo) => prediction.probabilities[demo.label] ?? 0;
    const ranked = all.slice().sort((a, b) => p(b) - p(a));
    const rest = ranked.slice(DEMO_CLASSES);
    const more = el("details", { class: "more-demos" }, el("summary", {}, `The other ${rest.length} classes`));
    more.addEventListener("toggle", () => {
      if (more.open && more.children.length === 1) more.append(...rest.map(demoClass));
    });
    body.replaceChildren(
      el("p", { class: "muted" }, `The ${DEMO_CLASSES} classes this prediction found most probable:`),
      ...ranked.slice(0, DEMO_CLASSES).map(demoClass),
      scale ?? "",
      more,
    );
  } catch (error) {
    body.replaceChildren(el("p", { class: "status", dataset: { kind: "error" } }, `Not retrieved: ${error.message}`));
  }
}

function demonstrations(text, prediction, index) {
  const body = el("div", { class: "demos" });
  const summary = el("summary", {}, "Demonstrations per class");
  const details = el("details", { class: "demonstrations" }, summary, body);
  let loaded = false;
  const load = () => {
    if (loaded) return;
    loaded = true;
    loadDemonstrations(text, prediction, body, summary);
  };
  details.addEventListener("toggle", () => details.open && load());
  if (index < DEMONSTRATIONS_SHOWN) details.open = true; // the toggle event loads it
  return details;
}

// One click turns the prediction into a labelled example; the id comes from the text, so clicking
// again (or retrying after a lost answer) writes nothing twice. A few labels are buttons; more, a
// picker that searches them. An example it creates can be taken back: Undo deletes it.
function correction(text, prediction) {
  const status = el("p", { class: "status", role: "status", "aria-live": "polite" });
  const id = textId(text);
  const task = state.task.name;
  const undo = async (label) => {
    try {
      await del(taskPath(task, `/examples/${id}`));
      say(status, `Undone: example #${id} (${label}) deleted.`, "ok");
    } catch (error) {
      say(status, `Not undone: ${error.status || ""} ${formatDetail(error.detail)}`, "error");
    }
  };
  const add = async (label) => {
    say(status, "Adding…");
    try {
      const ack = await post(taskPath(task, "/examples"), { examples: [{ text, label, id }] });
      const [first] = ack.examples;
      if (!first.created) {
        say(status, `Already in the book as example #${first.id}.`, "ok");
        return;
      }
      const added = `Added as example #${first.id} (${label}).`;
      status.replaceChildren(added, " ", el("button", { type: "button", class: "secondary small", onclick: () => undo(label) }, "Undo"));
      status.dataset.kind = "ok";
      toast(`“${showText(text).slice(0, 60)}” ${added}`, { label: "Undo", run: () => undo(label) });
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
      wordSaysMore(label, word) ? `${label} · ${word}` : label,
    ),
  );
  return el("div", { class: "correct" }, el("span", { class: "muted" }, "Correct it, as an example of:"), el("div", { class: "row" }, buttons), status);
}

// Below the task's min_confidence a prediction abstains: no label, its probabilities kept. Out of scope
// (its nearest example less similar than the version's threshold), it is refused where the task says so.
function verdict(prediction) {
  const [best, p] = Object.entries(prediction.probabilities).reduce((top, entry) => (entry[1] > top[1] ? entry : top));
  if (prediction.label === null && prediction.out_of_scope && state.task.refuse_out_of_scope) {
    return [
      el("strong", { class: "label abstained" }, "out of scope"),
      " ",
      el("span", { class: "muted" }, `no stored example is near it; its best guess was ${best} at ${p.toFixed(4)}`),
    ];
  }
  if (prediction.label !== null) {
    const word = state.task.labels[prediction.label];
    return [
      el("strong", { class: "label", title: prediction.label }, prediction.label),
      wordSaysMore(prediction.label, word) ? el("span", { class: "muted" }, ` ${word}`) : "",
    ];
  }
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
      prediction.out_of_scope && prediction.label !== null
        ? el("span", { class: "badge warn", title: "no stored example is as near as the version's threshold" }, "out of scope?")
        : null,
    ),
    el("div", { class: "prediction-body" }, el("div", { class: "scroll-x" }, probabilities(prediction)), correction(text, prediction)),
    el("div", { class: "columns" }, neighbours(prediction), demonstrations(text, prediction, index)),
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
