"""The script of a serving run's report page, inlined (no CDN, no network): plain JavaScript
drawing SVG — the serving settings and the engine's budget per device (and the KV cache groups),
memory over time by part (weights, KV pool, CUDA graphs, temporaries stacked; allocated and
reserved lines, capacity), KV blocks used against the pool, requests running / waiting /
preempted, all on one time axis (drag to zoom, double-click resets), and the request table's
summary. Written for this page alone, so there is no third-party licence to carry."""

SERVE_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('timeline-data').textContent);
const NS = 'http://www.w3.org/2000/svg';
const PARTS = [['weights_bytes', 'weights', '#4c72b0'], ['kv_cache_bytes', 'KV pool', '#55a868'],
  ['cuda_graph_bytes', 'CUDA graphs', '#8172b2'], ['temporary_bytes', 'temporaries', '#8c8c8c']];
const gib = (b) => b === null || b === undefined ? '-' : (b / 2**30).toFixed(2);
const num = (v) => v === null || v === undefined ? '-' : Number(v).toLocaleString();
const msf = (v) => v === null || v === undefined ? '-' : Number(v).toLocaleString(undefined, {maximumFractionDigits: 3});
function el(tag, attrs, parent){ const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
function h(tag, text, cls){ const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; }
function table(box, cols, rows){ const t = box.appendChild(h('table')), head = h('tr');
  cols.forEach(c => head.appendChild(h('th', c[0], c[2] ? 'l' : ''))); t.appendChild(h('thead')).appendChild(head);
  const body = t.appendChild(h('tbody'));
  rows.forEach(r => { const tr = body.appendChild(h('tr')); cols.forEach(c => tr.appendChild(h('td', c[1](r), c[2] ? 'l' : ''))); });
  return t; }
function pairs(box, rows){ table(box, [['', r => r[0], 1], ['', r => r[1]]], rows); }

let view = null; const charts = [];
function redraw(){ charts.forEach(f => f()); }

// one chart on the shared time axis: stacked step areas, step lines, flat lines (ms, values in `unit`)
function chart(box, t, spec){
  const W = 1000, H = spec.height || 240, L = 56, R = 10, T = 10, B = 24;
  const tmax = t.length ? t[t.length - 1] : 1;
  function draw(){ box.innerHTML = ''; const svg = el('svg', {width: W, height: H}, box);
    const [v0, v1] = view || [0, tmax || 1];
    const x = (v) => L + (v - v0) / ((v1 - v0) || 1) * (W - L - R), y = (v) => H - B - v / spec.ymax * (H - T - B);
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: '#fff', stroke: '#ccc'}, svg);
    const clip = 'c' + Math.random().toString(36).slice(2);
    el('rect', {x: L, y: T, width: W - L - R, height: H - T - B}, el('clipPath', {id: clip}, el('defs', {}, svg)));
    const g = el('g', {'clip-path': `url(#${clip})`}, svg); const base = new Array(t.length).fill(0);
    const nx = (i) => i + 1 < t.length ? t[i + 1] : tmax;
    for (const [v, color] of spec.stack || []){ let up = '', down = '';
      for (let i = 0; i < t.length; i++) up += `${x(t[i])},${y(base[i] + v[i])} ${x(nx(i))},${y(base[i] + v[i])} `;
      for (let i = t.length - 1; i >= 0; i--) down += `${x(nx(i))},${y(base[i])} ${x(t[i])},${y(base[i])} `;
      el('polygon', {points: up + down, fill: color, opacity: 0.9}, g); for (let i = 0; i < t.length; i++) base[i] += v[i]; }
    for (const [v, color, dash] of spec.lines || []){ let p = '';
      for (let i = 0; i < t.length; i++) p += `${x(t[i])},${y(v[i])} ${x(nx(i))},${y(v[i])} `;
      el('polyline', {points: p, fill: 'none', stroke: color, 'stroke-width': 1.2, 'stroke-dasharray': dash || ''}, g); }
    for (const [v, color] of spec.flat || [])
      el('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: color, 'stroke-dasharray': '6 4'}, g);
    for (let k = 0; k <= 4; k++){ const v = spec.ymax * k / 4, tv = v0 + (v1 - v0) * k / 4;
      el('text', {x: L - 4, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 10}, svg).textContent =
        v.toLocaleString(undefined, {maximumFractionDigits: spec.ymax < 10 ? 1 : 0});
      el('text', {x: x(tv), y: H - 8, 'text-anchor': k === 4 ? 'end' : 'middle', 'font-size': 10}, svg).textContent =
        tv.toLocaleString(undefined, {maximumFractionDigits: 0}) + (k === 4 ? ' ms' : ''); }
    el('text', {x: L + 4, y: T + 12, 'font-size': 10}, svg).textContent = spec.unit;
    let drag = null; const sel = el('rect', {y: T, height: H - T - B, fill: '#06c', opacity: 0.15, width: 0}, svg);
    const at = (ev) => ev.clientX - svg.getBoundingClientRect().left;
    svg.addEventListener('mousedown', (ev) => { drag = at(ev); sel.setAttribute('x', drag); });
    svg.addEventListener('mousemove', (ev) => { if (drag === null) return; const p = at(ev);
      sel.setAttribute('x', Math.min(p, drag)); sel.setAttribute('width', Math.abs(p - drag)); });
    svg.addEventListener('mouseup', (ev) => { if (drag === null) return; const p = at(ev), a = Math.min(p, drag),
      b = Math.max(p, drag); drag = null; if (b - a < 4) { sel.setAttribute('width', 0); return; }
      const inv = (px) => v0 + (px - L) / (W - L - R) * (v1 - v0); view = [Math.max(0, inv(a)), inv(b)]; redraw(); });
    svg.addEventListener('dblclick', () => { view = null; redraw(); }); }
  charts.push(draw); draw();
}
function legend(box, items){ const lg = box.appendChild(h('div', '', 'legend'));
  for (const [name, color, dash] of items){ const s = lg.appendChild(h('span')); const sw = s.appendChild(h('span', '', 'sw'));
    sw.style.background = dash ? 'none' : color; if (dash) sw.style.borderTop = `2px dashed ${color}`;
    s.appendChild(document.createTextNode(name)); } }

