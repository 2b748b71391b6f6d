// Rolling upgrades with `armada rollout`, on 2 cells x 3 nodes from `armada cluster up` (real
// PostgreSQL, etcd, NATS and Redis, one brain per cell, two global brains, the tiny model). The
// versions are the same binary with other labels; `v-bad` fails every model step
// (--test-step-errors=1). Sessions keep arriving throughout.
// - v1 -> v2 in waves, at most one node of a cell at a time; the leading global brain is killed
//   mid-rollout and the standby resumes it; no session lost, no tool effect repeated;
// - v2 -> v-bad halts after its first wave, names the gate with its numbers, and rolls it back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { chromium } from 'playwright-core';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog, assertNoFinishedCallRepeated } from './session_helpers.mjs';
import { alive, clusterUp, metricSum, sanitizerReports, sleep, waitFor } from './cluster_helpers.mjs';

const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const ENDED = ['completed', 'failed', 'cancelled'];
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const artifacts = process.env.ARMADA_ARTIFACTS ?? path.join(process.cwd(), 'artifacts');
let tools;
let browser = null;  // Chromium, while a test has the dashboard open
let dir;
let up;
let gw;
let stopAll = false;  // set once the tests are over: creating loops a failed test left stop

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const logOf = (name) => fs.readFileSync(status().processes.find((p) => p.name === name).log, 'utf8');

// `armada rollout ARGS --cluster …`, asynchronously (the tool server runs in this process).
function rollout(...args) {
  return new Promise((resolve) => {
    execFile(process.env.ARMADA_BIN, ['rollout', ...args, '--cluster', status().config], { timeout: 30000 },
      (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr }));
  });
}
async function rolloutStatus() {
  const r = await rollout('status', '--json');
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout);
}

