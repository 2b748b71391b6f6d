// The gateway's dashboard (GET /dashboard, admin key) in headless Chromium, against a real cluster
// (`armada cluster up`: one cell of two nodes) where a node was killed under idle sessions. The
// page loads with no console error, shows the failover, and its numbers (the cell's, and the
// surviving node's sessions, engines, free sequences, KV watermark and step time) are those of the
// leading brain's and the surviving node's /metrics. A screenshot is kept in ARMADA_ARTIFACTS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { alive, metricSum, sanitizerReports, waitFor } from './cluster_helpers.mjs';

const SLOW = process.env.ARMADA_TIMING === '0' ? 4 : 1;
const KEY = 'sk-dashboard-admin-7f3a9c21d04e';
const bearer = (k = KEY) => ({ Authorization: `Bearer ${k}` });
const basic = (user, pass) => ({ Authorization: 'Basic ' + Buffer.from(`${user}:${pass}`).toString('base64') });
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const artifacts = process.env.ARMADA_ARTIFACTS ?? path.join(process.cwd(), 'artifacts');

let tools;
let otlp;
let dir;
let up;
let upLog = '';
let gw;
let stopped = 0;  // a node's pid, stopped by a test

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const procs = (role) => status().processes.filter((p) => p.role === role && alive(p.pid));

before(async () => {
  tools = await startToolServer();
  otlp = await startOtlpReceiver();
  dir = tempDir('armada-dashboard-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  // `doomed` needs three tool steps and may take two: its sessions fail (max_steps). `late` has a
  // second to finish, and its tool takes three: its sessions time out.
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1, maxSteps: 4 }) +
    agentYaml(tools.url, { id: 'doomed', toolSteps: 3, maxSteps: 2 }).replace(/^agents:\n/, '') + `
  - id: late
    instructions: Use the tool, then answer.
    min_tool_steps: 1
    answer_without_tools: true
    limits: { max_steps: 4, max_tokens_per_step: 48, deadline_s: 1, tool_timeout_ms: 10000 }
    tools:
      - name: wait
        description: Wait for a record
        url: ${tools.url}/slow
        timeout_ms: 10000
        parameters:
          type: object
          properties:
            record: { type: string, enum: [alpha] }
          required: [record]
          additionalProperties: false
`);
  up = spawn(process.env.ARMADA_BIN, ['cluster', 'up', '--nodes', '2', '--brains', '1', '-m', tinyModel,
    '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents, '--lease-ttl', '3', '--api-key', KEY,
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8', '--node-arg=-c',
    '--node-arg=8192', '--node-arg=-t', '--node-arg=1'], {
    stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint },
  });
  up.stdout.on('data', (d) => { upLog += d; });
  up.stderr.on('data', (d) => { upLog += d; });
  gw = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('cluster up printed no gateway\n' + upLog)), 120000 * SLOW);
    up.stdout.on('data', () => {
      const m = upLog.match(/gateway at (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    up.on('exit', (code) => { clearTimeout(timer); reject(new Error(`cluster up exited with ${code}\n${upLog}`)); });
  });
  dir = path.join(dir, 'c');
  await waitFor('both nodes in the gateway\'s view', async () => {
    const r = await fetch(`${gw}/readyz`).catch(() => null);
    return r?.status === 200 && (await r.json()).nodes === 2;
  }, 60000);
});

