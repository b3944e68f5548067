// PCM16 played as it arrives (speech and spoken chat replies).

// One player sounds at a time: a new one stops (and frees) the one before.
let current = null;

// Schedules little-endian PCM16 chunks back to back on a Web Audio clock, so playback
// starts with the first chunk, and keeps them to offer the whole clip as a WAV.
export class PcmPlayer {
  constructor(sampleRate) {
    if (current) current.ctx.close();
    current = this;
    this.ctx = new AudioContext();
    this.rate = sampleRate;
    this.next = 0;
    this.firstStart = null;
    this.carry = null;
    this.parts = [];
  }

  push(bytes) {
    if (this.carry) { const j = new Uint8Array(this.carry.length + bytes.length); j.set(this.carry); j.set(bytes, this.carry.length); bytes = j; this.carry = null; }
    if (bytes.length % 2) { this.carry = bytes.slice(-1); bytes = bytes.slice(0, -1); }
    if (!bytes.length) return;
    this.parts.push(bytes);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    const n = bytes.length / 2;
    const buffer = this.ctx.createBuffer(1, n, this.rate);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < n; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const at = Math.max(this.next, this.ctx.currentTime + 0.05);
    source.start(at);
    if (this.firstStart === null) this.firstStart = at;
    this.next = at + buffer.duration;
  }

  seconds() { return this.parts.reduce((a, p) => a + p.length, 0) / 2 / this.rate; }

  // Seconds of audio already played (by the audio clock); 0 before playback starts.
  played() {
    return this.firstStart === null ? 0 : Math.max(0, this.ctx.currentTime - this.firstStart);
  }

  wav() {
    const length = this.parts.reduce((a, p) => a + p.length, 0);
    const header = new DataView(new ArrayBuffer(44));
    const text = (o, s) => [...s].forEach((c, i) => header.setUint8(o + i, c.charCodeAt(0)));
    text(0, "RIFF"); header.setUint32(4, 36 + length, true); text(8, "WAVE"); text(12, "fmt ");
    header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, this.rate, true); header.setUint32(28, this.rate * 2, true);
    header.setUint16(32, 2, true); header.setUint16(34, 16, true); text(36, "data"); header.setUint32(40, length, true);
    return new Blob([header, ...this.parts], { type: "audio/wav" });
  }
}
