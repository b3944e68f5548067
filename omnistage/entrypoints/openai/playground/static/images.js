// The image tab (POST /v1/images/generations) and what the edit tab shares with it:
// the gallery and the request that streams partial images when the server can.

import { ApiError, api, sseEvents } from "./api.js";
import { $, dropNulls, numberOrNull, requestFinished, setStatus } from "./dom.js";

// Cleared once the server refuses `stream` / `partial_images`; later requests ask plainly.
const state = { streamImages: true };
export const PARTIAL_IMAGES = 2;

// One gallery slot per requested image; partial images replace the slot's picture until
// the final one arrives.
export class Gallery {
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
export async function runImages({ send, gallery, n, progressId, statusId, format }) {
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
      // OpenAI's events: `*.partial_image` (b64_json, partial_image_index) then `*.completed`
      // per image; a server may send fewer partials than asked when an image is quick.
      progress.max = n * (PARTIAL_IMAGES + 1);
      progress.value = 0;
      for await (const { data } of sseEvents(resp)) {
        if (!data || typeof data !== "object") continue;
        const type = data.type || "";
        if (type === "error" || data.error) throw new Error((data.error && data.error.message) || "the stream failed");
        const index = data.index ?? count;
        const fmt = data.output_format || format;
        if (type.endsWith(".partial_image")) {
          gallery.show(index, data.b64_json, fmt, false, `partial image ${(data.partial_image_index ?? 0) + 1}`);
          progress.value += 1;
        } else if (type.endsWith(".completed")) {
          gallery.show(index, data.b64_json, fmt, true);
          count += 1;
          progress.value = count * (PARTIAL_IMAGES + 1);
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
    requestFinished();
  }
}

export function imageFields(prefix) {
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
      json: { ...fields, response_format: "b64_json", ...(stream ? { stream: true, partial_images: PARTIAL_IMAGES } : {}) },
    }),
    gallery: imageGallery, n: fields.n, progressId: "image-progress", statusId: "image-status", format: "png",
  });
  button.disabled = false;
});
