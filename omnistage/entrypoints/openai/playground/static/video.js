// The video tab (/v1/videos): an async job, polled for its status and progress; or, with
// "Stream", WS /v1/realtime/video played through Media Source Extensions (video_stream.js).

import { api } from "./api.js";
import { $, dropNulls, numberOrNull, requestFinished, setStatus } from "./dom.js";
import { streamVideo } from "./video_stream.js";

const videoState = { id: null, timer: null, url: null, stop: null };

function videoDone(text, isError = false) {
  clearTimeout(videoState.timer);
  requestFinished();
  videoState.id = null;
  videoState.stop = null;
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
      player.src = videoState.url; player.hidden = false; player.dataset.mode = "file";
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
  $("video-create").disabled = true;
  $("video-progress").value = 0;
  if ($("video-stream").checked) {
    startStream(fields);
    return;
  }
  for (const [k, v] of Object.entries(fields)) form.append(k, String(v));
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

function startStream(fields) {
  $("video-download").hidden = true;
  $("video-cancel").disabled = false;
  setStatus("video-status", "connecting…");
  let chunks = 0;
  videoState.stop = streamVideo(fields, {
    onEvent(event) {
      if (event.type === "video.start") setStatus("video-status", "generating…");
      if (event.type === "video.chunk_metadata") {
        chunks += 1;
        if (fields.num_frames) $("video-progress").value = Math.min(100, (100 * chunks * event.num_frames) / fields.num_frames);
        setStatus("video-status", `streaming: chunk ${chunks} (${event.num_frames} frames)`);
      }
    },
    onEnd(text, isError) {
      if (!isError) $("video-progress").value = 100;
      videoDone(text, isError);
    },
  });
}

$("video-cancel").addEventListener("click", async () => {
  if (videoState.stop) { videoState.stop(); return; } // the session ends with reason "stopped"
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
