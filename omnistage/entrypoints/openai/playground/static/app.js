// The omnistage playground: plain JS over the public /v1 routes, no build step.
//
// Tabs come from the `routes` GET /v1/models lists. Each tab degrades where the server
// lacks a feature: images ask for a stream of partial images (OpenAI's `stream` +
// `partial_images`) and fall back to one JSON answer when the server refuses or ignores
// them; videos poll their job for `progress`; speech and chat play PCM as it arrives.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "omnistage.apiKey";
const state = { model: null, stages: [], streamImages: true };

// --- HTTP ------------------------------------------------------------------------------

function authHeaders(extra = {}) {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

class ApiError extends Error {
  constructor(status, message, param) { super(message); this.status = status; this.param = param; }
}

async function api(path, { json, form, method, signal } = {}) {
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

// Server-sent events from a fetch response: yields {event, data} with `data` parsed as JSON
// (or the raw string, e.g. "[DONE]").
async function* sseEvents(resp) {
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

function setStatus(id, text, isError = false) {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function numberOrNull(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}

function dropNulls(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== null && v !== ""));
}

function b64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function fileToBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1]);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// --- the header: model, stages, queue depth -------------------------------------------

async function loadModel() {
  const banner = $("banner");
  try {
    const body = await (await api("/v1/models")).json();
    const model = body.data[0];
    state.model = model;
    state.stages = model.stages || [];
    // Paths make long ids: keep their tail, which names the model.
    $("model-id").textContent = model.id.length > 56 ? `…${model.id.slice(-55)}` : model.id;
    $("model-id").title = model.id;
    $("model-stages").textContent = state.stages.length
      ? state.stages.map((s) => `${s.name} (${s.kind} → ${s.output})`).join(" → ")
      : "not listed by this server";
    banner.hidden = true;
    buildTabs(model.routes || []);
  } catch (e) {
    banner.textContent = `Could not load the model: ${e.message}`;
    banner.hidden = false;
  }
}

async function pollQueueDepth() {
  try {
    const text = await (await fetch("/metrics")).text();
    const m = text.match(/^omnistage_queue_depth\s+(\S+)$/m);
    $("queue-depth").textContent = m ? String(Math.round(Number(m[1]))) : "–";
  } catch (_) {
    $("queue-depth").textContent = "–";
  }
}

function buildTabs(routes) {
  const nav = $("tabs");
  nav.replaceChildren();
  const served = [...document.querySelectorAll("section.tab")].filter((s) => routes.includes(s.dataset.route));
  for (const section of served) {
    const button = document.createElement("button");
    button.type = "button";
    button.role = "tab";
    button.id = `tabbtn-${section.id.slice(4)}`;
    button.textContent = section.dataset.title;
    button.onclick = () => showTab(section.id);
    nav.append(button);
  }
  const audioOut = state.stages.some((s) => s.output.split("+").includes("audio"))
    && state.stages.some((s) => s.output.split("+").includes("text"));
  document.querySelectorAll(".audio-only").forEach((el) => { el.hidden = !audioOut; });
  if (!served.length) {
    $("banner").textContent = "This model serves no route the playground knows.";
    $("banner").hidden = false;
    return;
  }
  const wanted = location.hash.slice(1);
  showTab(served.some((s) => s.id === `tab-${wanted}`) ? `tab-${wanted}` : served[0].id);
  if (routes.includes("POST /v1/audio/speech")) loadVoices();
}

function showTab(id) {
  document.querySelectorAll("section.tab").forEach((s) => { s.hidden = s.id !== id; });
  document.querySelectorAll("#tabs button").forEach((b) => {
    b.setAttribute("aria-selected", String(b.id === `tabbtn-${id.slice(4)}`));
  });
  history.replaceState(null, "", `#${id.slice(4)}`);
}

// --- images: generations and edits ----------------------------------------------------

// One gallery slot per requested image; partial images replace the slot's picture until
// the final one arrives.
class Gallery {
  constructor(el, name) { this.el = el; this.name = name; this.slots = []; }

