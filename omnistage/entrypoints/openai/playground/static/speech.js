// The speech tab (POST /v1/audio/speech): voices, voice upload, audio played as it streams.

import { api } from "./api.js";
import { PcmPlayer } from "./audio.js";
import { $, dropNulls, requestFinished, setStatus } from "./dom.js";

export async function loadVoices() {
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
    requestFinished();
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
