// The chat tab (POST /v1/chat/completions): streamed replies, attachments, and spoken
// replies on models with text and audio out.

import { api, sseEvents } from "./api.js";
import { PcmPlayer } from "./audio.js";
import { $, b64ToBytes, dropNulls, fileToBase64, numberOrNull, requestFinished, setStatus } from "./dom.js";

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
    requestFinished();
  }
});

$("chat-stop").addEventListener("click", () => chatState.abort && chatState.abort.abort());
$("chat-clear").addEventListener("click", () => {
  chatState.messages = [];
  $("chat-log").replaceChildren();
  setStatus("chat-status", "");
});
