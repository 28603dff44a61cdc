// Runs a report page's inline script under a minimal DOM (no browser): enough of document,
// elements and SVG for the page to build itself, so a test can catch a script error and count
// what it drew. Usage: node report_dom_stub.js PAGE.html  → prints {"svg": n, "rows": n, ...}
const fs = require('fs');
const vm = require('vm');
const page = fs.readFileSync(process.argv[2], 'utf8');
const data = page.match(/<script type="application\/json" id="timeline-data">([\s\S]*?)<\/script>/)[1];
const script = page.match(/<script>([\s\S]*?)<\/script>/)[1];
const counts = {};
class Node {
  constructor(tag){ this.tagName = tag; this.children = []; this.attrs = {}; this.style = {}; this._text = '';
    this.className = ''; counts[tag] = (counts[tag] || 0) + 1; }
  appendChild(c){ this.children.push(c); return c; }
  setAttribute(k, v){ if (v === undefined || (typeof v === 'number' && !isFinite(v))) throw new Error(`bad ${k}=${v} on ${this.tagName}`);
    if (typeof v === 'string' && /NaN|undefined/.test(v)) throw new Error(`bad ${k}=${v.slice(0, 80)} on ${this.tagName}`);
    this.attrs[k] = v; }
  addEventListener(){}
  set innerHTML(v){ this.children = []; }
  get innerHTML(){ return ''; }
  set textContent(v){ if (/NaN|undefined/.test(String(v))) throw new Error(`bad text ${v}`); this._text = String(v); }
  get textContent(){ return this._text; }
  getBoundingClientRect(){ return {left: 0, top: 0}; }
}
const nodes = {report: new Node('div'), 'timeline-data': Object.assign(new Node('script'), {_text: data})};
const document = {title: '', getElementById: (id) => nodes[id], createElement: (t) => new Node(t),
  createElementNS: (ns, t) => new Node(t), createTextNode: (t) => new Node('#text')};
vm.runInNewContext(script, {document, console, Math, JSON, Object, Array, Number, String, isFinite});
console.log(JSON.stringify({title: document.title, svg: counts.svg || 0, polygon: counts.polygon || 0,
  tr: counts.tr || 0, select: counts.select || 0, rect: counts.rect || 0}));
