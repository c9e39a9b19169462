// The console's only way to the server: the public /v1 API on the page's own origin.

// The api's default request limits (services/api/settings.py). The api does not publish them, so
// the console keeps to the defaults and treats a 413/422 from a stricter server as a stop.
export const LIMITS = Object.freeze({
  maxBatch: 64, // texts per classify request, examples per POST
  maxTextChars: 5000, // characters per text (both halves of a pair together)
  maxBodyBytes: 1_000_000, // bytes per request body
});

// Browsers cannot send integers above 2^53 - 1 exactly in JSON, though the api takes ids to 2^63 - 1.
export const MAX_CLIENT_ID = Number.MAX_SAFE_INTEGER;

const KEY_STORAGE = "openbook.apiKey";

export class ApiError extends Error {
  constructor(status, detail, method, path) {
    super(`${status}: ${formatDetail(detail)}`);
    this.status = status;
    this.detail = detail;
    this.method = method;
    this.path = path;
  }

  get isAuth() {
    return this.status === 401 || this.status === 403;
  }
}

// FastAPI's 422 carries a list of {loc, msg}; every other error a string.
export function formatDetail(detail) {
  if (Array.isArray(detail)) {
    return detail.map((d) => `${(d.loc || []).slice(1).join(".") || "body"}: ${d.msg}`).join("; ");
  }
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

// `path` is always relative to the origin; the key goes with every request, reads included, because
// a read key may be configured as well as a write key. The answer's JSON body (null for a 204).
export async function api(method, path, body) {
  return (await request(method, path, body)).body;
}

// As `api`, with the status too: {status, body}, for a route that answers 202 while it works.
export async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  const key = apiKey();
  if (key) headers["X-API-Key"] = key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new ApiError(0, `the api did not answer (${error.message})`, method, path);
  }
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail ?? detail;
    } catch {
      // not JSON (e.g. a proxy's error page): keep the status text
    }
    const error = new ApiError(response.status, detail, method, path);
    if (error.isAuth) window.dispatchEvent(new CustomEvent("openbook-auth", { detail: error }));
    throw error;
  }
  return { status: response.status, body: response.status === 204 ? null : await response.json() };
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body ?? {});
export const patch = (path, body) => api("PATCH", path, body);
export const del = (path) => api("DELETE", path);

export const taskPath = (task, rest = "") => `/v1/tasks/${encodeURIComponent(task)}${rest}`;

// "GET /v1/tasks/{}/versions": a route with its parameter names blanked, so the console does not
// depend on what the server calls them.
function routeKey(method, path) {
  return `${method.toUpperCase()} ${path.replace(/\{[^}]*\}/g, "{}")}`;
}

// What the api offers, read from its OpenAPI document; panels for routes it lacks stay hidden.
export class Capabilities {
  constructor(openapi) {
    this.routes = new Set();
    for (const [path, operations] of Object.entries(openapi?.paths ?? {})) {
      for (const method of Object.keys(operations)) this.routes.add(routeKey(method, path));
    }
    this.schemas = openapi?.components?.schemas ?? {};
  }

  has(method, path) {
    return this.routes.has(routeKey(method, path));
  }

  // Properties of a request schema (e.g. TaskCreate), to show a form field only when the api takes it.
  properties(schema) {
    return Object.keys(this.schemas[schema]?.properties ?? {});
  }

  // A property's default as the api states it (undefined where it states none), to show what empty means.
  defaultOf(schema, property) {
    return this.schemas[schema]?.properties?.[property]?.default;
  }

  static async load() {
    try {
      return new Capabilities(await get("/openapi.json"));
    } catch {
      return new Capabilities(null); // no OpenAPI document: only the core panels
    }
  }
}

// Prometheus text exposition: [{name, labels, value}] for every sample line.
export function parsePrometheus(text) {
  const samples = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (!raw || raw.startsWith("#")) continue;
    const match = line.exec(raw);
    if (!match) continue;
    const labels = {};
    for (const [, name, value] of (match[2] ?? "").matchAll(label)) {
      labels[name] = value.replace(/\\n/g, "\n").replace(/\\"/g, '"').replace(/\\\\/g, "\\");
    }
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

export async function metrics() {
  const headers = {};
  if (apiKey()) headers["X-API-Key"] = apiKey();
  const response = await fetch("/metrics", { headers });
  if (!response.ok) throw new ApiError(response.status, response.statusText, "GET", "/metrics");
  return parsePrometheus(await response.text());
}
