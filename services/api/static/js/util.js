// DOM and text helpers shared by the panels. Text from the api is always set as text, never as HTML.

export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  node.append(...children.flat().filter((c) => c !== undefined && c !== null && c !== false));
  return node;
}

export const $ = (id) => document.getElementById(id);

// A status line: `kind` is "ok", "error" or "" (progress).
export function say(node, message, kind = "") {
  node.textContent = message;
  node.dataset.kind = kind;
}

export function table(headers, rows, caption) {
  return el(
    "table",
    {},
    caption ? el("caption", { class: "visually-hidden" }, caption) : null,
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows),
  );
}

export const percent = (p) => `${(100 * p).toFixed(1)}%`;

// Pair tasks ({text_a} and {text_b}) take [a, b]; the console shows them joined by a bar.
export const isPairTask = (task) => /\{text_a\}/.test(task?.template ?? "");
export const showText = (text) => (Array.isArray(text) ? text.join(" ‖ ") : String(text ?? "—"));

// 64-bit FNV-1a over the UTF-8 bytes, cut to 53 bits: the same text always gets the same example id
// (so a retried POST is a no-op), and any id fits a JSON number exactly.
export function textId(text) {
  const parts = Array.isArray(text) ? text : [text];
  const bytes = new TextEncoder().encode(parts.join("\u0000"));
  let hash = 0xcbf29ce484222325n;
  for (const byte of bytes) {
    hash ^= BigInt(byte);
    hash = (hash * 0x100000001b3n) & 0xffffffffffffffffn;
  }
  return Number(hash & 0x1fffffffffffffn);
}

// In code points, as the api counts (a JS string's length counts UTF-16 units).
export function textLength(text) {
  return (Array.isArray(text) ? text : [text]).reduce((n, part) => n + [...part].length, 0);
}

export function formatTime(value) {
  if (value === undefined || value === null || value === "") return "—";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
}

// A label's word is worth showing only where it says more than the name: "book flight" does not beside
// book_flight, nor "no" beside no (the api makes a name's word by splitting it at _, - and capitals).
const squashed = (name) => String(name).toLowerCase().replace(/[\s_-]+/g, "");
export const wordSaysMore = (label, word) => Boolean(word) && squashed(word) !== squashed(label);

// A label as the console shows it: the name, cut with an ellipsis when long (the whole name, and its word,
// on hover), and its word beside it when the word says more.
export function labelName(label, word) {
  const more = wordSaysMore(label, word);
  return el(
    "span",
    { class: "label-name", title: more ? `${label} · ${word}` : label },
    el("span", { class: "label-text" }, label),
    more ? el("span", { class: "muted label-word" }, ` ${word}`) : null,
  );
}

export const labelText = (label, word) => (wordSaysMore(label, word) ? `${label} (${word})` : label);

// A version's dev accuracy as served, store and kNN interpolation included: the figure the promotion gate
// compared (`gate.candidate`). Versions saved without a gate record fall back on what training measured
// of the same prediction (`accuracy_with_knn`), and a method that serves the LM alone on its `accuracy`.
export function servedAccuracy(gate, devMetrics) {
  if (typeof gate?.candidate === "number") return gate.candidate;
  if (typeof devMetrics?.accuracy_with_knn === "number") return devMetrics.accuracy_with_knn;
  return typeof devMetrics?.accuracy === "number" ? devMetrics.accuracy : null;
}

// One calibration error per version: that of the confidence as it is served. Served scaled (a temperature
// other than 1), the error measured with temperatures fitted on other folds; unscaled, the error as scored.
export const servesScaled = (calibration) => typeof calibration?.temperature === "number" && calibration.temperature !== 1;
export function servedEce(calibration) {
  if (!calibration) return null;
  return servesScaled(calibration) ? calibration.ece_after : calibration.ece_before;
}

export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
}

// A bar: `fraction` from 0 to 1, or null for work whose share done is not known (it moves all the same).
export function progressBar(fraction, label) {
  const bar = el("progress", { max: 1, "aria-label": label });
  if (fraction !== null && fraction !== undefined) bar.value = fraction;
  return bar;
}

// A message at the foot of the window for a few seconds, with one action (an Undo): `action` is
// {label, run}; the toast closes when it is taken. One toast at a time: a new one replaces the last.
export function toast(message, action, ms = 10000) {
  document.querySelector(".toast")?.remove();
  const node = el("div", { class: "toast", role: "status", "aria-live": "polite" }, el("span", {}, message));
  if (action) {
    node.append(
      el("button", {
        type: "button",
        class: "secondary small",
        onclick: () => {
          node.remove();
          action.run();
        },
      }, action.label),
    );
  }
  node.append(el("button", { type: "button", class: "link", "aria-label": "Close", onclick: () => node.remove() }, "✕"));
  document.body.append(node);
  setTimeout(() => node.remove(), ms);
  return node;
}
