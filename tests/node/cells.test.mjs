// Two cells of two nodes from `armada cluster up --cells 2` (real PostgreSQL, etcd, NATS and
// Redis, one brain per cell, two global brains, a gateway), with the tiny model: a tenant's
// sessions land in one cell; losing the global leader changes nothing; losing a whole cell
// (kill -9 of its brain and nodes) re-homes its sessions to the other, where all of them finish,
// each re-home a `migrate` span of the global brain in the session's trace (to a small OTLP
// collector).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog, assertNoFinishedCallRepeated } from './session_helpers.mjs';
import { alive, assertLintedMetrics, chatTurn, clusterUp, etcdGet as etcdRead, etcdKv, metricSum, redisCommand, sanitizerReports, sleep, waitFor } from './cluster_helpers.mjs';

// Sanitizer builds (ARMADA_TIMING=0) run several times slower: a longer lease keeps their slow
// processes from losing it without a fault, and time bounds are not judged there.
const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const ENDED = ['completed', 'failed', 'cancelled'];
let tools;
let otlp;
let dir;
let up;
let gw;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const logOf = (name) => fs.readFileSync(status().processes.find((p) => p.name === name).log, 'utf8');
const cellOf = (node) => node.replace(/-node\d+$/, '');

const etcdGet = (key) => etcdRead(status().servers.etcd, key);

