// The edit tab (POST /v1/images/edits): input images, a mask drawn on the first one.

import { api } from "./api.js";
import { $, setStatus } from "./dom.js";
import { Gallery, PARTIAL_IMAGES, imageFields, runImages } from "./images.js";

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
    if (stream) { form.append("stream", "true"); form.append("partial_images", String(PARTIAL_IMAGES)); }
    return api("/v1/images/edits", { form });
  };
  await runImages({ send, gallery: editGallery, n: fields.n, progressId: "edit-progress", statusId: "edit-status",
                    format: "png" });
  button.disabled = false;
});
