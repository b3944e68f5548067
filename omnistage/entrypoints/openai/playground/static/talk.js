// The talk tab (WS /v1/realtime): the microphone streamed to the model in OpenAI's Realtime
// protocol; the server's VAD finds the end of each turn, and the spoken answer plays as it
// arrives. Talking over an answer stops it (the server cancels it: barge-in).

import { openSocket } from "./api.js";
import { PcmPlayer } from "./audio.js";
import { $, b64ToBytes, setStatus } from "./dom.js";

const RATE = 24000; // the protocol's pcm16 rate, in and out
let talk = null;

function line(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("talk-log").append(div);
  div.scrollIntoView({ block: "nearest" });
  return div;
}

function pcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i++) view.setInt16(2 * i, Math.max(-1, Math.min(1, samples[i])) * 32767, true);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

function onEvent(event) {
  const status = $("talk-status");
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      if (talk.player) { talk.player.ctx.close(); talk.player = null; } // barge-in: stop the answer now
      setStatus("talk-status", "listening…");
      break;
    case "input_audio_buffer.speech_stopped":
      setStatus("talk-status", "thinking…");
      break;
    case "response.created":
      talk.player = new PcmPlayer(RATE);
      talk.answer = line("assistant", "");
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (talk.answer) talk.answer.textContent += event.delta;
      break;
    case "response.output_audio.delta": {
      const bytes = b64ToBytes(event.delta);
      if (talk.player) talk.player.push(bytes);
      status.dataset.audioBytes = String(Number(status.dataset.audioBytes || 0) + bytes.length);
      setStatus("talk-status", "speaking…");
      break;
    }
    case "response.done":
      status.dataset.turns = String(Number(status.dataset.turns || 0) + 1);
      if (talk.answer) talk.answer.dataset.status = event.response.status;
      setStatus("talk-status", event.response.status === "completed" ? "your turn" : `answer ${event.response.status}`);
      break;
    case "error":
      setStatus("talk-status", event.error.message, true);
      break;
    default:
  }
}

async function start() {
  const mic = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  const ws = openSocket("/v1/realtime");
  const ctx = new AudioContext({ sampleRate: RATE }); // the browser resamples the microphone to 24 kHz
  const source = ctx.createMediaStreamSource(mic);
  // ScriptProcessor, not an AudioWorklet: no second module to serve, and 4096 frames (170 ms) a
  // message is plenty for turn-based talk. It runs only while connected to the destination.
  const node = ctx.createScriptProcessor(4096, 1, 1);
  node.onaudioprocess = (e) => {
    if (ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: pcm16Base64(e.inputBuffer.getChannelData(0)) }));
    }
  };
  talk = { ws, mic, ctx, player: null, answer: null };
  ws.onopen = () => {
    const voice = $("talk-voice").value.trim();
    ws.send(JSON.stringify({ type: "session.update", session: {
      type: "realtime", instructions: $("talk-instructions").value.trim() || undefined,
      output_modalities: ["audio"],
      audio: { input: { turn_detection: { type: "server_vad" } }, output: voice ? { voice } : {} } } }));
    source.connect(node);
    node.connect(ctx.destination);
    setStatus("talk-status", "connected: say something");
  };
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = (e) => stop(e.code === 1000 || e.code === 1005 ? "stopped" : `closed (${e.code} ${e.reason})`.trim(),
    ![1000, 1005].includes(e.code));
}

function stop(message = "stopped", isError = false) {
  if (!talk) return;
  const { ws, mic, ctx, player } = talk;
  talk = null;
  mic.getTracks().forEach((t) => t.stop());
  ctx.close();
  if (player) player.ctx.close();
  if (ws.readyState <= WebSocket.OPEN) ws.close();
  $("talk-start").disabled = false; $("talk-stop").disabled = true;
  setStatus("talk-status", message, isError);
}

$("talk-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("talk-start").disabled = true; $("talk-stop").disabled = false;
  try {
    await start();
  } catch (e) {
    talk = null;
    $("talk-start").disabled = false; $("talk-stop").disabled = true;
    setStatus("talk-status", `microphone: ${e.message}`, true);
  }
});
$("talk-stop").addEventListener("click", () => stop());