  reset(n) {
    this.el.replaceChildren();
    this.slots = Array.from({ length: n }, (_, i) => {
      const figure = document.createElement("figure");
      figure.className = "pending";
      const img = document.createElement("img");
      img.alt = `${this.name} ${i + 1}`;
      const caption = document.createElement("figcaption");
      caption.textContent = "waiting…";
      figure.append(img, caption);
      this.el.append(figure);
      return { figure, img, caption };
    });
  }

  show(index, b64, format, final, note) {
    const slot = this.slots[Math.min(index, this.slots.length - 1)];
    const url = `data:image/${format};base64,${b64}`;
    slot.img.src = url;
    slot.caption.replaceChildren();
    if (final) {
      slot.figure.className = "done";
      const link = document.createElement("a");
      link.href = url;
      link.download = `${this.name}-${index + 1}.${format}`;
      link.textContent = "Download";
      slot.caption.append(link);
    } else {
      slot.figure.className = "partial";
      slot.figure.dataset.partials = String(Number(slot.figure.dataset.partials || 0) + 1);
      slot.caption.textContent = note;
    }
  }
}

// Runs one images request, streamed when the server can. `send(stream)` makes the request.
async function runImages({ send, gallery, n, progressId, statusId, format }) {
  const progress = $(progressId);
  const started = performance.now();
  const tick = setInterval(() => setStatus(statusId, `working… ${((performance.now() - started) / 1000).toFixed(1)} s`), 200);
  progress.hidden = false;
  progress.removeAttribute("value"); // indeterminate until the server says more
  gallery.reset(n);
  try {
    let resp;
    if (state.streamImages) {
      try {
        resp = await send(true);
      } catch (e) {
        // A server without image streaming refuses the two fields: remember, ask again plainly.
        if (!(e instanceof ApiError && e.status === 400 && /stream|partial_images/.test(`${e.param} ${e.message}`))) throw e;
        state.streamImages = false;
        resp = await send(false);
      }
    } else {
      resp = await send(false);
    }
    let count = 0;
    if ((resp.headers.get("content-type") || "").includes("text/event-stream")) {
      let done = 0;
      for await (const { data } of sseEvents(resp)) {
        if (!data || typeof data !== "object") continue;
        const type = data.type || "";
        if (type === "error" || data.error) throw new Error((data.error && data.error.message) || "the stream failed");
        const index = data.index ?? data.image_index ?? done;
        const fmt = data.output_format || format;
        if (type.endsWith(".partial_image")) {
          const k = (data.partial_image_index ?? 0) + 1;
          gallery.show(index, data.b64_json, fmt, false, `partial image ${k}`);
          if (data.num_partial_images || data.partial_images) {
            progress.max = data.num_partial_images || data.partial_images; progress.value = k;
          }
        } else if (type.endsWith(".completed")) {
          gallery.show(index, data.b64_json, fmt, true);
          done += 1; count += 1;
          progress.max = n; progress.value = done;
        } else if (typeof data.step === "number" && (data.num_steps || data.total_steps)) {
          progress.max = data.num_steps || data.total_steps; progress.value = data.step; // live step progress
        }
      }
    } else {
      const body = await resp.json();
      body.data.forEach((item, i) => gallery.show(i, item.b64_json, body.output_format || format, true));
      count = body.data.length;
    }
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    setStatus(statusId, `${count} image${count === 1 ? "" : "s"} in ${seconds} s${state.streamImages ? "" : " (no live preview on this server)"}`);
  } catch (e) {
    gallery.el.replaceChildren();
    setStatus(statusId, e.message, true);
  } finally {
    clearInterval(tick);
    progress.hidden = true;
    pollQueueDepth();
  }
}

function imageFields(prefix) {
  return dropNulls({
    prompt: $(`${prefix}-prompt`).value,
    negative_prompt: $(`${prefix}-negative`).value.trim() || null,
    size: $(`${prefix}-size`).value.trim() || null,
    num_inference_steps: numberOrNull(`${prefix}-steps`),
    seed: numberOrNull(`${prefix}-seed`),
    n: numberOrNull(`${prefix}-n`) || 1,
  });
}

