// The Armada dashboard: draws each snapshot the gateway sends on /dashboard/events as plain DOM
// and SVG. Names from the cluster are set as text, never parsed as HTML.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const STATE_COLORS = {
  running: '#3b6fd8', waiting_tool: '#8a5cd1', waiting_input: '#2e9d5b', queued: '#d9931f',
};
const CELL_COLORS = ['#3b6fd8', '#2e9d5b', '#d9931f', '#8a5cd1', '#d04437', '#1b9aaa', '#a05a2c', '#5d6d7e'];
const HISTORY = 120;  // snapshots kept for the trend chart (two minutes at one a second)
const history = [];   // [{at_ms, cells: {name: live_sessions}}]

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}
// A chart that scales to its section's width (its drawing is in a W × H box).
function chart(W, H, label) {
  const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, preserveAspectRatio: 'none' });
  s.style.width = '100%';
  s.style.height = `${H}px`;
  return s;
}
function pct(x) { return x === null || x === undefined ? '–' : (100 * x).toFixed(1) + '%'; }
function ms(x) { return x > 0 ? x.toFixed(1) + ' ms' : '–'; }
function color(i) { return CELL_COLORS[i % CELL_COLORS.length]; }
function replace(id, ...kids) { document.getElementById(id).replaceChildren(...kids); }

// A horizontal bar from 0 to 1: for KV watermarks, green below 70%, amber to 90%, red above; for
// progress (`progress` set), blue throughout.
function meter(x, width = 120, progress = false) {
  const s = svg('svg', { width, height: 12, role: 'img' });
  s.append(svg('rect', { x: 0, y: 1, width, height: 10, rx: 2, fill: '#e3e6eb' }));
  if (x !== null && x !== undefined) {
    const fill = progress ? '#3b6fd8' : x < 0.7 ? '#2e9d5b' : x < 0.9 ? '#d9931f' : '#d04437';
    s.append(svg('rect', { x: 0, y: 1, width: Math.max(1, width * x), height: 10, rx: 2, fill }));
  }
  return s;
}

function tiles(t) {
  const s = t.survival;
  const items = [
    ['cells', t.cells, 'cells'], ['nodes', t.nodes, 'nodes'], ['live_sessions', t.live_sessions, 'live sessions'],
    ['free_seqs', t.free_seqs, 'free sequences'], ['queued', t.queued, 'queued'],
    ['survival', s ? pct(s.ratio) : '–', 'chain survival'],
  ];
  replace('tiles', ...items.map(([f, v, k]) =>
    el('div', { class: 'tile' }, el('div', { class: 'v', 'data-total': f }, v), el('div', { class: 'k' }, k))));
}

function states(byState) {
  const entries = Object.entries(byState).filter(([, n]) => n > 0);
  const total = entries.reduce((a, [, n]) => a + n, 0);
  if (total === 0) return replace('states', el('div', { class: 'empty' }, 'No session on any node.'));
  const W = 520;
  const s = chart(W, 24, 'sessions by state');
  let x = 0;
  const legend = el('div', { class: 'legend' });
  for (const [state, n] of entries) {
    const w = (W * n) / total;
    const c = Object.hasOwn(STATE_COLORS, state) ? STATE_COLORS[state] : '#5d6d7e';
    const r = svg('rect', { x, y: 0, width: w, height: 24, fill: c });
    r.append(svg('title', {}, `${state}: ${n}`));
    s.append(r);
    x += w;
    const i = el('i');
    i.style.background = c;
    legend.append(el('span', {}, i, `${state} `, el('b', { 'data-state': state }, n)));
  }
  replace('states', s, legend);
}