// Each session in a trace of its own, which the client starts (`traces` maps id → trace id).
async function createSessions(n, label, pauseMs = 0, traces = null) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    if (i > 0 && pauseMs) await sleep(pauseMs);
    const traceId = crypto.randomBytes(16).toString('hex');
    const headers = { 'Content-Type': 'application/json' };
    if (traces) headers.traceparent = `00-${traceId}-${crypto.randomBytes(8).toString('hex')}-01`;
    const r = await fetch(`${gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers, body: JSON.stringify({ input: `${label} ${i}` }),
    });
    const text = await r.text();
    assert.equal(r.status, 201, text);
    ids.push(JSON.parse(text).id);
    if (traces) traces.set(ids.at(-1), traceId);
  }
  return ids;
}

async function sessionsNow(ids) {
  const out = new Map();
  await Promise.all(ids.map(async (id) => {
    const r = await fetch(`${gw}/v1/sessions/${id}`);
    if (r.status === 200) out.set(id, await r.json());
  }));
  return out;
}

async function waitAll(ids, timeoutMs = 240000) {
  const deadline = Date.now() + timeoutMs * SLOW;
  for (;;) {
    const now = await sessionsNow(ids);
    const done = [...now.values()].filter((s) => ENDED.includes(s.state));
    if (done.length === ids.length) return new Map(done.map((s) => [s.id, s]));
    if (Date.now() > deadline) throw new Error(`only ${done.length} of ${ids.length} sessions ended`);
    await sleep(500);
  }
}

async function waitPlaced(ids, minSteps = 0) {
  const deadline = Date.now() + 120000 * SLOW;
  for (;;) {
    const now = await sessionsNow(ids);
    const placed = [...now.values()].filter((s) => s.placement?.node && s.steps.length >= minSteps);
    if (placed.length === ids.length) return now;
    if (Date.now() > deadline) throw new Error(`only ${placed.length} of ${ids.length} sessions were placed`);
    await sleep(250);
  }
}

// Every arrival at the tool server counts, not only the first per key: a call may come again
// only if it had not finished when a fault (`kills`, their times) began.
function checkDone(done, kills = []) {
  for (const s of done.values()) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 3);
    for (const st of s.steps.filter((x) => x.kind === 'tool_call'))
      assert.equal(tools.effects.get(st.idempotency_key), 1, `effects of ${st.idempotency_key}`);
  }
  for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
  const mine = new Set([...done.values()].flatMap((s) => s.steps.map((x) => x.idempotency_key).filter(Boolean)));
  const replays = new Map([...tools.replays].filter(([k]) => mine.has(k)));
  assertNoFinishedCallRepeated({ ...tools, replays }, [...done.values()], kills);
}

before(async () => {
  tools = await startToolServer({ minDelayMs: 800, maxDelayMs: 1200 });
  otlp = await startOtlpReceiver();
  dir = tempDir('armada-cells-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 3, maxSteps: 6, toolTimeoutMs: 3000 * SLOW }));
  up = await clusterUp(['--cells', '2', '--nodes', '2', '--brains', '1', '--gateways', '2', '-m', tinyModel,
    '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents, '--lease-ttl', String(TTL_S),
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8', '--node-arg=-c',
    '--node-arg=16384', '--node-arg=-t', '--node-arg=1'], {
    timeoutMs: 120000 * SLOW, env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint },
  });
  gw = up.gw;
  dir = path.join(dir, 'c');
  // Ready: four nodes, and the gateway follows a split of the global brain's that names both cells.
  const deadline = Date.now() + 120000 * SLOW;
  for (;;) {
    const r = await Promise.all(status().gateways.map((g) => fetch(g + '/readyz').then((x) => x.json()).catch(() => null)));
    if (r.length === 2 && r.every((x) => x?.nodes >= 4 && Object.keys(x.cell_weights ?? {}).length === 2)) break;
    if (Date.now() > deadline) throw new Error(`the cluster never had 4 nodes and shares:\n${up.log()}`);
    await sleep(250);
  }
});

after(async () => {
  await up?.stop();
  if (tools) await tools.close();
  if (otlp) await otlp.close();
  assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('chat turns of one conversation stay on one node through either gateway; the binding is in Redis and each turn renews its TTL', { timeout: 120000 * SLOW }, async () => {
  const gws = status().gateways;
  assert.equal(gws.length, 2);
  const nodes = status().processes.filter((p) => p.role === 'node' && alive(p.pid));
  assert.equal(nodes.length, 4);
  const turn = (g, messages) => chatTurn(g, nodes, messages);
  const redis = status().servers.redis;
  const bindings = async () => new Set(await redisCommand(redis, 'KEYS', 'armada:t:*:affinity:*'));
  const firsts = new Set();
  for (let c = 0; c < 6; c++) {
    const messages = [{ role: 'system', content: `You are assistant ${c} of the cells test.` },
      { role: 'user', content: `Begin ${c}` }];
    const known = await bindings();
    const first = await turn(gws[c % 2], messages);
    firsts.add(first.node);
    // One new key in Redis binds the conversation; its TTL is the gateways' (600 s by default).
    const key = [...await bindings()].filter((k) => !known.has(k));
    assert.equal(key.length, 1, `one binding for conversation ${c}: ${key}`);
    assert.ok(key[0].startsWith('armada:t:'), key[0]);
    const ttl1 = await redisCommand(redis, 'PTTL', key[0]);
    assert.ok(ttl1 > 0 && ttl1 <= 600000, `TTL ${ttl1}`);
    await sleep(2000);
    // The next turn goes through the other gateway, to the same node, and starts the TTL again.
    messages.push({ role: 'assistant', content: first.reply }, { role: 'user', content: 'Go on' });
    const next = await turn(gws[(c + 1) % 2], messages);
    assert.equal(next.node, first.node, `turn 2 of conversation ${c}, through the other gateway`);
    const ttl2 = await redisCommand(redis, 'PTTL', key[0]);
    // Unrenewed, it would have lost the 2 s waited since; renewed, about what the turn took.
    assert.ok(ttl2 > ttl1 - 1000, `the turn renewed the binding: ${ttl1} then ${ttl2} ms`);
  }
  // By load alone four nodes of equal room spread them: the binding is what keeps each together.
  assert.ok(firsts.size >= 2, `conversations started on ${[...firsts]}`);
});

test('a tenant\'s new sessions land in one cell (its home while under water)', { timeout: 240000 * SLOW }, async () => {
  // Spaced out, so that nodes report the room each one takes: going by room alone, they would
  // spread over both cells.
  const ids = await createSessions(6, 'home', 1500);
  const placed = await waitPlaced(ids);
  const cells = new Set([...placed.values()].map((s) => cellOf(s.placement.node)));
  assert.equal(cells.size, 1, `one cell, in creation order: ${ids.map((id) => cellOf(placed.get(id).placement.node))}`);
  checkDone(await waitAll(ids));
  // The cell's report, which the global brain splits by, has its cores and its step latency.
  const home = [...cells][0];
  const report = JSON.parse(await etcdGet(`/armada/cells/${home}/report`));
  assert.equal(report.nodes, 2, JSON.stringify(report));
  assert.equal(report.cores, 2, JSON.stringify(report));  // -t 1 on each node
  assert.ok(report.step_ms > 0, JSON.stringify(report));
  // The leading global brain hears each cell by both paths: etcd, and pushed on NATS.
  const globals = status().processes.filter((p) => p.role === 'global').map((p) => logOf(p.name)).join('');
  for (const c of ['cell0', 'cell1']) assert.match(globals, new RegExp(`cell ${c} reports through etcd and NATS`));
});

test('kill -9 the leading global brain: a standby leads, the split stays, sessions go on', { timeout: 240000 * SLOW }, async () => {
  const globals = status().processes.filter((p) => p.role === 'global' && alive(p.pid));
  assert.equal(globals.length, 2);
  const leads = (g) => logOf(g.name).includes('leads');
  const leader = globals.find(leads);
  assert.ok(leader, 'a global brain leads');
  const standby = globals.find((g) => g !== leader);
  // Each global brain serves its metrics, which pass Prometheus' lint; the leader says it leads.
  for (const g of globals) {
    const text = await fetch(`${g.url}/metrics`).then((x) => x.text());
    assertLintedMetrics(text, g.name);
    assert.match(text, new RegExp(`^armada_brain_leading ${g === leader ? 1 : 0}$`, 'm'), g.name);
    if (g !== leader) continue;
    // The leader watches etcd's size (its history compacted, under its quota).
    assert.ok(metricSum(text, 'armada_etcd_db_bytes') > 0, 'the leader exports etcd\'s size');
    assert.ok(metricSum(text, 'armada_etcd_db_in_use_bytes') > 0);
    // The leader's chain survival: per cell and for the cluster, which is the cells together. It
    // sums what the cells' brains report of their ended sessions (each reads its rows every 5 s):
    // the sessions of the tests before show there once their cells have reported them.
    const survival = await waitFor('the sessions of the tests before in the leader\'s survival', async () => {
      const t = await fetch(`${g.url}/metrics`).then((x) => x.text());
      return metricSum(t, 'armada_cluster_sessions_ended', 'outcome="completed"') > 0 ? t : null;
    }, 20000);
    const ended = (labels) => metricSum(survival, 'armada_cell_sessions_ended', labels);
    const all = (o) => metricSum(survival, 'armada_cluster_sessions_ended', `outcome="${o}"`);
    for (const o of ['completed', 'failed', 'timed_out', 'lost', 'cancelled'])
      assert.equal(all(o), ended(`outcome="${o}"`), `the cluster's ${o} is its cells' sum`);
    assert.ok(all('completed') > 0, 'sessions of the tests before completed');
    const decided = all('completed') + all('failed') + all('timed_out') + all('lost');
    assert.ok(Math.abs(metricSum(survival, 'armada_cluster_chain_survival_ratio') - all('completed') / decided) < 1e-9);
  }
  // Sessions already running when the leader dies go on, as do new ones.
  const running = await createSessions(4, 'running');
  await waitPlaced(running, 1);
  const followed = async () => Promise.all(status().gateways.map((g) => fetch(g + '/readyz').then((x) => x.json())));
  const before = await etcdGet('/armada/global/shares');
  process.kill(leader.pid, 'SIGKILL');
  const t0 = Date.now();
  // While no global brain leads (the dead one's lease outlives it by the TTL), the split stays
  // exactly as it was, in etcd and in every gateway: nothing waits on a brain.
  assert.ok(before, 'there was a split before');
  // Written without a lease, the split outlives its writer (a leased key would go with it).
  assert.equal((await etcdKv(status().servers.etcd, '/armada/global/shares')).lease, 0);
  const atKill = await etcdGet('/armada/global/shares');
  await sleep(1500);  // a window, under the TTL, in which nothing may change
  const whileLeaderless = await followed();
  const stillThere = await etcdGet('/armada/global/shares');
  assert.ok(!leads(standby), 'read before the standby leads');
  assert.equal(stillThere, atKill, 'etcd keeps the split');
  for (const r of whileLeaderless)
    assert.deepEqual(r.cell_weights, JSON.parse(atKill).weight, 'a gateway follows the split it had');
  const ids = [...running, ...await createSessions(6, 'global')];
  while (!leads(standby) && Date.now() - t0 < 20000 * SLOW) await sleep(100);
  assert.ok(leads(standby), 'the standby leads');
  console.log(`kill -9 ${leader.name}: ${standby.name} leads after ${Date.now() - t0} ms`);
  if (timing) assert.ok(Date.now() - t0 <= TTL_S * 1000 + 2000, `within the TTL + 2 s: ${Date.now() - t0} ms`);
  const cellsIn = (text) => Object.keys(JSON.parse(text).weight ?? {}).sort().join(',');
  const afterText = await etcdGet('/armada/global/shares');
  assert.ok(afterText, 'the split is still there');
  assert.equal(cellsIn(afterText), cellsIn(before), 'the split names the same cells');
  assert.equal(cellsIn(before), 'cell0,cell1');
  checkDone(await waitAll(ids));
});

test('kill -9 every process of a cell: its sessions are re-homed to the other and all 64 complete', { timeout: 400000 * SLOW }, async () => {
  const traces = new Map();
  const ids = await createSessions(64, 'lose', 0, traces);
  const placed = await waitPlaced(ids, 3);
  const count = new Map();
  for (const s of placed.values()) count.set(cellOf(s.placement.node), (count.get(cellOf(s.placement.node)) ?? 0) + 1);
  const victim = [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
  const spansOf = (id) => otlp.spans.filter((x) => x.attributes['armada.session.id'] === id ||
    x.attributes['gen_ai.conversation.id'] === id);
  const exportedThere = (id) => spansOf(id).some((x) => x.name.startsWith('chat') &&
    cellOf(x.attributes['armada.node'] ?? '') === victim);
  // A node sends its spans each second, and a SIGKILL loses what it has not sent: the kill waits
  // until most of the cell's sessions have a step there exported.
  const inVictim = [...placed.values()].filter((s) => cellOf(s.placement.node) === victim).map((s) => s.id);
  await waitFor(`steps in ${victim} exported`, () => inVictim.filter(exportedThere).length >= inVictim.length * 0.75,
    30000);
  const atKill = await sessionsNow(inVictim);
  const theirs = inVictim.filter((id) => {
    const s = atKill.get(id);
    return s && !ENDED.includes(s.state) && cellOf(s.placement?.node ?? '') === victim;
  });
  assert.ok(theirs.length > 0, 'the lost cell held open sessions');
  const t0 = Date.now();
  for (const p of status().processes.filter((x) => x.name.startsWith(`${victim}-`))) process.kill(p.pid, 'SIGKILL');
  const done = await waitAll(ids);
  checkDone(done, [t0]);
  // A call sent again went out with the same key, and only because it was in flight at the kill.
  assertNoFinishedCallRepeated(tools, [...done.values()], [t0]);
  // Each of its open sessions finished in the other cell, and its next step after the kill was
  // taken there.
  const next = [];
  for (const id of theirs) {
    const s = done.get(id);
    assert.notEqual(cellOf(s.placement.node), victim, `${id} stayed in the lost cell`);
    const after = s.steps.map((x) => x.data?.started_ms ?? x.ts_ms).filter((x) => x > t0 + 1000);
    for (const [k, at] of tools.arrivals) if (k.startsWith(`${id}:`)) after.push(...at.filter((x) => x > t0 + 1000));
    assert.ok(after.length > 0, `${id} took no step after the kill`);
    next.push(Math.min(...after) - t0);
  }
  next.sort((a, b) => a - b);
  console.log(`kill -9 cell ${victim}: ${theirs.length} sessions re-homed; next step after ms p50 ` +
    `${next[next.length >> 1]} max ${next.at(-1)}`);
  const g = status().processes.filter((p) => p.role === 'global').map((p) => logOf(p.name)).join('');
  assert.match(g, new RegExp(`re-homed \\d+ session\\(s\\) of lost cell ${victim}`));
  // The global brains count those re-homes as decisions, and time them.
  let rehomes = 0;
  let timed = 0;
  for (const p of status().processes.filter((x) => x.role === 'global' && alive(x.pid))) {
    const text = await fetch(`${p.url}/metrics`).then((x) => x.text());
    rehomes += metricSum(text, 'armada_brain_decisions_total', 'kind="rehome"');
    timed += metricSum(text, 'armada_brain_decision_seconds_count');
    assert.equal(metricSum(text, 'armada_brain_decision_seconds_bucket', 'le="+Inf"'),
      metricSum(text, 'armada_brain_decision_seconds_count'), p.name);
  }
  assert.ok(rehomes > 0 && timed > 0, `${rehomes} re-homes counted, in ${timed} timed rounds`);
  // Each re-home is a `migrate` span of the global brain in the trace the client started; the
  // other cell's `place` is its child, and the turn that goes on there a child of that.
  let parentSeen = 0;
  for (const id of theirs) {
    const other = cellOf(done.get(id).placement.node);
    const mig = await waitFor(`the re-home span of ${id}`, () => spansOf(id).find((x) => x.name === 'migrate' &&
      x.service === 'armada-global'), 20000);
    assert.equal(mig.traceId, traces.get(id), `${id}: the re-home is in the session's trace`);
    // Its parent is the session's turn in the lost cell. That turn never ended (its node was
    // killed), but the steps it took there did, as its children.
    const step = spansOf(id).find((x) => x.name.startsWith('chat') && cellOf(x.attributes['armada.node'] ?? '') === victim);
    if (step) {
      assert.equal(mig.parentSpanId, step.parentSpanId, `${id}: the re-home is a child of its turn in ${victim}`);
      ++parentSeen;
    }
    assert.deepEqual([mig.attributes['armada.cell.from'], mig.attributes['armada.cell']], [victim, other]);
    const place = await waitFor(`the place span of ${id} in ${other}`, () => spansOf(id).find((x) =>
      x.name === 'place' && x.service === 'armada-cell' && x.attributes['armada.cell'] === other), 20000);
    assert.equal(place.traceId, mig.traceId);
    assert.equal(place.parentSpanId, mig.spanId, `${id}: the new cell's place is a child of the re-home`);
    const turn = await waitFor(`the turn of ${id} in ${other}`, () => spansOf(id).find((x) =>
      x.name.startsWith('invoke_agent') && cellOf(x.attributes['armada.node'] ?? '') === other), 20000);
    assert.equal(turn.parentSpanId, place.spanId, `${id}: the turn in ${other} is a child of its place`);
  }
  // Every one took steps in the lost cell for seconds before the kill; spans leave each second.
  assert.ok(parentSeen >= theirs.length / 2, `the lost cell's steps of ${parentSeen} of ${theirs.length} sessions were exported`);
});