function budget(root, devices){
  const dp = devices.some(d => d.dp_rank !== undefined);
  root.appendChild(h('h2', 'engine budget' + (devices.length > 1 ? (dp ? ' per DP rank' : ' per pipeline stage') : '')));
  const fields = [...(dp ? [['DP rank', r => r.dp_rank], ['requests routed', r => num(r.requests)]] : []),
    ['stage', r => r.pp_stage === undefined ? '-' : r.pp_stage], ['layers', r => r.layers ? `${r.layers[0]}–${r.layers[1] - 1}` : '-'],
    ['devices alike (×)', r => r.represents], ['capacity GiB', r => gib(r.capacity_bytes)],
    ['requested GiB', r => gib(r.budget.requested_bytes)], ['weights GiB', r => gib(r.budget.weights_bytes)],
    ['non-torch GiB', r => gib(r.budget.non_torch_bytes)], ['activation peak GiB', r => gib(r.budget.activation_peak_bytes)],
    ['CUDA graphs GiB', r => gib(r.budget.cuda_graph_bytes) + (r.budget.cuda_graph_subtracted ? '' : ' *')],
    ['KV pool GiB', r => gib(r.kv_pool_bytes)], ['KV blocks', r => num(r.num_kv_blocks)], ['block size (tokens)', r => r.block_size],
    ['KV bytes / token', r => `${num(r.kv_bytes_per_token)} (${r.kv_layers} layers)`], ['pool tokens', r => num(r.kv_pool_tokens)],
    ['max concurrency at max_model_len', r => num(r.max_concurrency_at_max_model_len)],
    ['longest context (tokens)', r => num(r.longest_context_tokens)], ['most blocks used', r => num(r.max_kv_blocks_used)],
    ['peak allocated GiB', r => gib(r.peak_allocated_bytes)], ['peak reserved GiB', r => gib(r.peak_reserved_bytes)],
    ['peak at (ms)', r => msf(r.peak_time_us / 1e3)], ['failure', r => r.failure || '-']];
  table(root.appendChild(h('div')), [['', f => f[0], 1], ...devices.map(d => [`device ${d.device}`, f => String(f[1](d))])], fields);
  root.appendChild(h('div', '* CUDA-graph pool not subtracted by the engine', 'muted'));
  for (const d of devices){ const kg = d.kv_cache_groups; if (!kg) continue;
    root.appendChild(h('h2', `KV cache groups, device ${d.device}: ${kg.num_tensors} tensors of ${gib(kg.tensor_bytes)} GiB, page ${num(kg.page_bytes)} B, block ${num(kg.block_bytes)} B`));
    table(root.appendChild(h('div')), [['kind', r => r.kind, 1], ['sliding window', r => r.sliding_window === null ? '-' : num(r.sliding_window)],
      ['layers', r => r.layers.length + ': ' + r.layers.join(','), 1], ['padding layers', r => r.padding_layers],
      ['max blocks / request', r => num(r.max_blocks_per_request)]], kg.groups); }
}

function settings(root){ const run = D.run || {}, sv = run.serving || {}, p = run.parallel || {};
  root.appendChild(h('h2', 'serving settings'));
  const row = root.appendChild(h('div', '', 'row'));
  pairs(row.appendChild(h('div')), [['model', run.model], ['engine', (D.engine || {}).name + ' ' + ((D.engine || {}).version || '')],
    ['GPU', (run.hardware || {}).gpu], ['tp × pp × dp', `${p.tp} × ${p.pp} × ${p.dp}`], ['max_model_len', num(run.max_model_len)],
    ['gpu_memory_utilization', sv.gpu_memory_utilization], ['max_num_seqs', num(sv.max_num_seqs)],
    ['max_num_batched_tokens', num(sv.max_num_batched_tokens)], ['block_size', sv.block_size]]);
  pairs(row.appendChild(h('div')), [['chunked prefill', String(sv.enable_chunked_prefill)], ['prefix caching', String(sv.enable_prefix_caching)],
    ['cudagraph_mode', sv.cudagraph_mode], ['enforce_eager', String(sv.enforce_eager)], ['weights / KV dtype', `${sv.weight_dtype} / ${sv.kv_cache_dtype}`],
    ['capture sizes', (D.cuda_graph_capture_sizes || []).length + ' sizes'],
    ['steps', D.steps ? `${num(D.steps.total)} (${num(D.steps.eager)} eager, ${num(D.steps.replayed)} replayed)` : '-'],
    ['load', run.load ? `${num(run.load.num_requests)} requests at ${run.load.rate_per_s}/s` : 'request file']]);
  const det = root.appendChild(h('details')); det.appendChild(h('summary', 'all run settings'));
  det.appendChild(h('pre', JSON.stringify(run, null, 1)));
}