function survival(cells) {
  const rows = cells.filter((c) => c.survival);
  if (rows.length === 0) return replace('survival', el('div', { class: 'empty' }, 'No cell has reported yet.'));
  const W = 520, bar = 18, gap = 8, left = 80;
  const s = svg('svg', { viewBox: `0 0 ${W} ${rows.length * (bar + gap)}`, role: 'img', 'aria-label': 'chain survival' });
  s.style.width = '100%';
  rows.forEach((c, i) => {
    const y = i * (bar + gap);
    const v = c.survival;
    const decided = v.completed + v.failed + v.timed_out + v.lost;
    s.append(svg('text', { x: 0, y: y + 13 }, c.name));
    s.append(svg('rect', { x: left, y, width: W - left - 70, height: bar, rx: 2, fill: '#e3e6eb' }));
    let x = left;
    for (const [k, col] of [['completed', '#2e9d5b'], ['failed', '#d04437'], ['timed_out', '#d9931f'], ['lost', '#7a1f16']]) {
      if (!decided || !v[k]) continue;
      const w = ((W - left - 70) * v[k]) / decided;
      const r = svg('rect', { x, y, width: w, height: bar, fill: col });
      r.append(svg('title', {}, `${k}: ${v[k]}`));
      s.append(r);
      x += w;
    }
    s.append(svg('text', { x: W - 64, y: y + 13, 'data-cell': c.name, 'data-field': 'survival' }, pct(v.ratio)));
  });
  const legend = el('div', { class: 'legend' });
  for (const [k, col] of [['completed', '#2e9d5b'], ['failed', '#d04437'], ['timed out', '#d9931f'], ['lost after a move', '#7a1f16']]) {
    const i = el('i');
    i.style.background = col;
    legend.append(el('span', {}, i, k));
  }
  replace('survival', s, legend);
}

function trend(snap) {
  const cells = Object.create(null);
  for (const c of snap.cells) cells[c.name] = c.live_sessions;
  history.push({ at: snap.at_ms, cells });
  while (history.length > HISTORY) history.shift();
  const names = [...new Set(history.flatMap((h) => Object.keys(h.cells)))].sort();
  const W = 1040, H = 120, pad = 30;
  const max = Math.max(1, ...history.flatMap((h) => Object.values(h.cells)));
  const s = svg('svg', { viewBox: `0 0 ${W} ${H + 20}`, role: 'img', 'aria-label': 'live sessions per cell' });
  s.style.width = '100%';
  s.append(svg('line', { x1: pad, y1: H, x2: W, y2: H, stroke: '#e3e6eb' }));
  s.append(svg('text', { x: 0, y: 12 }, max));
  s.append(svg('text', { x: 0, y: H }, 0));
  const t0 = history[0].at, t1 = Math.max(history[history.length - 1].at, t0 + 1);
  const legend = el('div', { class: 'legend' });
  names.forEach((name, i) => {
    const pts = history.filter((h) => Object.hasOwn(h.cells, name))
      .map((h) => `${pad + ((W - pad) * (h.at - t0)) / (t1 - t0)},${H - ((H - 4) * h.cells[name]) / max}`);
    if (pts.length === 1) pts.push(pts[0].replace(/^[^,]+/, String(W)));
    s.append(svg('polyline', { points: pts.join(' '), fill: 'none', stroke: color(i), 'stroke-width': 2 }));
    const sw = el('i');
    sw.style.background = color(i);
    legend.append(el('span', {}, sw, name));
  });
  s.append(svg('text', { x: pad, y: H + 16 }, `${Math.round((t1 - t0) / 1000)} s ago`));
  s.append(svg('text', { x: W - 30, y: H + 16 }, 'now'));
  replace('trend', s, legend);
}

function cellsTable(cells) {
  if (cells.length === 0) return replace('cells', el('div', { class: 'empty' }, 'No node has joined the cluster yet.'));
  const head = el('tr', {}, ...['cell / node', 'share', 'nodes', 'live sessions', 'free sequences', 'queued',
    'engines', 'KV watermark', '', 'step', 'version'].map((h) => el('th', {}, h)));
  const body = [];
  for (const c of cells) {
    const flags = el('span');
    if (c.full) flags.append(' ', el('span', { class: 'badge full' }, 'full'));
    if (!c.reported) flags.append(' ', el('span', { class: 'badge' }, 'no brain report'));
    const f = (field, v) => el('td', { class: 'num', 'data-cell': c.name, 'data-field': field }, v);
    body.push(el('tr', { class: 'cell' }, el('td', {}, c.name, flags),
      el('td', { class: 'num' }, c.weight === null ? '–' : pct(c.weight)),
      f('nodes', c.nodes), f('live_sessions', c.live_sessions), f('free_seqs', c.free_seqs), f('queued', c.queued),
      el('td'), el('td', {}, meter(c.kv_watermark)), f('kv_watermark', pct(c.kv_watermark)), f('step_ms', ms(c.step_ms)),
      el('td')));
    for (const n of c.node_list) {
      const g = (field, v) => el('td', { class: 'num', 'data-node': n.name, 'data-field': field }, v);
      const name = el('td', {}, '\u2003' + n.name);
      if (n.draining) name.append(' ', el('span', { class: 'badge', 'data-node': n.name, 'data-field': 'draining' }, 'draining'));
      body.push(el('tr', {}, name, el('td'), el('td'), g('sessions', n.sessions), g('free_seqs', n.free_seqs), el('td'),
        g('engines', n.engines), el('td', {}, meter(n.kv_watermark)), g('kv_watermark', pct(n.kv_watermark)),
        g('step_ms', ms(n.step_ms)), el('td', {}, n.version)));
    }
  }
  replace('cells', el('table', {}, el('thead', {}, head), el('tbody', {}, ...body)));
}

