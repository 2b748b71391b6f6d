// Rebalancing with live migration: one cell of two nodes with a small KV budget. node1 is stopped
// past its lease while sessions start, so node0 takes them all and passes its KV watermark. When
// node1 is back, node0 offers sessions (a few a second) and the brain moves them to node1 with
// their KV: "compact or migrate, never let the OOM killer choose". Every session still completes
// with one effect per tool call. Each move is a `migrate` span of the cell brain (to a small OTLP
// collector), and the brain's JSON log line about it names the session and its trace.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog } from './session_helpers.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';
import { alive, clusterUp, metricSum, sleep, waitFor } from './cluster_helpers.mjs';

const SLOW = process.env.ARMADA_TIMING === '0' ? 4 : 1;
const SESSIONS = 8;
let tools;
let dir;
let cluster;
let stopped = 0;
let otlp;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const node = (suffix) => status().processes.find((p) => p.role === 'node' && p.name.endsWith(suffix));
const nodesInGateway = async () => (await fetch(cluster.gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes;

before(async () => {
  tools = await startToolServer({ hold: true });
  otlp = await startOtlpReceiver();
  const root = tempDir('armada-rebalance-');
  fs.chmodSync(root, 0o755);
  dir = path.join(root, 'c');
  const agents = writeAgents(root, agentYaml(tools.url, { toolSteps: 1, maxSteps: 4, toolTimeoutMs: 120000 * SLOW }));
  cluster = await clusterUp(['--nodes', '2', '--brains', '1', '-m', tinyModel, '--data-dir', dir, '--port', '0',
    '--agents', agents, '--lease-ttl', String(3 * SLOW), '--node-arg=--tool-allow', '--node-arg=127.0.0.1',
    '--node-arg=-np', '--node-arg=4', '--node-arg=-c', '--node-arg=4096', '--node-arg=-t', '--node-arg=1',
    '--node-arg=--kv-budget', '--node-arg=2.5M', '--node-arg=--kv-rebalance-at', '--node-arg=0.4'], {
    timeoutMs: 120000 * SLOW,
    env: { ...process.env, OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint, ARMADA_LOG_FORMAT: 'json' },
  });
  await waitFor('two nodes', async () => (await nodesInGateway()) === 2, 120000);
});

after(async () => {
  if (stopped && alive(stopped)) process.kill(stopped, 'SIGCONT');
  if (cluster) await cluster.stop();
  if (tools) await tools.close();
  if (otlp) await otlp.close();
});

test('a node past its KV watermark moves sessions with their KV to a node with room', { timeout: 300000 * SLOW }, async () => {
  const n0 = node('node0'), n1 = node('node1');
  // node1 leaves the cell's view: every new session goes to node0.
  process.kill(n1.pid, 'SIGSTOP');
  stopped = n1.pid;
  await waitFor('node1 out of the view', async () => (await nodesInGateway()) === 1, 60000);
  const ids = [];
  for (let i = 0; i < SESSIONS; i++) {
    const input = `Task ${i}: ` + Array.from({ length: 200 }, (_, k) => ['alpha', 'beta', 'gamma', 'delta'][(k + i) % 4]).join(' ');
    const r = await fetch(`${cluster.gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input }),
    });
    const text = await r.text();
    assert.equal(r.status, 201, text);
    ids.push(JSON.parse(text).id);
  }
  // All of them at their tool call (held), on node0.
  await waitFor('every tool call', async () =>
    ids.every((id) => [...tools.arrivals.keys()].some((k) => k.startsWith(`${id}:`))), 120000);
  const m0 = await fetch(`${n0.url}/metrics`).then((r) => r.text());
  console.log(`node0 KV: budget ${metricSum(m0, 'armada_kv_budget_bytes')} bytes, ` +
    `used ${metricSum(m0, 'armada_kv_bytes_used')}, parked ${metricSum(m0, 'armada_kv_parked_bytes')}`);
  // node1 is back, with room.
  process.kill(n1.pid, 'SIGCONT');
  stopped = 0;
  await waitFor('node1 back', async () => (await nodesInGateway()) === 2, 60000);
  // node0 offers sessions while its KV is high; they wait for their tools to return.
  await waitFor('an offer', async () => /offered for a move/.test(fs.readFileSync(n0.log, 'utf8')), 30000);
  tools.release();
  const done = new Map();
  await waitFor('every session', async () => {
    for (const id of ids) {
      if (done.has(id)) continue;
      const s = await fetch(`${cluster.gw}/v1/sessions/${id}`).then((r) => r.json());
      if (['completed', 'failed', 'cancelled'].includes(s.state)) done.set(id, s);
    }
    return done.size === ids.length;
  }, 180000);
  let moved = 0;
  const movedIds = [];
  for (const s of done.values()) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 1);
    const moves = s.placement.moves;
    if (moves.length === 0) {
      assert.equal(s.placement.node, n0.name, `${s.id} stayed`);
      continue;
    }
    assert.equal(moves.length, 1, JSON.stringify(moves));
    assert.deepEqual([moves[0].from, moves[0].to], [n0.name, n1.name]);
    assert.equal(moves[0].kv_source, 'transfer', JSON.stringify(moves[0]));
    const at = s.steps.findIndex((x) => x.seq === moves[0].seq);
    const next = s.steps.slice(at + 1).find((x) => x.kind === 'model_output');
    assert.equal(next.data.kv_source, 'journal', `${s.id} resumed from the moved KV: ${JSON.stringify(next.data)}`);
    movedIds.push(s.id);
    ++moved;
  }
  // No tool call was sent twice: the tool server would answer a repeat from its store (one
  // effect), so the repeats are counted themselves.
  assert.deepEqual([...tools.replays.keys()], [], 'no tool call sent again');
  for (const [k, at] of tools.arrivals) assert.equal(at.length, 1, `key ${k} arrived ${at.length} times`);
  console.log(`rebalance: ${moved} of ${SESSIONS} sessions moved from ${n0.name} to ${n1.name} with their KV`);
  assert.ok(moved >= 1, 'a session moved');
  assert.ok(moved < SESSIONS, 'not every session moved: only while node0 was past its watermark');

  // The brain's hop of each move: a `migrate` span naming the session and where it went, in the
  // session's trace (a child of its turn on node0, which hands the turn on, and the parent of the
  // turn that goes on on node1), and its log line about the move, which carries the session and
  // that span's trace.
  const brain = status().processes.find((p) => p.role === 'cell');
  const lines = fs.readFileSync(brain.log, 'utf8').split('\n').filter((l) => l.trim() !== '');
  const json = lines.map((l) => { try { return JSON.parse(l); } catch { return null; } });
  assert.deepEqual(lines.filter((l, i) => !json[i]), [], 'every line of the brain\'s log is JSON');
  for (const id of movedIds) {
    const span = await waitFor(`the migrate span of ${id}`, async () => otlp.spans.find((x) =>
      x.name === 'migrate' && x.attributes['armada.session.id'] === id), 20000);
    assert.equal(span.service, 'armada-cell');
    assert.equal(span.attributes['armada.node'], n1.name);
    assert.equal(span.attributes['armada.node.from'], n0.name);
    assert.equal(span.attributes['armada.cell'], 'cell0');
    const turn = (node) => otlp.spans.find((x) => x.service === 'armada-node' && x.name.startsWith('invoke_agent') &&
      x.attributes['gen_ai.conversation.id'] === id && x.attributes['armada.node'] === node);
    const left = await waitFor(`the turn of ${id} on node0`, async () => turn(n0.name), 20000);
    assert.equal(left.attributes['armada.handed_off'], true, JSON.stringify(left.attributes));
    assert.notEqual(left.status?.code, 2, `the turn handed on is no error: ${JSON.stringify(left.status)}`);
    assert.equal(span.traceId, left.traceId, 'the move is in the session\'s trace');
    assert.equal(span.parentSpanId, left.spanId, 'the move is a child of the turn it interrupts');
    const goes = await waitFor(`the turn of ${id} on node1`, async () => turn(n1.name), 20000);
    assert.equal(goes.traceId, span.traceId);
    assert.equal(goes.parentSpanId, span.spanId, 'the turn on node1 is a child of the move');
    const line = json.find((j) => j?.session_id === id && /moves from .* with its KV/.test(j.msg));
    assert.ok(line, `the brain logged the move of ${id} with its id`);
    assert.equal(line.trace_id, span.traceId);
  }
});
