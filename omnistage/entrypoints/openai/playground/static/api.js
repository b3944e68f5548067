// HTTP to the server: the API key header, OpenAI error bodies, server-sent events.

export const KEY_STORE = "omnistage.apiKey";

function authHeaders(extra = {}) {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

export class ApiError extends Error {
  constructor(status, message, param) { super(message); this.status = status; this.param = param; }
}

export async function api(path, { json, form, method, signal } = {}) {
  const init = { method: method || (json || form ? "POST" : "GET"), headers: authHeaders(), signal };
  if (json) { init.body = JSON.stringify(json); init.headers["Content-Type"] = "application/json"; }
  if (form) init.body = form;
  const resp = await fetch(path, init);
  if (!resp.ok) throw await apiError(resp);
  return resp;
}

async function apiError(resp) {
  let message = `${resp.status} ${resp.statusText}`, param = null;
  try {
    const body = await resp.json();
    if (body.error) { message = body.error.message || message; param = body.error.param; }
  } catch (_) { /* not an OpenAI error body */ }
  if (resp.status === 401) message += " (type the server's API key at the top)";
  return new ApiError(resp.status, message, param);
}

// A WebSocket to one of the server's routes. A browser cannot set headers on a WebSocket: the
// key goes as a subprotocol, as OpenAI's Realtime API takes it.
export function openSocket(path) {
  const key = localStorage.getItem(KEY_STORE);
  const protocols = key ? ["realtime", `openai-insecure-api-key.${key}`] : ["realtime"];
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return new WebSocket(`${scheme}://${location.host}${path}`, protocols);
}

// Server-sent events from a fetch response: yields {event, data} with `data` parsed as JSON
// (or the raw string, e.g. "[DONE]").
export async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message"; const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue;
      const text = data.join("\n");
      let parsed = text;
      try { parsed = JSON.parse(text); } catch (_) { /* "[DONE]" and the like */ }
      yield { event, data: parsed };
    }
  }
}
