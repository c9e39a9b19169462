// Reading and checking an upload of labelled examples before anything is sent.

import { LIMITS, MAX_CLIENT_ID } from "./api.js";
import { textId, textLength } from "./util.js";

// RFC 4180 CSV (quoted fields, "" inside quotes, newlines inside quotes), with the delimiter given.
// Returns records as {line, cells}, `line` being where the record starts (1-based).
export function parseDelimited(content, delimiter = ",") {
  const records = [];
  let cells = [];
  let cell = "";
  let quoted = false;
  let line = 1;
  let start = 1;
  for (let i = 0; i < content.length; i++) {
    const c = content[i];
    if (quoted) {
      if (c === '"' && content[i + 1] === '"') {
        cell += '"';
        i++;
      } else if (c === '"') quoted = false;
      else {
        if (c === "\n") line++;
        cell += c;
      }
    } else if (c === '"' && cell === "") quoted = true;
    else if (c === delimiter) {
      cells.push(cell);
      cell = "";
    } else if (c === "\n" || c === "\r") {
      if (c === "\r" && content[i + 1] === "\n") i++;
      cells.push(cell);
      records.push({ line: start, cells });
      cells = [];
      cell = "";
      start = ++line;
    } else cell += c;
  }
  if (quoted) throw new Error(`line ${start}: a quoted field is not closed`);
  if (cell !== "" || cells.length) records.push({ line: start, cells: [...cells, cell] });
  return records.filter((r) => !(r.cells.length === 1 && r.cells[0] === "")); // blank lines
}

const TEXT_COLUMNS = ["text", "sentence"];

function fromTable(content) {
  const firstLine = content.slice(0, content.search(/\r?\n|$/));
  const delimiter = firstLine.includes("\t") && !firstLine.includes(",") ? "\t" : ",";
  const [header, ...records] = parseDelimited(content, delimiter);
  if (!header) throw new Error("the file is empty");
  const names = header.cells.map((name) => name.trim().toLowerCase());
  const column = (...candidates) => names.findIndex((name) => candidates.includes(name));
  const [text, textA, textB, label, id] = [
    column(...TEXT_COLUMNS),
    column("text_a"),
    column("text_b"),
    column("label"),
    column("id"),
  ];
  if (label < 0 || (text < 0 && (textA < 0 || textB < 0))) {
    throw new Error(`the first line must name the columns text (or text_a and text_b), label and optionally id; it has: ${names.join(", ")}`);
  }
  return records.map(({ line, cells }) => ({
    line,
    text: text >= 0 ? cells[text] ?? "" : [cells[textA] ?? "", cells[textB] ?? ""],
    label: cells[label] ?? "",
    id: id >= 0 && (cells[id] ?? "").trim() !== "" ? cells[id].trim() : undefined,
  }));
}

function fromJsonLines(content) {
  const rows = [];
  content.split(/\r?\n/).forEach((raw, index) => {
    if (!raw.trim()) return;
    const line = index + 1;
    let value;
    try {
      value = JSON.parse(raw);
    } catch (error) {
      rows.push({ line, text: "", label: "", error: `not a JSON line (${error.message})` });
      return;
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      rows.push({ line, text: "", label: "", error: "not a JSON object" });
      return;
    }
    const text = value.text ?? (value.text_a !== undefined ? [value.text_a, value.text_b] : value.sentence);
    rows.push({ line, text: text ?? "", label: value.label ?? "", id: value.id ?? undefined });
  });
  return rows;
}

// A JSON array of objects: rows numbered by their place in the array.
function fromJsonArray(content) {
  let values;
  try {
    values = JSON.parse(content);
  } catch (error) {
    throw new Error(`not JSON (${error.message})`);
  }
  return fromJsonLines(values.map((value) => JSON.stringify(value)).join("\n"));
}

// Rows of a file as {line, text, label, id}; a row that cannot be read carries `error`.
export function readRows(name, content) {
  content = content.replace(/^\uFEFF/, "");
  if (content.trimStart().startsWith("[")) return fromJsonArray(content);
  const jsonLines = /\.(jsonl|ndjson|json)$/i.test(name) || content.trimStart().startsWith("{");
  return jsonLines ? fromJsonLines(content) : fromTable(content);
}

function checkText(text, pair) {
  if (pair !== Array.isArray(text)) {
    return pair ? "this task takes pairs: columns text_a and text_b" : "this task takes single texts";
  }
  const parts = pair ? text : [text];
  if (parts.some((part) => typeof part !== "string")) return "the text is not a string";
  if (parts.some((part) => part.trim() === "")) return "empty text";
  const length = textLength(text);
  if (length > LIMITS.maxTextChars) {
    return `text of ${length} characters is over the limit of ${LIMITS.maxTextChars}`;
  }
  return null;
}

function checkId(id) {
  if (id === undefined || id === null) return [undefined, null];
  const number = typeof id === "number" ? id : /^\d+$/.test(String(id)) ? Number(id) : NaN;
  if (!Number.isInteger(number) || number < 0) return [undefined, `id ${JSON.stringify(id)} is not a whole number ≥ 0`];
  if (number > MAX_CLIENT_ID) return [undefined, `id ${id} is over ${MAX_CLIENT_ID}, the largest the console sends exactly`];
  return [number, null];
}

// Every row checked against the task: the examples to send, the rows with errors (in file order), and,
// with `createLabels`, the labels the rows name that the task lacks (the api creates them, and says
// which names it cannot make a word of). A row without an id gets one from its text, so uploading the
// same file twice adds nothing twice.
export function checkRows(rows, task, pair, createLabels = false) {
  const labels = Object.keys(task.labels);
  const seen = new Map(); // id -> the line that has it
  const checked = rows.map((row) => {
    const label = typeof row.label === "number" ? String(row.label) : row.label;
    const [given, idError] = checkId(row.id);
    let error = row.error ?? checkText(row.text, pair) ?? idError;
    if (!error && typeof label !== "string") error = "the label is not a string";
    else if (!error && createLabels && label.trim() === "") error = "empty label";
    else if (!error && !createLabels && !labels.includes(label)) {
      error = `unknown label ${JSON.stringify(label)}; labels: ${labels.join(", ")}`;
    }
    const id = error ? given : given ?? textId(row.text);
    if (!error && seen.has(id)) {
      error = given === undefined ? `the same text as line ${seen.get(id)}` : `duplicate id ${id} (also on line ${seen.get(id)})`;
    }
    if (!error) seen.set(id, row.line);
    return { line: row.line, text: row.text, label, id, error };
  });
  const examples = checked.filter((r) => !r.error).map(({ text, label, id }) => ({ text, label, id }));
  return {
    examples,
    rows: checked,
    errors: checked.filter((r) => r.error),
    newLabels: [...new Set(examples.map((e) => e.label).filter((label) => !labels.includes(label)))],
  };
}

// Batches within the api's limits: at most maxBatch examples and a body well under maxBodyBytes.
export function batches(examples) {
  const budget = LIMITS.maxBodyBytes * 0.9;
  const encoder = new TextEncoder();
  const out = [];
  let current = [];
  let bytes = 0;
  for (const example of examples) {
    const size = encoder.encode(JSON.stringify(example)).length + 1;
    if (current.length && (current.length >= LIMITS.maxBatch || bytes + size > budget)) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(example);
    bytes += size;
  }
  if (current.length) out.push(current);
  return out;
}
