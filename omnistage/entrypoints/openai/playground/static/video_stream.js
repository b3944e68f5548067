// The video tab's streamed mode (WS /v1/realtime/video): each fragmented-MP4 chunk is appended
// to a Media Source Extensions buffer as it arrives, so the video plays while later chunks are
// still being made (Helios sends one per denoised chunk; other models one at the end).

import { openSocket } from "./api.js";
import { $ } from "./dom.js";

// MSE needs the codec: read the H.264 profile and level from the init segment's avcC box
// (the server's mime_type says only "video/mp4").
function avcCodec(bytes) {
  const hex = (b) => b.toString(16).padStart(2, "0");
  for (let i = 4; i + 8 <= bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) { // "avcC"
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`;
    }
  }
  return null;
}

// Starts one session; `onEvent(event)` sees its JSON events, `onEnd(text, isError)` its end.
// Returns a stop function (session.stop: the server aborts the request).
export function streamVideo(fields, { onEvent, onEnd }) {
  const player = $("video-player");
  const source = new MediaSource();
  const queue = [];
  let buffer = null, done = false, ended = false, ws = null;
  player.src = URL.createObjectURL(source);
  player.hidden = false;
  player.dataset.mode = "mse";
  player.dataset.chunks = "0";

  function finish(text, isError = false) {
    if (ended) return;
    ended = true;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close();
    onEnd(text, isError);
  }

  // One append at a time; once the session is done and the queue drained, the stream ends.
  function pump() {
    if (!buffer || buffer.updating) return;
    if (queue.length) { buffer.appendBuffer(queue.shift()); return; }
    if (done && source.readyState === "open") source.endOfStream();
  }

  function append(bytes) {
    if (!buffer) {
      const codec = avcCodec(bytes);
      const type = `video/mp4; codecs="${codec}"`;
      if (!codec || !MediaSource.isTypeSupported(type)) { finish(`this browser cannot play ${type}`, true); return; }
      buffer = source.addSourceBuffer(type);
      buffer.addEventListener("updateend", () => {
        player.dataset.chunks = String(Number(player.dataset.chunks) + 1);
        if (player.paused) player.play().catch(() => {}); // muted autoplay; a blocked play is harmless
        pump();
      });
    }
    queue.push(bytes);
    pump();
  }

  source.addEventListener("sourceopen", () => {
    ws = openSocket("/v1/realtime/video");
    ws.binaryType = "arraybuffer";
    ws.onopen = () => ws.send(JSON.stringify({ type: "session.start", format: "m4s", ...fields }));
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") { append(new Uint8Array(m.data)); return; }
      const event = JSON.parse(m.data);
      onEvent(event);
      if (event.type === "session.done") {
        done = true;
        pump();
        finish(`${event.reason}: ${event.total_chunks} chunk(s) streamed`, event.reason === "error");
      } else if (event.type === "error") {
        finish(`failed: ${event.message}`, true);
      }
    };
    ws.onclose = (e) => finish(`closed (${e.code} ${e.reason})`.trim(), true);
  }, { once: true });

  return () => {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "session.stop" }));
  };
}
