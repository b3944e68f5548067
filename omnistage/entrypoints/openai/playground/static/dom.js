// Small helpers shared by the tabs.

export const $ = (id) => document.getElementById(id);

export function setStatus(id, text, isError = false) {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle("error", isError);
}

export function numberOrNull(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}

export function dropNulls(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== null && v !== ""));
}

export function b64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function fileToBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1]);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

// Tells the header that a request ended, so the queue depth is read again now.
export function requestFinished() {
  document.dispatchEvent(new Event("omnistage:request-finished"));
}