const imageGallery = new Gallery($("image-gallery"), "image");
$("image-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = $("image-generate");
  button.disabled = true;
  const fields = imageFields("image");
  await runImages({
    send: (stream) => api("/v1/images/generations", {
      json: { ...fields, response_format: "b64_json", ...(stream ? { stream: true, partial_images: 2 } : {}) },
    }),
    gallery: imageGallery, n: fields.n, progressId: "image-progress", statusId: "image-status", format: "png",
  });
  button.disabled = false;
});

// The edit mask: strokes are painted on `paint` (the image's own size); the mask sent is
// OpenAI's, an RGBA image that is transparent where the image may change.
const editState = { image: null, paint: null, painted: false };

function redrawEdit() {
  const canvas = $("edit-canvas");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!editState.image) return;
  ctx.drawImage(editState.image, 0, 0);
  ctx.globalAlpha = 0.55;
  ctx.drawImage(editState.paint, 0, 0);
  ctx.globalAlpha = 1;
}

$("edit-images").addEventListener("change", async () => {
  const file = $("edit-images").files[0];
  editState.image = null;
  if (!file) { redrawEdit(); return; }
  const image = await createImageBitmap(file);
  const canvas = $("edit-canvas");
  canvas.width = image.width; canvas.height = image.height;
  editState.image = image;
  editState.paint = new OffscreenCanvas(image.width, image.height);
  clearMask();
});

function clearMask() {
  if (editState.paint) editState.paint.getContext("2d").clearRect(0, 0, editState.paint.width, editState.paint.height);
  editState.painted = false;
  setStatus("edit-mask-note", "no mask: the whole image may change");
  redrawEdit();
}
$("edit-clear-mask").addEventListener("click", clearMask);

(() => {
  const canvas = $("edit-canvas");
  let drawing = false;
  const paintAt = (event) => {
    if (!drawing || !editState.paint) return;
    const rect = canvas.getBoundingClientRect();
    const x = (event.clientX - rect.left) * (canvas.width / rect.width);
    const y = (event.clientY - rect.top) * (canvas.height / rect.height);
    const radius = Number($("edit-brush").value) * (canvas.width / rect.width) / 2;
    const ctx = editState.paint.getContext("2d");
    ctx.fillStyle = "#00c8ff";
    ctx.beginPath(); ctx.arc(x, y, radius, 0, 2 * Math.PI); ctx.fill();
    editState.painted = true;
    setStatus("edit-mask-note", "mask: only the painted area may change");
    redrawEdit();
  };
  canvas.addEventListener("pointerdown", (e) => { drawing = true; canvas.setPointerCapture(e.pointerId); paintAt(e); });
  canvas.addEventListener("pointermove", paintAt);
  canvas.addEventListener("pointerup", () => { drawing = false; });
})();

async function maskBlob() {
  const { width, height } = editState.paint;
  const mask = new OffscreenCanvas(width, height);
  const ctx = mask.getContext("2d");
  ctx.fillStyle = "#000";
  ctx.fillRect(0, 0, width, height);              // opaque: keep
  ctx.globalCompositeOperation = "destination-out";
  ctx.drawImage(editState.paint, 0, 0);           // transparent where painted: may change
  return mask.convertToBlob({ type: "image/png" });
}

const editGallery = new Gallery($("edit-gallery"), "edit");
$("edit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = $("edit-run");
  button.disabled = true;
  const fields = imageFields("edit");
  const files = [...$("edit-images").files];
  const mask = editState.painted ? await maskBlob() : null;
  const send = (stream) => {
    const form = new FormData();
    files.forEach((f) => form.append(files.length > 1 ? "image[]" : "image", f, f.name));
    if (mask) form.append("mask", mask, "mask.png");
    for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
    form.append("response_format", "b64_json");
    if (stream) { form.append("stream", "true"); form.append("partial_images", "2"); }
    return api("/v1/images/edits", { form });
  };
  await runImages({ send, gallery: editGallery, n: fields.n, progressId: "edit-progress", statusId: "edit-status",
                    format: "png" });
  button.disabled = false;
});

