// The live tab (WS /v1/video/chat/stream): the camera's frames go to the model as they are
// taken (JPEG, a few a second; the server prefills them), and "Ask" puts a question about the
// frames sent since the last one (the server takes up to `num_frames` of them, oldest first).

import { openSocket } from "./api.js";
import { $, setStatus } from "./dom.js";

const MAX_SIDE = 320; // frames are scaled down to this: a tiny model sees no more, and the socket stays light
let live = null;

function line(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("live-log").append(div);
  div.scrollIntoView({ block: "nearest" });
  return div;
}

function count(name, by = 1) {
  const status = $("live-status");
  status.dataset[name] = String(Number(status.dataset[name] || 0) + by);
}

function sendFrame() {
  const video = $("live-camera");
  if (!live || live.ws.readyState !== WebSocket.OPEN || live.paused || !video.videoWidth) return;
  const scale = Math.min(1, MAX_SIDE / Math.max(video.videoWidth, video.videoHeight));
  const canvas = live.canvas;
  canvas.width = Math.round(video.videoWidth * scale);
  canvas.height = Math.round(video.videoHeight * scale);
  canvas.getContext("2d").drawImage(video, 0, 0, canvas.width, canvas.height);
  const image = canvas.toDataURL("image/jpeg", 0.8).split(",", 2)[1];
  live.ws.send(JSON.stringify({ type: "video.frame", image, pts_ms: Math.round(performance.now() - live.started) }));
  count("framesSent");
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
      setStatus("live-status", "live: frames are sent; ask a question");
      $("live-ask").disabled = false;
      break;
    case "video.frames.consumed":
      live.paused = false; // the buffer has room again
      count("framesConsumed", event.frames);
      break;
    case "response.created":
      live.answer = line("assistant", "");
      break;
    case "response.output_text.delta":
    case "response.output_audio_transcript.delta":
      if (live.answer) live.answer.textContent += event.delta;
      break;
    case "response.done":
      count("answers");
      if (live.answer) live.answer.dataset.status = event.response.status;
      live.answer = null;
      $("live-ask").disabled = false;
      setStatus("live-status", event.response.status === "completed" ? "live: ask again" : `answer ${event.response.status}`);
      break;
    case "error":
      // A full buffer drops the frame: wait for a question to take some, instead of sending more.
      if (event.error.code === "frame_buffer_full") live.paused = true;
      else $("live-ask").disabled = false;
      setStatus("live-status", event.error.message, true);
      break;
    default:
  }
}

async function start() {
  const camera = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  $("live-camera").srcObject = camera;
  const ws = openSocket("/v1/video/chat/stream");
  live = { ws, camera, canvas: document.createElement("canvas"), answer: null, paused: false, timer: null,
           started: performance.now() };
  ws.onopen = () => {
    // Text answers: the tab has no audio player; num_frames: the most one question takes.
    ws.send(JSON.stringify({ type: "session.config", modalities: ["text"], num_frames: Number($("live-frames").value) }));
    const fps = Math.max(0.2, Number($("live-fps").value) || 1);
    live.timer = setInterval(sendFrame, 1000 / fps);
  };
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = (e) => stop(e.code === 1000 || e.code === 1005 ? "stopped" : `closed (${e.code} ${e.reason})`.trim(),
    ![1000, 1005].includes(e.code));
}

function stop(message = "stopped", isError = false) {
  if (!live) return;
  const { ws, camera, timer } = live;
  live = null;
  clearInterval(timer);
  camera.getTracks().forEach((t) => t.stop());
  $("live-camera").srcObject = null;
  if (ws.readyState <= WebSocket.OPEN) ws.close();
  $("live-start").disabled = false; $("live-ask").disabled = true; $("live-stop").disabled = true;
  setStatus("live-status", message, isError);
}

$("live-start").addEventListener("click", async () => {
  $("live-start").disabled = true; $("live-stop").disabled = false;
  try {
    await start();
  } catch (e) {
    live = null;
    $("live-start").disabled = false; $("live-stop").disabled = true;
    setStatus("live-status", `camera: ${e.message}`, true);
  }
});

$("live-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!live || live.ws.readyState !== WebSocket.OPEN) return;
  const text = $("live-question").value.trim();
  line("user", text);
  $("live-ask").disabled = true;
  setStatus("live-status", "thinking…");
  live.ws.send(JSON.stringify({ type: "video.query", text }));
});
$("live-stop").addEventListener("click", () => stop());