after(async () => {
  if (up && up.exitCode === null) {
    const done = new Promise((r) => up.on('exit', r));
    if (stopped && alive(stopped)) process.kill(stopped, 'SIGCONT');  // it would hold the shutdown up
    up.kill('SIGINT');
    await done;
  }
  if (tools) await tools.close();
  if (otlp) await otlp.close();
  if (dir) assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

async function post(route, body, headers = bearer()) {
  const r = await fetch(gw + route, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify(body),
  });
  return { status: r.status, json: await r.json().catch(() => null) };
}
const session = (id) => fetch(`${gw}/v1/sessions/${id}`, { headers: bearer() }).then((r) => r.json());

test('the dashboard takes an admin key only: as the password of HTTP Basic or as a bearer token', async () => {
  const none = await fetch(`${gw}/dashboard`);
  assert.equal(none.status, 401);
  // A browser asks the person for the key.
  assert.match(none.headers.get('www-authenticate') ?? '', /^Basic realm="Armada dashboard"/);
  assert.equal((await fetch(`${gw}/dashboard`, { headers: basic('ops', 'not-the-key') })).status, 401);
  assert.equal((await fetch(`${gw}/dashboard`, { headers: { Authorization: 'Basic %%%' } })).status, 401);
  // Basic credentials are taken on the dashboard's paths only.
  assert.equal((await fetch(`${gw}/metrics`, { headers: basic('ops', KEY) })).status, 401);
  assert.equal((await fetch(`${gw}/admin/tenants`, { headers: basic('ops', KEY) })).status, 401);
  // A tenant's key is refused: the dashboard shows every tenant's load.
  assert.equal((await post('/admin/tenants', { name: 'acme' })).status, 201);
  const k = await post('/admin/keys', { tenant: 'acme' });
  assert.equal(k.status, 201, JSON.stringify(k.json));
  const tenantKey = k.json.key;
  assert.equal((await fetch(`${gw}/dashboard`, { headers: basic('acme', tenantKey) })).status, 403);
  assert.equal((await fetch(`${gw}/dashboard/events`, { headers: bearer(tenantKey) })).status, 403);

  const page = await fetch(`${gw}/dashboard`, { headers: basic('ops', KEY) });
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /^text\/html/);
  // Nothing from elsewhere: the page and its script come from the gateway.
  assert.match(page.headers.get('content-security-policy'), /script-src 'self'/);
  assert.match(await page.text(), /<script src="\/dashboard\/app.js">/);
  const js = await fetch(`${gw}/dashboard/app.js`, { headers: bearer() });
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal((await fetch(`${gw}/dashboard`, { method: 'POST', headers: bearer() })).status, 405);
  const missing = await fetch(`${gw}/dashboard/nope`, { headers: bearer() });
  assert.equal(missing.status, 404);
  assert.match((await missing.json()).error.message, /\/dashboard\/events/);
});

test('the event stream sends a snapshot of the cluster about once a second', async () => {
  const ac = new AbortController();
  const r = await fetch(`${gw}/dashboard/events`, { headers: bearer(), signal: ac.signal });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  const snaps = [];
  const reader = r.body.getReader();
  let buf = '';
  const t0 = Date.now();
  while (snaps.length < 4) {
    const { value, done } = await reader.read();
    assert.ok(!done, 'the stream ended');
    buf += Buffer.from(value).toString('utf8');
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const frame = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = frame.split('\n').find((l) => l.startsWith('data: '));
      if (/^event: snapshot$/m.test(frame) && data) snaps.push(JSON.parse(data.slice(6)));
    }
  }
  ac.abort();
  const elapsed = Date.now() - t0;
  // The first at once, then one a second: the fourth comes two to three seconds later.
  assert.ok(elapsed >= 1900 && elapsed < 6000 * SLOW, `4 snapshots in ${elapsed} ms`);
  assert.equal(snaps[3].etcd_ok, true);
  assert.ok(snaps[3].at_ms > snaps[1].at_ms && snaps[1].at_ms >= snaps[0].at_ms);
  const s = snaps[3];
  assert.equal(s.totals.nodes, 2);
  assert.deepEqual(s.cells.map((c) => c.name), ['cell0']);
  assert.equal(s.cells[0].node_list.length, 2);
  assert.equal(s.rollout, null);
});