// A 503 with Retry-After (no node ready, or every cell at its water level) is retried as a
// client would, and counted: the test prints how many there were.
let refusals = 0;
async function createSession(label) {
  for (let attempt = 0; ; attempt++) {
    const r = await fetch(`${gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: label }),
    });
    const text = await r.text();
    if (r.status === 503 && attempt < 10 && Number(r.headers.get('retry-after')) > 0) {
      refusals++;
      await sleep(1000);
      continue;
    }
    assert.equal(r.status, 201, text);
    return JSON.parse(text).id;
  }
}

// Creates a session about every 1.5 s until stop() is called, which returns their ids (or
// throws what a create met). A test that fails first stops it in its `finally`.
function keepCreating(label) {
  const ids = [];
  let stopped = false;
  let error = null;
  const loop = (async () => {
    for (let i = 0; !stopped && !stopAll; i++) {
      try {
        ids.push(await createSession(`${label} ${i}`));
      } catch (e) {
        error = e;
        return;
      }
      await sleep(1500);
    }
  })();
  return {
    ids,
    async stop() {
      stopped = true;
      await loop;
      if (error) throw error;
      return ids;
    },
  };
}

async function waitAll(ids, timeoutMs = 240000) {
  const deadline = Date.now() + timeoutMs * SLOW;
  for (;;) {
    const all = await Promise.all(ids.map((id) => fetch(`${gw}/v1/sessions/${id}`).then((r) => r.json()).catch(() => null)));
    const done = all.filter((s) => s && ENDED.includes(s.state));
    if (done.length === ids.length) return done;
    if (Date.now() > deadline) throw new Error(`only ${done.length} of ${ids.length} sessions ended`);
    await sleep(500);
  }
}

// Every arrival at the tool server counts: a restart drains its node first, so no call of these
// sessions may come twice (no fault here may re-send one).
function checkCompleted(done) {
  for (const s of done) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 3);
    for (const st of s.steps.filter((x) => x.kind === 'tool_call'))
      assert.equal(tools.effects.get(st.idempotency_key), 1, `effects of ${st.idempotency_key}`);
  }
  const mine = new Set([...done].flatMap((s) => s.steps.map((x) => x.idempotency_key).filter(Boolean)));
  const replays = new Map([...tools.replays].filter(([k]) => mine.has(k)));
  assertNoFinishedCallRepeated({ ...tools, replays }, [...done], []);
}

// Polls the rollout's status each second until `until(st)` holds, calling `each(st)` on every
// reading; returns the last one.
async function watch(each, until, timeoutMs) {
  const deadline = Date.now() + timeoutMs * SLOW;
  for (;;) {
    const st = await rolloutStatus();
    await each(st);
    if (until(st)) return st;
    if (Date.now() > deadline) throw new Error(`rollout did not finish: ${JSON.stringify(st.state)}`);
    await sleep(1000);
  }
}

// How many times `cluster up` started `name` on `version` for a rollout.
// Samples, once a second, etcd's writes (its revision), leases granted (registrations), and the
// cell brains' placements; keeps each one's peak per second. For the figures in docs/SCALE.md:
// rates are measured here, not judged.
function rateSampler() {
  const peaks = { etcd_writes: 0, etcd_leases: 0, brain_decisions: 0 };
  let last = null;
  let stopped = false;
  const read = async () => {
    const etcd = await fetch(`http://${status().servers.etcd.endpoint}/metrics`).then((r) => r.text());
    let decisions = 0;
    for (const b of status().processes.filter((p) => p.role === 'cell' && alive(p.pid))) {
      const text = await fetch(`${b.url}/metrics`).then((r) => r.text()).catch(() => '');
      decisions += metricSum(text, 'armada_brain_decisions_total');
    }
    return { t: Date.now(), etcd_writes: metricSum(etcd, 'etcd_debugging_mvcc_current_revision'),
      etcd_leases: metricSum(etcd, 'etcd_debugging_lease_granted_total'), brain_decisions: decisions };
  };
  const loop = (async () => {
    while (!stopped && !stopAll) {
      const now = await read().catch(() => null);
      if (now && last) {
        const s = (now.t - last.t) / 1000;
        for (const k of Object.keys(peaks)) peaks[k] = Math.max(peaks[k], Math.max(0, now[k] - last[k]) / s);
      }
      if (now) last = now;
      await sleep(1000);
    }
  })();
  return { async stop() { stopped = true; await loop; return peaks; } };
}

// The gateway's dashboard in headless Chromium, recording what it draws: the draining badges and
// the rollout's phases and waves, as each snapshot replaces the page's content.
async function openDashboard(browser) {
  const page = await browser.newPage();
  const problems = [];
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') problems.push(`console ${m.type()}: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  assert.equal((await page.goto(`${gw}/dashboard`)).status(), 200);
  await page.waitForSelector('#status.live', { timeout: 10000 });
  await page.evaluate(() => {
    const seen = { draining: [], phases: [], waves: [] };
    window.drawn = seen;
    const add = (list, v) => { if (v && !list.includes(v)) list.push(v); };
    new MutationObserver(() => {
      for (const b of document.querySelectorAll('[data-field="draining"]')) add(seen.draining, b.dataset.node);
      add(seen.phases, document.querySelector('[data-field="rollout_phase"]')?.textContent);
      const head = document.querySelector('[data-field="rollout"]')?.textContent ?? '';
      add(seen.waves, head.match(/wave (\d+) of/)?.[1]);
    }).observe(document.body, { childList: true, subtree: true });
  });
  return { page, problems, drawn: () => page.evaluate(() => window.drawn) };
}

// A gate's row as the page draws it: its numbers, rounded as the page rounds them.
async function gateRow(page, g) {
  const cells = await page.locator(`[data-gate="${g.signal}${g.code ? ':' + g.code : ''}"] td`).allTextContents();
  const num = (x) => (Math.round(x * 1000) / 1000).toString();
  return { got: cells.slice(1, 6), want: [num(g.upgraded), num(g.rest), num(g.before), num(g.limit), g.fired ? 'fired' : g.judged ? 'ok' : g.note] };
}

const nodeStarts = (name, version) =>
  up.log().split('\n').filter((l) => l.includes(`cluster up: ${name} started on version ${version} `)).length;

before(async () => {
  tools = await startToolServer({ minDelayMs: 300, maxDelayMs: 600 });
  dir = tempDir('armada-rollout-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 3, maxSteps: 6, toolTimeoutMs: 3000 * SLOW }));
  up = await clusterUp(['--cells', '2', '--nodes', '3', '--brains', '1', '--globals', '2', '-m', tinyModel,
    '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents, '--lease-ttl', String(TTL_S),
    '--version-label', 'v1', '--version-arg', 'v-bad=--test-step-errors=1',
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8', '--node-arg=-c',
    '--node-arg=16384', '--node-arg=-t', '--node-arg=1', '--node-arg=--drain-timeout', '--node-arg=40'],
  { timeoutMs: 120000 * SLOW });
  gw = up.gw;
  dir = path.join(dir, 'c');
  await waitFor('6 nodes on v1', async () => {
    const st = await rolloutStatus();
    return st.nodes.length === 6 && st.nodes.every((n) => n.version === 'v1');
  }, 120000);
});

after(async () => {
  stopAll = true;
  await browser?.close().catch(() => {});
  await up?.stop();
  if (tools) await tools.close();
  assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('v1 -> v2 in waves, one node of a cell at a time; the global leader killed mid-rollout; no session lost', { timeout: 480000 * SLOW }, async () => {
  assert.match((await rollout('status')).stdout, /no rollout has been started/);
  browser = await chromium.launch({ executablePath: CHROMIUM });
  const dash = await openDashboard(browser);
  const work = keepCreating('wave');
  const rates = rateSampler();
  await sleep(3000);
  const start = await rollout('start', '--version', 'v2', '--wave-percent', '34', '--settle', '8',
    '--ready-timeout', String(90 * SLOW), '--gate-min-steps', '5', '--gate-latency-ratio', '5');
  assert.equal(start.code, 0, start.stderr);
  const id = start.stdout.match(/rollout (r-\d+) started/)[1];
  // A second start while this one runs is refused, naming it.
  const again = await rollout('start', '--version', 'v3');
  assert.notEqual(again.code, 0);
  assert.match(again.stderr, new RegExp(`rollout ${id} to v2 is (running|starting)`));

  const globals = status().processes.filter((p) => p.role === 'global');
  let killed = null;
  let maxWave = 0;
  let maxRestartingInACell = 0;
  let firstWaveAt = null;  // when wave 1 started: after 8 s of watching the fleet (--settle 8)
  const ids = new Set();
  const dashboard = [];  // the gateway dashboard's rollout panel, as read each second
  // Nodes the dashboard showed as draining, polled more often than the panel: a drain lasts
  // as long as its sessions take to reach a step's end.
  const drainingSeen = new Set();
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const snap = await fetch(`${gw}/dashboard/snapshot`).then((r) => r.json()).catch(() => null);
      for (const n of (snap?.cells ?? []).flatMap((c) => c.node_list)) if (n.draining) drainingSeen.add(n.name);
      await sleep(150);
    }
  })();
  const final = await watch(async (st) => {
    const snap = await fetch(`${gw}/dashboard/snapshot`).then((r) => r.json()).catch(() => null);
    if (snap?.rollout) dashboard.push(snap.rollout);
    if (!st.state) return;
    ids.add(st.state.id);
    if (st.state.wave === 1 && firstWaveAt === null) firstWaveAt = st.state.wave_started_ms;
    assert.ok(st.state.wave >= maxWave, `the wave went back from ${maxWave} to ${st.state.wave}`);
    maxWave = st.state.wave;
    const restarting = {};
    for (const w of Object.values(st.state.wave_nodes))
      if (w.phase === 'restarting') restarting[w.cell] = (restarting[w.cell] ?? 0) + 1;
    maxRestartingInACell = Math.max(maxRestartingInACell, ...Object.values(restarting), 0);
    // Mid-rollout, the leading global brain dies; the standby must carry on from etcd.
    if (!killed && st.state.wave === 2 && Object.keys(restarting).length > 0) {
      killed = globals.find((g) => alive(g.pid) && logOf(g.name).includes('leads'));
      assert.ok(killed, 'a global brain leads');
      process.kill(killed.pid, 'SIGKILL');
    }
  }, (st) => st.state && !['running', 'paused', 'rolling_back'].includes(st.state.phase), 360000);
  const peaks = await rates.stop();
  polling = false;
  await poller;
  console.log(`peaks per second during the rollout: ${Object.entries(peaks).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(', ')}`);
  // What the assertions below judge, in one line first: CI keeps only the head of the output.
  console.log(`rollout ended: ${JSON.stringify({ phase: final.state.phase, wave: final.state.wave, fired: final.state.fired,
    reason: final.state.reason, history: final.state.history?.map((h) => [h.wave, h.verdict]), killed: killed?.name,
    maxRestartingInACell, ids: [...ids], gates: final.state.gates?.filter((g) => g.fired) })}`);
  assert.ok(peaks.etcd_writes > 0, 'the sampler read etcd');
  assert.equal(final.state.phase, 'done', JSON.stringify(final.state));
  assert.deepEqual([...ids], [id], 'one rollout throughout');
  assert.ok(final.state.wave >= 3, `waves: ${final.state.wave}`);
  const startedAt = Number(id.slice(2));  // r-<ms>: when `start` wrote it
  assert.ok(firstWaveAt - startedAt >= 8000, `wave 1 started ${firstWaveAt - startedAt} ms after the start`);
  assert.equal(maxRestartingInACell, 1, 'never two nodes of a cell restarting at once');
  assert.ok(killed, 'the leader was killed mid-rollout');
  const standby = globals.find((g) => g !== killed);
  assert.match(logOf(standby.name), new RegExp(`rollout ${id} to v2: resumed`));
  for (const h of final.state.history) assert.equal(h.verdict, 'passed', JSON.stringify(h));
  // Every node is on v2, restarted exactly once, under one gen each.
  assert.equal(final.nodes.length, 6);
  for (const n of final.nodes) assert.equal(n.version, 'v2', n.name);
  for (const p of status().processes.filter((x) => x.role === 'node')) {
    assert.equal(final.acks[p.name]?.version, 'v2', p.name);
    assert.equal(nodeStarts(p.name, 'v2'), 1, `${p.name} started on v2 once`);
  }
  assert.equal(new Set(status().processes.filter((x) => x.role === 'node').map((p) => final.acks[p.name].gen)).size, 6);
  const text = await rollout('status');
  assert.match(text.stdout, new RegExp(`rollout ${id} to v2: done, wave \\d+ of \\d+, 6 of 6 live nodes on v2`));
  // The dashboard followed it: running with its count of upgraded nodes rising, then done.
  const running = dashboard.filter((r) => r.id === id && r.phase === 'running');
  assert.ok(running.length > 0, 'the dashboard showed the rollout running');
  assert.ok(running.some((r) => r.upgraded > 0 && r.upgraded < 6 && r.total === 6), JSON.stringify(running.map((r) => r.upgraded)));
  assert.ok(running.some((r) => r.nodes.length > 0), 'the dashboard listed a wave\'s nodes');
  const shown = await waitFor('the dashboard to show the rollout done', async () => {
    const r = (await fetch(`${gw}/dashboard/snapshot`).then((x) => x.json())).rollout;
    return r?.id === id && r.phase === 'done' && r.upgraded === 6 && r;
  }, 10000);
  // Its waves as the brain counted them, and the four signals of the last wave's gates.
  assert.equal(shown.wave, final.state.wave);
  assert.ok(running.some((r) => r.wave > running[0].wave), `the dashboard saw the wave advance: ${JSON.stringify(running.map((r) => r.wave))}`);
  assert.deepEqual([...new Set(shown.gates.map((g) => g.signal))].sort(),
    ['error_codes', 'heartbeat', 'step_latency', 'task_success'], JSON.stringify(shown.gates));
  // With the numbers the brain judged them by.
  for (const g of final.state.gates) {
    const d = shown.gates.find((x) => x.signal === g.signal && x.code === g.code);
    assert.ok(d, `the dashboard shows gate ${g.signal} ${g.code}`);
    assert.deepEqual([d.wave, d.rest, d.before, d.limit, d.fired], [g.upgraded, g.rest, g.before, g.limit, g.fired], g.signal);
  }
  // Each restart began with a drain, and the dashboard marked draining nodes as such.
  console.log(`the dashboard showed ${drainingSeen.size} node(s) draining: ${[...drainingSeen].join(', ')}`);
  assert.ok(drainingSeen.size > 0, 'the dashboard showed a draining node');
  for (const n of drainingSeen) assert.ok(status().processes.some((p) => p.role === 'node' && p.name === n), n);
  // Once every node is back, none is shown draining.
  await waitFor('no node draining on the dashboard', async () => {
    const snap = await fetch(`${gw}/dashboard/snapshot`).then((r) => r.json());
    const nodes = snap.cells.flatMap((c) => c.node_list);
    return nodes.length === 6 && nodes.every((n) => !n.draining);
  }, 20000);
  // The page in Chromium drew the same: the rollout running wave after wave, draining badges on
  // nodes of the cluster, then done with six of six and the gates with the brain's numbers.
  try {
    const { page } = dash;
    await page.waitForFunction(() => document.querySelector('[data-field="rollout_phase"]')?.textContent === 'done',
      null, { timeout: 10000 * SLOW });
    await page.waitForFunction(() => document.querySelectorAll('[data-field="draining"]').length === 0, null,
      { timeout: 10000 * SLOW });
    const drawn = await dash.drawn();
    console.log(`the page drew: ${JSON.stringify(drawn)}`);
    assert.ok(drawn.phases.includes('running'), JSON.stringify(drawn.phases));
    assert.ok(drawn.waves.length >= 2, `the page drew the waves advance: ${JSON.stringify(drawn.waves)}`);
    assert.ok(drawn.draining.length > 0, 'the page drew a draining badge');
    for (const n of drawn.draining) assert.ok(status().processes.some((p) => p.role === 'node' && p.name === n), n);
    assert.equal(await page.locator('[data-field="rollout_upgraded"]').textContent(), '6 of 6');
    for (const g of final.state.gates) {
      const row = await gateRow(page, g);
      assert.deepEqual(row.got, row.want, `gate ${g.signal} ${g.code ?? ''}`);
    }
    fs.mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: path.join(artifacts, 'dashboard-rollout.png'), fullPage: true });
    assert.deepEqual(dash.problems, [], 'the page logged no error');
  } finally {
    await browser.close();
  }
  // Sessions ran through it: every one completed, no tool effect repeated.
  const created = await work.stop();
  assert.ok(created.length >= 10, `sessions created during the rollout: ${created.length}`);
  console.log(`${created.length} sessions created during the rollout; ${refusals} creates refused with 503 and retried`);
  checkCompleted(await waitAll(created));
  for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
});