function requests(root){ const r = D.requests; root.appendChild(h('h2', 'requests'));
  if (!r){ root.appendChild(h('p', 'no requests.parquet in this folder', 'muted')); return; }
  pairs(root.appendChild(h('div')), [['requests', num(r.total)], ['finished', num(r.finished)], ['rejected', num(r.rejected)],
    ['preemptions', `${num(r.preemptions)} (${num(r.preempted_requests)} requests, at most ${num(r.max_preemptions)} each)`],
    ['prompt / output tokens', `${num(r.prompt_tokens)} / ${num(r.output_tokens)}`], ['makespan (ms)', msf(r.makespan_us / 1e3)]]);
  table(root.appendChild(h('div')), [['latency (ms)', x => x[0], 1], ['p50', x => msf(x[1].p50)], ['p90', x => msf(x[1].p90)],
    ['p99', x => msf(x[1].p99)], ['mean', x => msf(x[1].mean)], ['max', x => msf(x[1].max)]], [['TTFT', r.ttft_ms], ['TPOT', r.tpot_ms]]);
  const why = Object.entries(r.rejections || {}), kinds = {};  // one row per reason, its own number elided
  for (const [k, n] of why){ const g = k.replace(/\d[\d,]*/, '…'); kinds[g] = (kinds[g] || 0) + n; }
  if (why.length) table(root.appendChild(h('div')), [['rejected because', x => x[0], 1], ['requests', x => num(x[1])]],
    Object.entries(kinds));
  if (why.length > Object.keys(kinds).length){ const det = root.appendChild(h('details'));
    det.appendChild(h('summary', `every rejection reason (${why.length})`));
    table(det.appendChild(h('div')), [['reason', x => x[0], 1], ['requests', x => num(x[1])]], why); }
}

function timelines(root){ const d = D.devices.find(x => x.series); if (!d){
  root.appendChild(h('p', 'no engine steps to draw (no memory.parquet in this folder, or no step ran)', 'muted')); return; }
  const s = d.series, t = s.t_us.map(v => v / 1e3), G = (a) => a.map(v => v / 2**30);
  root.appendChild(h('h2', `memory over time, device ${d.device} (per engine step; drag to zoom, double-click to reset)`));
  legend(root, [...PARTS.map(p => [p[1], p[2]]), ['allocated', '#000'], ['reserved', '#c44e52'], ['capacity', 'red', 1]]);
  const cap = d.capacity_bytes / 2**30;
  chart(root.appendChild(h('div')), t, {unit: 'GiB', ymax: Math.max(cap, ...G(s.reserved_bytes), 0.001) * 1.1,
    stack: PARTS.filter(p => p[0] in s).map(p => [G(s[p[0]]), p[2]]),
    lines: [[G(s.allocated_bytes), '#000'], [G(s.reserved_bytes), '#c44e52']], flat: cap ? [[cap, 'red']] : []});
  root.appendChild(h('h2', 'KV blocks used vs the pool'));
  legend(root, [['used', '#55a868'], ['pool', 'red', 1]]);
  const pool = d.num_kv_blocks;
  chart(root.appendChild(h('div')), t, {unit: 'blocks', height: 180, ymax: Math.max(pool, ...s.kv_blocks_used, 1) * 1.1,
    stack: [[s.kv_blocks_used, '#55a868']], flat: [[pool, 'red']]});
  root.appendChild(h('h2', 'requests running / waiting / preempted'));
  legend(root, [['running', '#4c72b0'], ['waiting', '#dd8452'], ['preempted', '#c44e52']]);
  chart(root.appendChild(h('div')), t, {unit: 'requests', height: 180,
    ymax: Math.max(...s.requests_running, ...s.requests_waiting, ...s.requests_preempted, 1) * 1.1,
    lines: [[s.requests_running, '#4c72b0'], [s.requests_waiting, '#dd8452'], [s.requests_preempted, '#c44e52']]});
}

document.title = D.title; const root = document.getElementById('report');
root.appendChild(h('h1', D.title));
const q = D.requests_summary;
root.appendChild(h('div', `serving run; ${D.devices.length} device row${D.devices.length === 1 ? '' : 's'}` +
  (q ? `; ${num(q.finished)}/${num(q.total)} requests finished, ${num(q.rejected)} rejected, ${num(q.preemptions)} preemptions` : ''), 'muted'));
settings(root); budget(root, D.devices); timelines(root); requests(root);
})();
"""
