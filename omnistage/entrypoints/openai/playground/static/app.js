// The omnistage playground: plain JS over the public /v1 routes, no build step.
//
// Tabs come from the `routes` GET /v1/models lists. Each tab degrades where the server
// lacks a feature: images ask for a stream of partial images (OpenAI's `stream` +
// `partial_images`) and fall back to one JSON answer when the server refuses or ignores
// them; videos poll their job for `progress`; speech and chat play PCM as it arrives; talk
// streams the microphone over WS /v1/realtime; live sends the camera's frames over
// WS /v1/video/chat/stream and asks about them.

import { KEY_STORE, api } from "./api.js";
import { $ } from "./dom.js";
import "./images.js";
import "./edit.js";
import "./video.js";
import { loadVoices } from "./speech.js";
import "./chat.js";
import "./talk.js";
import "./live.js";

const state = { model: null, stages: [] };
let loads = 0; // the latest loadModel call: an older one's answer (say, before an API key) is dropped

// --- the header: model, stages, queue depth -------------------------------------------

async function loadModel() {
  const banner = $("banner");
  const load = ++loads;
  try {
    const body = await (await api("/v1/models")).json();
    if (load !== loads) return;
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
    buildTabs(liveRoutes(model));
  } catch (e) {
    if (load !== loads) return;
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

// /v1/models lists the routes of the model's capabilities; the video chat route is open to a
// model that sees images and answers in text (its input and output modalities), as the server
// checks on the upgrade.
function liveRoutes(model) {
  const routes = [...(model.routes || [])];
  const io = model.modalities || { input: [], output: [] };
  if (io.input.includes("image") && io.output.includes("text")) routes.push("WS /v1/video/chat/stream");
  return routes;
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
  document.querySelectorAll("[data-needs-route]").forEach((el) => { el.hidden = !routes.includes(el.dataset.needsRoute); });
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
document.addEventListener("omnistage:request-finished", pollQueueDepth);
