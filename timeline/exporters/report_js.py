"""The report page's script and style, inlined into every page (no CDN, no network): a few
hundred lines of plain JavaScript drawing SVG — stacked memory per category, the reserved line,
capacity, iteration boundaries and the peak, drag to zoom (double-click resets), the schedule
under the same time axis, and a variant picker for comparisons. Written for this page alone,
so there is no third-party licence to carry."""

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}th{background:#f4f4f4}
td.l,th.l{text-align:left}tr.sel{background:#fff3c4}tr.oom td{color:#b00}tbody tr{cursor:pointer}
.legend span{display:inline-block;margin-right:12px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
svg{display:block;user-select:none}.muted{color:#777}.row{display:flex;gap:24px;flex-wrap:wrap}
details{margin:6px 0}pre{background:#f8f8f8;padding:6px;max-height:300px;overflow:auto}
select{font:inherit}
"""

SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('timeline-data').textContent);
const COLORS = {weights:'#4c72b0',grads:'#55a868',optimizer:'#8172b2',activations:'#dd8452',
  recompute:'#c44e52',comm:'#937860',temporary:'#8c8c8c'};
const PHASE = {F:'#4c72b0',B:'#dd8452',I:'#e5ae38',W:'#55a868',R:'#c44e52',step:'#8c8c8c'};
const NS = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);
const gib = (b) => (b / 2**30).toFixed(2);
const ms = (us) => (us / 1e3).toLocaleString(undefined, {minimumFractionDigits: 1, maximumFractionDigits: 1});
const ORDER = ['weights', 'grads', 'optimizer', 'activations', 'recompute', 'comm', 'temporary'];
const present = (s) => ORDER.filter(c => c in s.categories);  // stacking order, statics at the bottom
function el(tag, attrs, parent){ const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }
function h(tag, text, cls){ const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; }

let view = null;  // [t0, t1] ms shown, shared by the chart and the schedule

function chart(box, dev, opts){
  const W = opts.width || 1000, H = opts.height || 280, L = 48, R = 10, T = 10, B = 24;
  const s = dev.series, t = s.t_ms; box.innerHTML = '';
  const svg = el('svg', {width: W, height: H}, box);
  const tmax = opts.tmax || (t.length ? t[t.length - 1] : 1) || 1;
  const [v0, v1] = view || [0, tmax];
  const ymax = opts.ymax || Math.max(dev.capacity_bytes / 2**30, ...s.reserved, 0.001) * 1.1;
  const x = (v) => L + (v - v0) / (v1 - v0) * (W - L - R), y = (v) => H - B - v / ymax * (H - T - B);
  el('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: '#fff', stroke: '#ccc'}, svg);
  const clip = 'c' + Math.random().toString(36).slice(2);
  const cp = el('clipPath', {id: clip}, el('defs', {}, svg));
  el('rect', {x: L, y: T, width: W - L - R, height: H - T - B}, cp);
  const g = el('g', {'clip-path': `url(#${clip})`}, svg);
  const cats = present(s); const base = new Array(t.length).fill(0);
  for (const c of cats){  // stacked steps: each value holds until the next row
    const v = s.categories[c]; let up = '', down = '';
    for (let i = 0; i < t.length; i++){ const nx = i + 1 < t.length ? t[i + 1] : tmax;
      up += `${x(t[i])},${y(base[i] + v[i])} ${x(nx)},${y(base[i] + v[i])} `; }
    for (let i = t.length - 1; i >= 0; i--){ const nx = i + 1 < t.length ? t[i + 1] : tmax;
      down += `${x(nx)},${y(base[i])} ${x(t[i])},${y(base[i])} `; }
    el('polygon', {points: up + down, fill: COLORS[c] || '#999', opacity: 0.9}, g);
    for (let i = 0; i < t.length; i++) base[i] += v[i];
  }
  let line = ''; for (let i = 0; i < t.length; i++){ const nx = i + 1 < t.length ? t[i + 1] : tmax;
    line += `${x(t[i])},${y(s.reserved[i])} ${x(nx)},${y(s.reserved[i])} `; }
  el('polyline', {points: line, fill: 'none', stroke: '#000', 'stroke-width': 1}, g);
  if (dev.capacity_bytes) el('line', {x1: L, x2: W - R, y1: y(dev.capacity_bytes / 2**30), y2: y(dev.capacity_bytes / 2**30),
    stroke: 'red', 'stroke-dasharray': '6 4'}, g);
  for (const it of (dev.iteration_starts_ms || []).slice(1))
    el('line', {x1: x(it), x2: x(it), y1: T, y2: H - B, stroke: '#555', 'stroke-dasharray': '2 3'}, g);
  if (s.reserved.length){ let i = 0; s.reserved.forEach((v, j) => { if (v > s.reserved[i]) i = j; });
    el('path', {d: `M${x(t[i]) - 5},${y(s.reserved[i]) - 9}h10l-5,8z`, fill: '#000'}, g);
    const lab = el('text', {x: x(t[i]) + 7, y: y(s.reserved[i]) - 3, 'font-size': 11}, g);
    lab.textContent = `peak reserved ${s.reserved[i].toFixed(2)} GiB at ${t[i].toLocaleString()} ms`; }
  if (dev.first_oom) el('line', {x1: x(dev.first_oom.t_us / 1e3), x2: x(dev.first_oom.t_us / 1e3),
    y1: H - B - 12, y2: H - B, stroke: 'red', 'stroke-width': 3}, g);
  for (let k = 0; k <= 4; k++){ const v = ymax * k / 4;  // axes
    el('text', {x: L - 4, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 10}, svg).textContent = v.toFixed(0);
    const tv = v0 + (v1 - v0) * k / 4;
    el('text', {x: x(tv), y: H - 8, 'text-anchor': 'middle', 'font-size': 10}, svg).textContent =
      tv.toLocaleString(undefined, {maximumFractionDigits: 0}) + (k === 4 ? ' ms' : ''); }
  el('text', {x: 4, y: T + 10, 'font-size': 10}, svg).textContent = 'GiB';
  let drag = null; const sel = el('rect', {y: T, height: H - T - B, fill: '#06c', opacity: 0.15, width: 0}, svg);
  const at = (ev) => { const r = svg.getBoundingClientRect(); return ev.clientX - r.left; };
  svg.addEventListener('mousedown', (ev) => { drag = at(ev); sel.setAttribute('x', drag); });
  svg.addEventListener('mousemove', (ev) => { if (drag === null) return; const p = at(ev);
    sel.setAttribute('x', Math.min(p, drag)); sel.setAttribute('width', Math.abs(p - drag)); });
  svg.addEventListener('mouseup', (ev) => { if (drag === null) return; const p = at(ev), a = Math.min(p, drag),
    b = Math.max(p, drag); drag = null; if (b - a < 4) { sel.setAttribute('width', 0); return; }
    const inv = (px) => v0 + (px - L) / (W - L - R) * (v1 - v0);
    view = [Math.max(0, inv(a)), inv(b)]; opts.redraw(); });
  svg.addEventListener('dblclick', () => { view = null; opts.redraw(); });
  return svg;
}

function schedule(box, devices, tmax){
  const W = 1000, L = 48, R = 10, lane = 14; box.innerHTML = '';
  const withBars = devices.filter(d => d.schedule && d.schedule.length);
  if (!withBars.length){ box.appendChild(h('p', 'no ops.parquet in this folder: no schedule to draw', 'muted')); return; }
  const svg = el('svg', {width: W, height: lane * withBars.length + 20}, box);
  const [v0, v1] = view || [0, tmax]; const x = (v) => L + (v - v0) / (v1 - v0) * (W - L - R);
  withBars.forEach((d, r) => {
    el('text', {x: L - 4, y: r * lane + 11, 'text-anchor': 'end', 'font-size': 10}, svg).textContent = 'rank ' + d.device;
    for (const [label, phase, a, b] of d.schedule){ if (b < v0 || a > v1) continue;
      const rect = el('rect', {x: x(Math.max(a, v0)), y: r * lane + 1, width: Math.max(0.5, x(Math.min(b, v1)) - x(Math.max(a, v0))),
        height: lane - 2, fill: PHASE[phase] || '#aaa'}, svg);
      el('title', {}, rect).textContent = `${label}: ${a.toLocaleString()}–${b.toLocaleString()} ms`; } });
}

function table(box, cols, rows, onpick, selected){
  box.innerHTML = ''; const t = h('table'), head = h('tr');
  cols.forEach(c => head.appendChild(h('th', c[0], c[2] ? 'l' : '')));
  t.appendChild(h('thead')).appendChild(head); const body = t.appendChild(h('tbody'));
  rows.forEach((r, i) => { const tr = body.appendChild(h('tr'));
    if (i === selected) tr.className = 'sel'; if (r.num_ooms || r.oom === true) tr.className += ' oom';
    cols.forEach(c => tr.appendChild(h('td', c[1](r), c[2] ? 'l' : ''))); if (onpick) tr.onclick = () => onpick(i); });
  box.appendChild(t);
}

const DEV_COLS = [['pp rank', r => r.pp_rank], ['device', r => r.device], ['×', r => r.represents],
  ['peak alloc GiB', r => gib(r.peak_allocated_bytes)], ['peak reserved GiB', r => gib(r.peak_reserved_bytes)],
  ['frag.', r => gib(r.fragmentation_bytes_at_peak)], ['at (ms)', r => ms(r.peak_time_us)],
  ['reserved at (ms)', r => ms(r.peak_reserved_time_us)], ['during', r => r.peak_action || '-', 1],
  ['act/µbatch GiB', r => gib(r.activation_bytes_per_microbatch)], ['capacity GiB', r => gib(r.capacity_bytes)],
  ['OOMs', r => (r.num_ooms || 0).toLocaleString()]];

function runView(root, data, opts){
  let pick = 0; const worst = data.devices.reduce((a, d, i) => d.peak_reserved_bytes > data.devices[a].peak_reserved_bytes ? i : a, 0);
  pick = worst; root.innerHTML = '';
  const tab = root.appendChild(h('div')), title = root.appendChild(h('h2')), legend = root.appendChild(h('div', '', 'legend'));
  const box = root.appendChild(h('div')); root.appendChild(h('h2', 'schedule (actions on the compute stream; drag on the chart to zoom)'));
  const sbox = root.appendChild(h('div')); const row = root.appendChild(h('div', '', 'row'));
  const bd = row.appendChild(h('div')), top = row.appendChild(h('div'));
  const tmax = Math.max(...data.devices.map(d => d.series.t_ms.length ? d.series.t_ms[d.series.t_ms.length - 1] : 0), 1);
  function draw(){ const d = data.devices[pick];
    table(tab, DEV_COLS, data.devices, (i) => { pick = i; draw(); }, pick);
    title.textContent = `memory over time: device ${d.device} (pp rank ${d.pp_rank})` + (view ? ' — zoomed; double-click to reset' : '');
    legend.innerHTML = ''; for (const c of present(d.series)){ const s = legend.appendChild(h('span'));
      const sw = s.appendChild(h('span', '', 'sw')); sw.style.background = COLORS[c]; s.appendChild(document.createTextNode(c)); }
    legend.appendChild(h('span', '— reserved   - - capacity   ┆ iteration start   ▼ peak'));
    chart(box, d, {tmax, redraw: draw}); schedule(sbox, data.devices, tmax);
    bd.innerHTML = ''; bd.appendChild(h('h2', 'at the requested peak (GiB)'));
    table(bd.appendChild(h('div')), [['category', r => r[0], 1], ['GiB', r => gib(r[1])]], Object.entries(d.breakdown_at_peak_bytes || {}).filter(r => r[1]));
    top.innerHTML = ''; top.appendChild(h('h2', 'largest tensors live at the peak'));
    table(top.appendChild(h('div')), [['tensor', r => r.tensor, 1], ['GiB', r => gib(r.bytes)], ['category', r => r.category, 1],
      ['µbatch', r => r.microbatch]], d.top_tensors || []); }
  draw();
}

function settings(root, run){
  if (!run) return; const det = root.appendChild(h('details')); det.appendChild(h('summary', 'run settings'));
  det.appendChild(h('pre', JSON.stringify(run, null, 1)));
}

function compareView(root){
  root.appendChild(h('h2', 'worst device of each variant, same axes (drag to zoom, double-click to reset)'));
  const side = root.appendChild(h('div', '', 'row'));
  const worst = D.variants.map(v => v.devices.reduce((a, d) => d.peak_reserved_bytes > a.peak_reserved_bytes ? d : a));
  const tmax = Math.max(...worst.map(d => d.series.t_ms[d.series.t_ms.length - 1] || 0), 1);
  const ymax = Math.max(...worst.map(d => Math.max(d.capacity_bytes / 2**30, ...d.series.reserved))) * 1.1;
  function sideBySide(){ side.innerHTML = ''; D.variants.forEach((v, i) => { const b = side.appendChild(h('div'));
    b.appendChild(h('div', `${v.name}: device ${worst[i].device} (pp rank ${worst[i].pp_rank})`));
    chart(b.appendChild(h('div')), worst[i], {width: 480, height: 220, tmax, ymax, redraw: sideBySide}); }); }
  sideBySide();
  const det = root.appendChild(h('details')); det.appendChild(h('summary', `comparison table (${D.rows.length} rows; GiB, per iteration)`));
  const cols = [['variant', r => r.variant, 1], ['pp rank', r => r.pp_rank], ['device', r => r.device],
    ['peak alloc', r => gib(r.peak_allocated_bytes)], ['peak reserved', r => gib(r.peak_reserved_bytes)],
    ['frag.', r => gib(r.fragmentation_bytes)], ['recompute ms', r => (r.recompute_time_us / 1e3).toLocaleString(undefined,
      {minimumFractionDigits: 2, maximumFractionDigits: 2})],
    ['iteration ms', r => ms(r.iteration_time_us)], ['headroom', r => gib(r.headroom_bytes) + (r.oom ? ' OOM' : '')]];
  table(det.appendChild(h('div')), cols, D.rows);
  const pickRow = root.appendChild(h('h2', 'one variant: ')); const sel = pickRow.appendChild(h('select'));
  D.variants.forEach((v, i) => { const o = sel.appendChild(h('option', v.name)); o.value = i; });
  const one = root.appendChild(h('div')); let chosen = 0;
  const show = () => { view = null; runView(one, D.variants[chosen]); };
  sel.onchange = () => { chosen = sel.selectedIndex; show(); }; show();
}

document.title = D.title; const root = $('report');
root.appendChild(h('h1', D.title));
root.appendChild(h('div', D.kind === 'compare' ? `${D.variants.length} variants` :
  `${D.devices.length} devices` + (D.iteration_time_us ? `; iteration time ${ms(D.iteration_time_us)} ms` : '') +
  (D.num_events ? `; ${D.num_events.toLocaleString()} memory events` : ''), 'muted'));
if (D.kind === 'compare') compareView(root); else { settings(root, D.run); runView(root.appendChild(h('div')), D); }
})();
"""