test('v2 -> v-bad halts after its first wave, says which gate fired with its numbers, and rolls the wave back', { timeout: 480000 * SLOW }, async () => {
  const pids = new Map(status().processes.filter((p) => p.role === 'node').map((p) => [p.name, p.pid]));
  const work = keepCreating('bad');
  const start = await rollout('start', '--version', 'v-bad', '--wave-percent', '34', '--settle', '20', '--watch-before', '5',
    '--ready-timeout', String(90 * SLOW), '--gate-min-steps', '3', '--gate-latency-ratio', '5');
  assert.equal(start.code, 0, start.stderr);
  const everBad = new Set();
  const final = await watch((st) => {
    for (const n of st.nodes) if (n.version === 'v-bad') everBad.add(n.name);
  }, (st) => st.state?.version === 'v-bad' && !['running', 'paused', 'rolling_back'].includes(st.state.phase), 300000);
  assert.equal(final.state.phase, 'halted', JSON.stringify(final.state));
  assert.equal(final.state.wave, 1, 'halted after its first wave');
  assert.match(final.state.fired, /^(error_codes \(model\)|task_success) fired: [\d.]+ on the wave vs [\d.]+ on the rest, [\d.]+ before \(limit [\d.]+\)$/);
  // Only first-wave nodes, one per cell, ever ran it; they are back on v2; no other node restarted.
  // 34% of 6 nodes is a wave of 2, one per cell.
  assert.equal(everBad.size, 2, [...everBad].join(','));
  const cells = [...everBad].map((n) => n.replace(/-node\d+$/, ''));
  assert.equal(new Set(cells).size, cells.length, 'at most one node of a cell');
  for (const n of final.nodes) assert.equal(n.version, 'v2', n.name);
  for (const p of status().processes.filter((x) => x.role === 'node'))
    if (!everBad.has(p.name)) assert.equal(p.pid, pids.get(p.name), `${p.name} was not restarted`);
  const text = await rollout('status');
  assert.match(text.stdout, /halted: (error_codes \(model\)|task_success) fired/);
  // The leading global brain exports the gates (what the rollout alert reads): the one that fired reads 1.
  await waitFor('the fired gate in the global leader\'s metrics', async () => {
    for (const b of status().processes.filter((p) => p.role === 'global' && alive(p.pid))) {
      const t = await fetch(`${b.url}/metrics`).then((r) => r.text()).catch(() => '');
      if (metricSum(t, 'armada_brain_leading') !== 1) continue;
      return final.state.gates.filter((g) => g.fired)
        .every((g) => metricSum(t, 'armada_rollout_gate_fired', `signal="${g.signal}"`) >= 1);
    }
    return false;
  }, 30000);
  await waitFor('the dashboard to show the gate that fired', async () => {
    const r = (await fetch(`${gw}/dashboard/snapshot`).then((x) => x.json())).rollout;
    return r?.phase === 'halted' && r.fired === final.state.fired && r.gates.some((g) => g.fired);
  }, 10000);
  // In Chromium: halted, the gate that fired marked, with the brain's numbers.
  browser = await chromium.launch({ executablePath: CHROMIUM });
  try {
    const { page, problems } = await openDashboard(browser);
    await page.waitForSelector('[data-field="rollout_fired"]', { timeout: 10000 * SLOW });
    assert.equal(await page.locator('[data-field="rollout_phase"]').textContent(), 'halted');
    assert.equal(await page.locator('[data-field="rollout_fired"]').textContent(), `halted: ${final.state.fired}`);
    const fired = final.state.gates.filter((g) => g.fired);
    assert.ok(fired.length > 0, JSON.stringify(final.state.gates));
    for (const g of fired) {
      const row = await gateRow(page, g);
      assert.deepEqual(row.got, row.want, `gate ${g.signal} ${g.code ?? ''}`);
    }
    assert.deepEqual(problems, [], 'the page logged no error');
  } finally {
    await browser.close();
  }
  // Sessions created after the rollback complete; a new rollout can start.
  await work.stop();
  const fresh = [];
  for (let i = 0; i < 4; i++) fresh.push(await createSession(`after ${i}`));
  checkCompleted(await waitAll(fresh));
  const next = await rollout('start', '--version', 'v3', '--wave-percent', '100');
  assert.equal(next.code, 0, next.stderr);
  const abort = await rollout('abort');
  assert.equal(abort.code, 0, abort.stderr);
  // The aborted state reads back: status says so, and another rollout may start.
  await waitFor('the abort to be carried out', async () => (await rolloutStatus()).state?.phase === 'aborted', 30000);
});