// --- video: an async job, polled for progress -----------------------------------------

const videoState = { id: null, timer: null, url: null };

function videoDone(text, isError = false) {
  clearTimeout(videoState.timer);
  pollQueueDepth();
  videoState.id = null;
  $("video-create").disabled = false;
  $("video-cancel").disabled = true;
  setStatus("video-status", text, isError);
}

async function pollVideo(id) {
  if (videoState.id !== id) return; // cancelled meanwhile
  try {
    const job = await (await api(`/v1/videos/${id}`)).json();
    if (videoState.id !== id) return;
    $("video-progress").value = job.progress || 0;
    if (job.status === "completed") {
      const blob = await (await api(`/v1/videos/${id}/content`)).blob();
      if (videoState.url) URL.revokeObjectURL(videoState.url);
      videoState.url = URL.createObjectURL(blob);
      const player = $("video-player");
      player.src = videoState.url; player.hidden = false;
      $("video-download").href = videoState.url; $("video-download").hidden = false;
      $("video-progress").value = 100;
      videoDone(`completed: ${job.num_frames ?? "?"} frames at ${job.fps ?? "?"} fps`);
    } else if (job.status === "failed") {
      videoDone(`failed: ${job.error ? job.error.message : "unknown error"}`, true);
    } else {
      setStatus("video-status", `${job.status.replace("_", " ")} ${job.progress || 0}%`);
      videoState.timer = setTimeout(() => pollVideo(id), 250);
    }
  } catch (e) {
    videoDone(e.message, true);
  }
}

$("video-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData();
  const fields = dropNulls({
    prompt: $("video-prompt").value, negative_prompt: $("video-negative").value.trim() || null,
    size: $("video-size").value.trim() || null, num_frames: numberOrNull("video-frames"), fps: numberOrNull("video-fps"),
    num_inference_steps: numberOrNull("video-steps"), seed: numberOrNull("video-seed"),
  });
  for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
  $("video-create").disabled = true;
  $("video-progress").value = 0;
  try {
    const job = await (await api("/v1/videos", { form })).json();
    videoState.id = job.id;
    $("video-player").dataset.jobId = job.id;
    $("video-cancel").disabled = false;
    setStatus("video-status", `${job.status} (job ${job.id})`);
    pollVideo(job.id);
  } catch (e) {
    videoDone(e.message, true);
  }
});

$("video-cancel").addEventListener("click", async () => {
  const id = videoState.id;
  if (!id) return;
  videoState.id = null; // stops the polling loop
  try {
    await api(`/v1/videos/${id}`, { method: "DELETE" });
    $("video-progress").value = 0;
    videoDone("cancelled");
  } catch (e) {
    videoDone(`cancel failed: ${e.message}`, true);
  }
});

// --- audio: PCM16 played as it arrives -------------------------------------------------

// Schedules little-endian PCM16 chunks back to back on a Web Audio clock, so playback
// starts with the first chunk, and keeps them to offer the whole clip as a WAV.
class PcmPlayer {
  constructor(sampleRate) {
    this.ctx = new AudioContext();
    this.rate = sampleRate;
    this.next = 0;
    this.firstStart = null;
    this.carry = null;
    this.parts = [];
  }

  push(bytes) {
    if (this.carry) { const j = new Uint8Array(this.carry.length + bytes.length); j.set(this.carry); j.set(bytes, this.carry.length); bytes = j; this.carry = null; }
    if (bytes.length % 2) { this.carry = bytes.slice(-1); bytes = bytes.slice(0, -1); }
    if (!bytes.length) return;
    this.parts.push(bytes);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const n = bytes.length / 2;
    const buffer = this.ctx.createBuffer(1, n, this.rate);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const at = Math.max(this.next, this.ctx.currentTime + 0.05);
    source.start(at);
    if (this.firstStart === null) this.firstStart = at;
    this.next = at + buffer.duration;
  }