test('in Chromium the page draws the cluster live: a lost node, sessions by state and survival, as /metrics says', { timeout: 300000 * SLOW }, async () => {
  // Two sessions run to completion (the cell's chain survival), five wait for input.
  const done = [];
  for (let i = 0; i < 2; ++i) {
    const r = await post('/v1/agents/worker/sessions', { input: `Process record ${['alpha', 'beta'][i]}` });
    assert.equal(r.status, 201, JSON.stringify(r.json));
    done.push(r.json.id);
  }
  const idle = [];
  for (let i = 0; i < 5; ++i) {
    const r = await post('/v1/agents/worker/sessions', {});
    assert.equal(r.status, 201, JSON.stringify(r.json));
    idle.push(r.json.id);
  }
  // A `doomed` session waits too: its node is the one lost, and its turn after the move fails
  // (a session lost after a move).
  const doomedIdle = await post('/v1/agents/doomed/sessions', {});
  assert.equal(doomedIdle.status, 201, JSON.stringify(doomedIdle.json));
  idle.push(doomedIdle.json.id);
  for (const id of done) {
    const s = await waitFor(`session ${id} to end`, async () => {
      const x = await session(id);
      return ['completed', 'failed'].includes(x.state) && x;
    }, 120000 * SLOW);
    assert.equal(s.state, 'completed', s.reason);
  }
  // One fails, and one is cancelled by its client (in no ratio).
  const doomed = await post('/v1/agents/doomed/sessions', { input: 'Process record alpha' });
  assert.equal(doomed.status, 201, JSON.stringify(doomed.json));
  const failed = await waitFor('the doomed session to end', async () => {
    const x = await session(doomed.json.id);
    return ['completed', 'failed'].includes(x.state) && x;
  }, 120000 * SLOW);
  assert.equal(failed.state, 'failed', JSON.stringify(failed));
  // One passes its deadline.
  const late = await post('/v1/agents/late/sessions', { input: 'Wait for record alpha' });
  assert.equal(late.status, 201, JSON.stringify(late.json));
  const timedOut = await waitFor('the late session to end', async () => {
    const x = await session(late.json.id);
    return ['completed', 'failed'].includes(x.state) && x;
  }, 120000 * SLOW);
  assert.equal(timedOut.state, 'failed', JSON.stringify(timedOut));
  assert.match(timedOut.reason, /^deadline/);
  const dropped = await post('/v1/agents/worker/sessions', {});
  assert.equal(dropped.status, 201, JSON.stringify(dropped.json));
  // (A session created without input is waiting_input from the start; its cancel goes to the node
  // that holds it, once it is placed.)
  await waitFor('the session to drop to be placed', async () => {
    const x = await session(dropped.json.id);
    return x.state === 'waiting_input' && x.placement?.node;
  }, 60000 * SLOW);
  const c = await post(`/v1/sessions/${dropped.json.id}/cancel`, {});
  assert.equal(c.status, 200, JSON.stringify(c.json));
  await waitFor('the cancel', async () => (await session(dropped.json.id)).state === 'cancelled', 30000 * SLOW);
  const where = new Map();
  for (const id of idle) {
    const s = await waitFor(`session ${id} placed and waiting`, async () => {
      const x = await session(id);
      return x.state === 'waiting_input' && x.placement?.node && x;
    }, 60000 * SLOW);
    where.set(id, s.placement.node);
  }
  const counts = {};
  for (const n of where.values()) counts[n] = (counts[n] ?? 0) + 1;
  const victim = where.get(doomedIdle.json.id);
  const survivor = procs('node').find((p) => p.name !== victim);

  const browser = await chromium.launch({ executablePath: CHROMIUM });
  try {
    const context = await browser.newContext({
      httpCredentials: { username: 'ops', password: KEY }, viewport: { width: 1120, height: 1100 },
    });
    const page = await context.newPage();
    const problems = [];
    page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    page.on('requestfailed', (r) => { if (!r.url().endsWith('/dashboard/events')) problems.push(`request failed: ${r.url()}`); });
    // The page is open before the node is lost: what follows reaches it live.
    const resp = await page.goto(`${gw}/dashboard`);
    assert.equal(resp.status(), 200);
    await page.waitForSelector('#status.live', { timeout: 10000 });
    await page.waitForSelector(`[data-node="${victim}"][data-field="sessions"]`, { timeout: 10000 });
    assert.equal(await page.locator('[data-failover]').count(), 0, 'no failover yet');

    // The node with most of the idle sessions hangs past its lease (stopped, so that `cluster up`
    // does not start it again as it would a crashed one): its cell's brain moves them to the other.
    stopped = status().processes.find((p) => p.name === victim).pid;
    process.kill(stopped, 'SIGSTOP');
    for (const [id, n] of where) {
      if (n !== victim) continue;
      await waitFor(`session ${id} moved off ${victim}`, async () => {
        const x = await session(id).catch(() => null);
        return x?.state === 'waiting_input' && x.placement?.node === survivor.name;
      }, 60000 * SLOW);
    }
    // Each move is a `migrate` span of the brain, in the session's trace: a child of the `place`
    // that sent it to the lost node (these sessions had taken no turn).
    for (const [id, n] of where) {
      if (n !== victim) continue;
      const ofIt = (name, node) => otlp.spans.find((x) => x.service === 'armada-cell' && x.name === name &&
        x.attributes['armada.session.id'] === id && x.attributes['armada.node'] === node);
      const mig = await waitFor(`the migrate span of ${id}`, async () => ofIt('migrate', survivor.name), 20000);
      const placed = await waitFor(`the place span of ${id}`, async () => ofIt('place', victim), 20000);
      assert.equal(mig.traceId, placed.traceId, `${id}: the move is in the session's trace`);
      assert.equal(mig.parentSpanId, placed.spanId, `${id}: the move is a child of its place`);
      assert.equal(mig.attributes['armada.node.from'], victim, `${id}: the move names the node it left`);
    }
    // The brain lists the lost node with the sessions it had, and the node leaves the table.
    const row = await page.waitForSelector(`[data-failover="${victim}"]`, { timeout: 30000 * SLOW });
    assert.match(await row.textContent(), new RegExp(`cell0${victim}${counts[victim]}$`));
    await page.waitForSelector(`[data-node="${victim}"]`, { state: 'detached', timeout: 10000 * SLOW });
    // A worker takes a turn on the survivor, so that it has step times to show.
    const turned = idle[0];
    const m = await post(`/v1/sessions/${turned}/messages`, { content: 'Process record gamma' });
    assert.equal(m.status, 200, JSON.stringify(m.json));
    const t = await waitFor(`session ${turned} to end its turn`, async () => {
      const x = await session(turned);
      return ['completed', 'failed'].includes(x.state) && x;
    }, 120000 * SLOW);
    assert.equal(t.state, 'completed', t.reason);
    assert.equal(t.placement.node, survivor.name);
    // The moved `doomed` session fails its turn on the survivor: lost after a move.
    const d = await post(`/v1/sessions/${doomedIdle.json.id}/messages`, { content: 'Process record beta' });
    assert.equal(d.status, 200, JSON.stringify(d.json));
    const lost = await waitFor('the moved doomed session to end', async () => {
      const x = await session(doomedIdle.json.id);
      return ['completed', 'failed'].includes(x.state) && x;
    }, 120000 * SLOW);
    assert.equal(lost.state, 'failed', JSON.stringify(lost));
    assert.equal(lost.placement.node, survivor.name);

    // The page's figures against the processes' own /metrics, read around the same second: at
    // rest they agree (each poll reads both sides again), and show four idle sessions.
    const brain = procs('cell')[0];
    const text = (sel) => page.locator(sel).first().textContent();
    const cellField = (f) => text(`[data-cell="cell0"][data-field="${f}"]`);
    let last;
    await waitFor('the page to show what /metrics says', async () => {
      const bm = await fetch(`${brain.url}/metrics`).then((r) => r.text());
      const nm = await fetch(`${survivor.url}/metrics`, { headers: bearer() }).then((r) => r.text());
      const c = (name, extra = '') => metricSum(bm, name, `cell="cell0"${extra}`);
      const ratio = c('armada_cell_chain_survival_ratio');
      const kv = c('armada_cell_kv_watermark_ratio');
      const want = {
        nodes: String(c('armada_cell_nodes')),
        live: String(c('armada_cell_live_sessions')),
        free: String(c('armada_cell_free_sequences')),
        queued: String(c('armada_cell_queued_sessions')),
        survival: Number.isNaN(ratio) ? '–' : `${(100 * ratio).toFixed(1)}%`,
        kv: Number.isNaN(kv) ? '–' : `${(100 * kv).toFixed(1)}%`,
        waiting: String(metricSum(nm, 'armada_sessions_live', 'state="waiting_input"')),
        liveTotal: String(c('armada_cell_live_sessions')),
        step: true,
      };
      // The cell's step latency, shown to a tenth of a millisecond.
      const stepMs = 1000 * c('armada_cell_step_latency_seconds');
      const stepText = await cellField('step_ms');
      // The survivor's own row, against what its /metrics says it reported.
      const nodeField = (f) => text(`[data-node="${survivor.name}"][data-field="${f}"]`);
      const nodeStepMs = 1000 * metricSum(nm, 'armada_node_step_latency_seconds');
      const nodeStepText = await nodeField('step_ms');
      want.node = {
        sessions: String(metricSum(nm, 'armada_sessions_live')),
        engines: String(metricSum(nm, 'armada_engines')),
        free: String(metricSum(nm, 'armada_node_free_sequences')),
        kv: `${(100 * metricSum(nm, 'armada_node_kv_watermark_ratio')).toFixed(1)}%`,
        step: true,
      };
      const got = {
        nodes: await cellField('nodes'),
        live: await cellField('live_sessions'),
        free: await cellField('free_seqs'),
        queued: await cellField('queued'),
        survival: await cellField('survival'),
        kv: await cellField('kv_watermark'),
        waiting: await text('[data-state="waiting_input"]').catch(() => null),
        liveTotal: await text('[data-total="live_sessions"]'),
        step: stepMs > 0 && Math.abs(parseFloat(stepText) - stepMs) <= 0.051 && /^[0-9.]+ ms$/.test(stepText),
        node: {
          sessions: await nodeField('sessions'),
          engines: await nodeField('engines'),
          free: await nodeField('free_seqs'),
          kv: await nodeField('kv_watermark'),
          step: nodeStepMs > 0 && Math.abs(parseFloat(nodeStepText) - nodeStepMs) <= 0.051 &&
            /^[0-9.]+ ms$/.test(nodeStepText),
        },
      };
      // The brain's outcome counts come from its own scan of the store, which can lag the load
      // reports behind `live`: 2 completed and none lost is also 50%.
      const ended = Object.fromEntries(['completed', 'failed', 'timed_out', 'lost', 'cancelled'].map((o) =>
        [o, metricSum(bm, 'armada_cell_sessions_ended', `cell="cell0",outcome="${o}"`)]));
      // The page's survival bar, drawn from the same report as its ratio.
      const segments = await page.locator('svg[aria-label="chain survival"] rect title').allTextContents();
      last = { want, got, ended, segments };
      // Agreeing, once the brain has caught up with the turns that ended (a report from before
      // them says 6 or 5 live and 66.7% or 60.0% on both sides).
      return JSON.stringify(want) === JSON.stringify(got) && got.live === '4' && got.survival === '50.0%' &&
        ended.completed === 3 && ended.lost === 1 && segments.join() === 'completed: 3,failed: 1,timed_out: 1,lost: 1' && last;
    }, 20000 * SLOW).catch((e) => { throw new Error(`${e.message}: ${JSON.stringify(last)}`); });
    // What the cluster holds now: four idle sessions on the one node left; three completed and one
    // failed, one timed out and one lost after its move (50%: the cancelled one is in no ratio).
    assert.deepEqual(
      { nodes: last.got.nodes, live: last.got.live, waiting: last.got.waiting, survival: last.got.survival },
      { nodes: '1', live: '4', waiting: '4', survival: '50.0%' }, JSON.stringify(last));
    const bm = await fetch(`${brain.url}/metrics`).then((r) => r.text());
    const ended = Object.fromEntries(['completed', 'failed', 'timed_out', 'lost', 'cancelled'].map((o) =>
      [o, metricSum(bm, 'armada_cell_sessions_ended', `cell="cell0",outcome="${o}"`)]));
    assert.deepEqual(ended, { completed: 3, failed: 1, timed_out: 1, lost: 1, cancelled: 1 });
    // The survival bar draws each outcome in its share.
    const segments = await page.locator('svg[aria-label="chain survival"] rect title').allTextContents();
    assert.deepEqual(segments, ['completed: 3', 'failed: 1', 'timed_out: 1', 'lost: 1']);
    assert.deepEqual([last.got.node.sessions, last.got.node.engines], ['4', '1']);
    assert.equal(await page.locator(`[data-node="${victim}"]`).count(), 0, 'the lost node is gone from the table');
    assert.equal(await text('[data-field="rollout"]'), 'No rollout in progress.');
    fs.mkdirSync(artifacts, { recursive: true });
    const shot = path.join(artifacts, 'dashboard.png');
    await page.screenshot({ path: shot, fullPage: true });
    assert.ok(fs.statSync(shot).size > 10000, 'a screenshot of the page');
    console.log(`screenshot: ${shot}`);
    assert.deepEqual(problems, [], 'the page logged no error');
  } finally {
    await browser.close();
  }
});