test('pause holds new restarts and resume goes on; abort --rollback takes every upgraded node back', { timeout: 300000 * SLOW }, async () => {
  const first = await rolloutStatus();
  for (const n of first.nodes) assert.equal(n.version, 'v2', n.name);
  const pidsOf = () => new Map(status().processes.filter((p) => p.role === 'node').map((p) => [p.name, p.pid]));
  // 17% of 6 nodes: one node a wave. The gates need more than this test makes, so none judges.
  const start = await rollout('start', '--version', 'v4', '--wave-percent', '17', '--settle', '2', '--watch-before', '1',
    '--ready-timeout', String(90 * SLOW), '--gate-min-steps', '100000', '--gate-min-sessions', '100000');
  assert.equal(start.code, 0, start.stderr);
  const onV4 = (st) => st.nodes.filter((n) => n.version === 'v4').map((n) => n.name);
  await watch(() => {}, (st) => onV4(st).length >= 1, 120000);
  const pause = await rollout('pause');
  assert.equal(pause.code, 0, pause.stderr);
  // Restarts asked for before the pause finish; then nothing moves.
  const held = await watch(() => {}, (st) => st.state?.phase === 'paused' &&
    Object.values(st.state.wave_nodes).every((w) => w.phase !== 'restarting'), 120000);
  assert.match((await rollout('status')).stdout, /paused/);
  const pids = pidsOf();
  const upgraded = onV4(held).length;
  // Three settle times and more, in which a running rollout would have started another wave.
  await sleep(8000);
  const still = await rolloutStatus();
  assert.equal(still.state.phase, 'paused');
  assert.deepEqual(onV4(still), onV4(held), 'no node went to v4 while paused');
  assert.deepEqual(pidsOf(), pids, 'no node restarted while paused');
  const resume = await rollout('resume');
  assert.equal(resume.code, 0, resume.stderr);
  const more = await watch(() => {}, (st) => onV4(st).length > upgraded, 120000);
  const touched = onV4(more);
  console.log(`paused at ${upgraded} node(s) on v4, resumed to ${touched.length}: ${touched.join(', ')}`);
  // Abort with rollback: every node the rollout took to v4 goes back to v2, restarted once more.
  const startsBefore = new Map(touched.map((n) => [n, nodeStarts(n, 'v2')]));
  const abort = await rollout('abort', '--rollback');
  assert.equal(abort.code, 0, abort.stderr);
  const final = await watch(() => {}, (st) => st.state?.phase === 'aborted' && onV4(st).length === 0 &&
    st.nodes.length === 6, 180000);
  for (const n of final.nodes) assert.equal(n.version, 'v2', n.name);
  for (const n of onV4(more)) assert.ok(nodeStarts(n, 'v2') > startsBefore.get(n), `${n} restarted on v2 again`);
  assert.match((await rollout('status')).stdout, /aborted/);
});
