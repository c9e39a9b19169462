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