// `armada rollout`: its progress, the current wave's nodes, and the gates (a fired one marked).
function rollout(r) {
  if (!r) return replace('rollout', el('div', { class: 'empty', 'data-field': 'rollout' }, 'No rollout in progress.'));
  const num = (x) => (Math.round(x * 1000) / 1000).toString();
  const head = el('div', { 'data-field': 'rollout' },
    `${r.id} to ${r.version}: `, el('b', { 'data-field': 'rollout_phase' }, r.phase),
    `, wave ${r.wave} of ${r.waves}, `, el('span', { 'data-field': 'rollout_upgraded' }, `${r.upgraded} of ${r.total}`),
    ' nodes on it');
  const kids = [head, el('div', {}, meter(r.total > 0 ? r.upgraded / r.total : 0, 240, true))];
  if (r.fired) kids.push(el('div', { class: 'fired', 'data-field': 'rollout_fired' }, 'halted: ' + r.fired));
  else if (r.reason) kids.push(el('div', {}, r.reason));
  if (r.nodes.length > 0) {
    kids.push(el('table', {},
      el('thead', {}, el('tr', {}, ...['node', 'cell', 'from', 'to', 'phase'].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...r.nodes.map((n) => el('tr', { 'data-rollout-node': n.name },
        el('td', {}, n.name), el('td', {}, n.cell), el('td', {}, n.from), el('td', {}, n.to), el('td', {}, n.phase))))));
  }
  if (r.gates.length > 0) {
    kids.push(el('table', {},
      el('thead', {}, el('tr', {}, ...['gate', 'wave', 'rest', 'before', 'limit', ''].map((h) => el('th', {}, h)))),
      el('tbody', {}, ...r.gates.map((g) => el('tr', { class: g.fired ? 'fired' : '', 'data-gate': g.signal + (g.code ? ':' + g.code : '') },
        el('td', {}, g.signal + (g.code ? ` (${g.code})` : '')), el('td', { class: 'num' }, num(g.wave)),
        el('td', { class: 'num' }, num(g.rest)), el('td', { class: 'num' }, num(g.before)),
        el('td', { class: 'num' }, num(g.limit)),
        el('td', {}, g.fired ? 'fired' : g.judged ? 'ok' : g.note))))));
  }
  replace('rollout', ...kids);
}

function failovers(list) {
  if (list.length === 0) return replace('failovers', el('div', { class: 'empty' }, 'No node lost in any cell since its brain took the lead.'));
  const rows = list.map((f) => el('tr', { 'data-failover': f.node },
    el('td', {}, new Date(f.at_ms).toLocaleTimeString()), el('td', {}, f.cell), el('td', {}, f.node),
    el('td', { class: 'num' }, f.sessions)));
  replace('failovers', el('table', {},
    el('thead', {}, el('tr', {}, ...['when', 'cell', 'node', 'sessions moved'].map((h) => el('th', {}, h)))),
    el('tbody', {}, ...rows)));
}

function draw(snap) {
  document.getElementById('meta').textContent =
    `seen by gateway ${snap.gateway} (of ${snap.gateways}) at ${new Date(snap.at_ms).toLocaleTimeString()}`;
  tiles(snap.totals);
  states(snap.totals.by_state);
  survival(snap.cells);
  trend(snap);
  cellsTable(snap.cells);
  rollout(snap.rollout);
  failovers(snap.failovers);
  document.body.dataset.snapshot = String(snap.at_ms);
}

function connect() {
  const status = document.getElementById('status');
  const es = new EventSource('/dashboard/events');
  es.addEventListener('snapshot', (ev) => {
    const snap = JSON.parse(ev.data);
    // The gateway keeps its last view while it cannot read etcd: say that it may be stale.
    status.textContent = snap.etcd_ok ? 'live' : 'etcd unreachable: last known view';
    status.className = snap.etcd_ok ? 'live' : 'down';
    draw(snap);
  });
  es.onerror = () => {
    status.textContent = 'reconnecting';
    status.className = 'down';
  };
}
connect();