test('armada cell drain NODE: the node drains and leaves the cluster; an unknown name gets the live ones', { timeout: 120000 * SLOW }, async () => {
  const { spawnSync } = await import('node:child_process');
  const drain = (...args) => spawnSync(process.env.ARMADA_BIN,
    ['cell', 'drain', ...args, '--cluster', path.join(dir, 'cluster.yaml')], { encoding: 'utf8', timeout: 60000 * SLOW });
  const node = procs('node').find((p) => p.pid !== stopped);
  assert.ok(node, 'a running node');
  const unknown = drain('no-such-node', '--api-key', KEY);
  assert.equal(unknown.status, 1);
  assert.match(unknown.stderr, new RegExp(`no live node named 'no-such-node' in etcd; the live nodes are .*${node.name}`));
  // Without an admin key the node refuses, and says what is missing.
  const keyless = drain(node.name, '--api-key', 'sk-wrong');
  assert.equal(keyless.status, 1);
  assert.match(keyless.stderr, /refused the drain \(HTTP 401\): give an admin key/);
  assert.equal((await fetch(`${node.url}/readyz`)).status, 200, 'the refused drain did not start one');

  const exited = new Promise((r) => {
    const t = setInterval(() => { if (!alive(node.pid)) { clearInterval(t); r(); } }, 100);
  });
  const r = drain(node.name, '--api-key', KEY, '--wait', '--timeout', String(60 * SLOW));
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`node ${node.name} of cell cell0 drains`));
  assert.match(r.stdout, new RegExp(`node ${node.name} left after [0-9.]+ s`));
  // It left because it drained: its log says so, and it exited on its own (cleanly, so `cluster
  // up` leaves it down).
  await exited;
  const log = fs.readFileSync(status().processes.find((p) => p.name === node.name).log, 'utf8');
  assert.match(log, /draining/);
  assert.match(log, /drained; stopping/);
});