  seconds() { return this.parts.reduce((a, p) => a + p.length, 0) / 2 / this.rate; }

  // Seconds of audio already played (by the audio clock); 0 before playback starts.
  played() {
    return this.firstStart === null ? 0 : Math.max(0, this.ctx.currentTime - this.firstStart);
  }

  wav() {
    const length = this.parts.reduce((a, p) => a + p.length, 0);
    const header = new DataView(new ArrayBuffer(44));
    const text = (o, s) => [...s].forEach((c, i) => header.setUint8(o + i, c.charCodeAt(0)));
    text(0, "RIFF"); header.setUint32(4, 36 + length, true); text(8, "WAVE"); text(12, "fmt ");
    header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, this.rate, true); header.setUint32(28, this.rate * 2, true);
    header.setUint16(32, 2, true); header.setUint16(34, 16, true); text(36, "data"); header.setUint32(40, length, true);
    return new Blob([header, ...this.parts], { type: "audio/wav" });
  }
}

// --- speech ----------------------------------------------------------------------------

async function loadVoices() {
  const select = $("speech-voice");
  try {
    const body = await (await api("/v1/audio/voices")).json();
    const keep = select.value;
    select.replaceChildren(new Option("model default", ""));
    for (const v of body.data) select.append(new Option(v.type === "cloned" ? `${v.name} (cloned)` : v.name, v.name));
    select.value = [...select.options].some((o) => o.value === keep) ? keep : "";
  } catch (e) {
    setStatus("voice-status", `voices: ${e.message}`, true);
  }
}

$("speech-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = $("speech-speak");
  const status = $("speech-status");
  button.disabled = true;
  delete status.dataset.firstChunkMs; delete status.dataset.playedAtEndS; delete status.dataset.chunks;
  const started = performance.now();
  setStatus("speech-status", "waiting for the first audio…");
  try {
    const resp = await api("/v1/audio/speech", { json: dropNulls({
      input: $("speech-input").value, voice: $("speech-voice").value || null, response_format: "pcm" }) });
    const player = new PcmPlayer(Number(resp.headers.get("x-sample-rate")) || 24000);
    await player.ctx.resume();
    const reader = resp.body.getReader();
    let chunks = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      player.push(value);
      chunks += 1;
      if (chunks === 1) {
        status.dataset.firstChunkMs = String(Math.round(performance.now() - started));
        setStatus("speech-status", `playing (first audio after ${status.dataset.firstChunkMs} ms)…`);
      }
    }
    // How far playback had got when the last byte came: > 0 means it started mid-stream.
    status.dataset.playedAtEndS = player.played().toFixed(3);
    status.dataset.chunks = String(chunks);
    const audio = $("speech-audio");
    audio.src = URL.createObjectURL(player.wav());
    audio.hidden = false;
    const seconds = player.seconds().toFixed(2);
    setStatus("speech-status", `streamed ${seconds} s of audio in ${chunks} chunks; first audio after `
      + `${status.dataset.firstChunkMs} ms`);
  } catch (e) {
    setStatus("speech-status", e.message, true);
  } finally {
    button.disabled = false;
    pollQueueDepth();
  }
});

$("voice-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData();
  form.append("name", $("voice-name").value);
  form.append("audio_sample", $("voice-file").files[0]);
  if ($("voice-ref-text").value.trim()) form.append("ref_text", $("voice-ref-text").value.trim());
  try {
    const voice = await (await api("/v1/audio/voices", { form })).json();
    await loadVoices();
    $("speech-voice").value = voice.name;
    setStatus("voice-status", `added ${voice.name} (${voice.duration_s} s)`);
  } catch (e) {
    setStatus("voice-status", e.message, true);
  }
});

// --- chat: streamed replies, attachments, spoken replies on omni models ----------------

const chatState = { messages: [], abort: null };

function chatBubble(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.append(body);
  $("chat-log").append(div);
  return div;
}