test('with etcd gone the page says its view is the last known one, and it goes live when etcd is back', { timeout: 120000 * SLOW }, async () => {
  const snapshot = () => fetch(`${gw}/dashboard/snapshot`, { headers: bearer() }).then((r) => r.json());
  assert.equal((await snapshot()).etcd_ok, true);
  const browser = await chromium.launch({ executablePath: CHROMIUM });
  try {
    const context = await browser.newContext({ httpCredentials: { username: 'ops', password: KEY } });
    const page = await context.newPage();
    const problems = [];
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    assert.equal((await page.goto(`${gw}/dashboard`)).status(), 200);
    await page.waitForSelector('#status.live', { timeout: 10000 });
    // `cluster up` would start etcd again within a fraction of a second: it is held while etcd is
    // down, then let go.
    process.kill(up.pid, 'SIGSTOP');
    try {
      process.kill(status().servers.etcd.pid, 'SIGKILL');
      await page.waitForSelector('#status.down', { timeout: 20000 * SLOW });
      assert.equal(await page.locator('#status').textContent(), 'etcd unreachable: last known view');
      assert.equal((await snapshot()).etcd_ok, false);
    } finally {
      process.kill(up.pid, 'SIGCONT');
    }
    await page.waitForSelector('#status.live', { timeout: 30000 * SLOW });
    assert.equal(await page.locator('#status').textContent(), 'live');
    assert.equal((await snapshot()).etcd_ok, true);
    assert.deepEqual(problems, [], 'the page raised no error');
  } finally {
    await browser.close();
  }
});