async function attachmentParts(files) {
  const parts = [];
  for (const file of files) {
    const b64 = await fileToBase64(file);
    if (file.type.startsWith("image/")) {
      parts.push({ type: "image_url", image_url: { url: `data:${file.type};base64,${b64}` } });
    } else {
      const ext = (file.name.split(".").pop() || "wav").toLowerCase();
      parts.push({ type: "input_audio", input_audio: { data: b64, format: ["mp3", "flac", "ogg"].includes(ext) ? ext : "wav" } });
    }
  }
  return parts;
}

$("chat-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = $("chat-input").value;
  const files = [...$("chat-files").files];
  const content = files.length ? [{ type: "text", text }, ...(await attachmentParts(files))] : text;
  const userBubble = chatBubble("user", text);
  if (files.length) userBubble.dataset.attachments = String(files.length);
  chatState.messages.push({ role: "user", content });
  $("chat-input").value = "";
  $("chat-files").value = "";

  const spoken = $("chat-audio").checked && !$("chat-audio").closest("label").hidden;
  const bubble = chatBubble("assistant", "");
  bubble.classList.add("streaming");
  const out = bubble.querySelector(".text");
  chatState.abort = new AbortController();
  $("chat-send").disabled = true; $("chat-stop").disabled = false;
  setStatus("chat-status", "thinking…");
  const started = performance.now();
  let reply = "", player = null, deltas = 0;
  try {
    const body = dropNulls({
      messages: chatState.messages, stream: true, max_tokens: numberOrNull("chat-max-tokens"),
      temperature: numberOrNull("chat-temperature"), seed: numberOrNull("chat-seed"),
      modalities: spoken ? ["text", "audio"] : null,
      audio: spoken ? dropNulls({ voice: $("chat-voice").value.trim() || null, format: "pcm16" }) : null,
    });
    const resp = await api("/v1/chat/completions", { json: body, signal: chatState.abort.signal });
    for await (const { data } of sseEvents(resp)) {
      if (data === "[DONE]") break;
      if (data.error) throw new Error(data.error.message);
      const delta = data.choices && data.choices[0] && data.choices[0].delta;
      if (!delta) continue;
      if (Array.isArray(delta.content)) { // an image model answers with image parts
        for (const part of delta.content) {
          if (part.type !== "image_url") continue;
          const img = document.createElement("img");
          img.src = part.image_url.url;
          bubble.append(img);
        }
        continue;
      }
      const piece = delta.content || (delta.audio && delta.audio.transcript) || "";
      if (piece) { reply += piece; out.textContent = reply; deltas += 1; }
      if (delta.audio && delta.audio.data) {
        if (!player) { player = new PcmPlayer(24000); await player.ctx.resume(); }
        player.push(b64ToBytes(delta.audio.data));
      }
      $("chat-log").scrollTop = $("chat-log").scrollHeight;
    }
    bubble.dataset.deltas = String(deltas);
    if (player) {
      const audio = document.createElement("audio");
      audio.controls = true;
      audio.src = URL.createObjectURL(player.wav());
      bubble.append(audio);
    }
    setStatus("chat-status", `${deltas} pieces in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  } catch (e) {
    if (e.name === "AbortError") setStatus("chat-status", "stopped");
    else { setStatus("chat-status", e.message, true); bubble.classList.add("error"); }
  } finally {
    bubble.classList.remove("streaming");
    bubble.classList.add("done");
    if (reply) chatState.messages.push({ role: "assistant", content: reply });
    chatState.abort = null;
    $("chat-send").disabled = false; $("chat-stop").disabled = true;
    pollQueueDepth();
  }
});

$("chat-stop").addEventListener("click", () => chatState.abort && chatState.abort.abort());
$("chat-clear").addEventListener("click", () => {
  chatState.messages = [];
  $("chat-log").replaceChildren();
  setStatus("chat-status", "");
});

// --- start -----------------------------------------------------------------------------

$("api-key").value = localStorage.getItem(KEY_STORE) || "";
$("api-key").addEventListener("change", () => {
  const key = $("api-key").value.trim();
  if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
  loadModel();
});
loadModel();
pollQueueDepth();
setInterval(pollQueueDepth, 1000);
