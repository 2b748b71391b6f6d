// Two small cells from `armada cluster up --cells 2` (one node each that takes 8 sessions, so a
// cell's water level, 57% of its capacity, is 4 live sessions), real PostgreSQL, etcd, NATS and
// Redis, with the tiny model: a tenant's sessions fill its home cell up to the water level, and
// the next ones go to the other cell; with both at their level, a new session is refused. The tool server holds every call until the test releases
// it, so the sessions stay open exactly as long as the test needs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog } from './session_helpers.mjs';
import { clusterUp, etcdGet as etcdRead, sanitizerReports, sleep, waitFor } from './cluster_helpers.mjs';

const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const PER_NODE = 8;
const WATER = Math.floor(0.57 * PER_NODE);  // the default water level of a one-node cell
let tools;
let dir;
let up;
let gw;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const cellOf = (node) => node.replace(/-node\d+$/, '');

const etcdGet = (key) => etcdRead(status().servers.etcd, key);

const session = (id) => fetch(`${gw}/v1/sessions/${id}`).then((r) => r.json());

// Creates one session and waits until it is placed and its first tool call is held at the tool
// server (open, and counted live by its node); returns its cell.
async function createHeld(label) {
  const r = await fetch(`${gw}/v1/agents/worker/sessions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: label }),
  });
  const text = await r.text();
  assert.equal(r.status, 201, text);
  const { id } = JSON.parse(text);
  await waitFor(`${id}'s first tool call`, () => [...tools.arrivals.keys()].some((k) => k.startsWith(`${id}:`)));
  const s = await waitFor(`${id}'s placement`, async () => {
    const x = await session(id);
    return x.placement?.node ? x : null;
  });
  return { id, cell: cellOf(s.placement.node) };
}

before(async () => {
  tools = await startToolServer({ minDelayMs: 10, maxDelayMs: 20, hold: true });
  dir = tempDir('armada-water-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  // Held calls must not time out and be sent again while the test looks.
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1, maxSteps: 4, toolTimeoutMs: 600000 }));
  up = await clusterUp(['--cells', '2', '--nodes', '1', '--brains', '1', '--globals', '1',
    '-m', tinyModel, '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents, '--lease-ttl', String(TTL_S),
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8', '--node-arg=-c',
    '--node-arg=8192', '--node-arg=-t', '--node-arg=1', `--node-arg=--cluster-sessions=${PER_NODE}`],
  { timeoutMs: 120000 * SLOW });
  gw = up.gw;
  dir = path.join(dir, 'c');
  await waitFor('two nodes and a split naming both cells', async () => {
    const r = await fetch(gw + '/readyz').then((x) => x.json()).catch(() => null);
    return r?.nodes >= 2 && Object.keys(r.cell_weights ?? {}).length === 2;
  }, 120000);
});

after(async () => {
  tools?.release();
  await up?.stop();
  if (tools) await tools.close();
  assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('a tenant fills its home cell up to the water level; its next sessions go to the other cell; with both full, new ones wait', { timeout: 300000 * SLOW }, async () => {
  const home = [];
  for (let i = 0; i < WATER; i++) {
    const s = await createHeld(`home ${i}`);
    home.push(s);
    // The next session is sent once the split has heard of this one: the cell's report counts
    // it, and the global brain has written a split since (the tenant's home, once it has one).
    await waitFor(`cell ${s.cell} reporting ${i + 1} live`, async () =>
      JSON.parse(await etcdGet(`/armada/cells/${s.cell}/report`) ?? '{}').live_sessions === i + 1);
    await waitFor(`a split with ${s.cell} as the home`, async () =>
      Object.values(JSON.parse(await etcdGet('/armada/global/shares') ?? '{}').tenant_home ?? {}).includes(s.cell));
  }
  const cell = home[0].cell;
  assert.deepEqual(home.map((s) => s.cell), Array(WATER).fill(cell), 'the first sessions share the home cell');
  // At the water level the split says the home cell is full, and the gateway follows it.
  await waitFor(`${cell} marked full in the gateway's split`, async () =>
    (await fetch(gw + '/readyz').then((r) => r.json())).full_cells?.includes(cell));
  const spill = [];
  for (let i = 0; i < WATER; i++) {
    const s = await createHeld(`spill ${i}`);
    assert.notEqual(s.cell, cell, `${s.id} went to the full cell`);
    spill.push(s);
    await waitFor(`cell ${s.cell} reporting ${i + 1} live`, async () =>
      JSON.parse(await etcdGet(`/armada/cells/${s.cell}/report`) ?? '{}').live_sessions === i + 1);
  }
  // Both cells at their water level: the room above it is the reserve for a lost cell, so a new
  // session is refused (503, retry later) rather than placed there.
  await waitFor('both cells marked full in the gateway\'s split', async () =>
    (await fetch(gw + '/readyz').then((r) => r.json())).full_cells?.length === 2);
  const refused = await fetch(`${gw}/v1/agents/worker/sessions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: 'one too many' }),
  });
  const body = await refused.json();
  assert.equal(refused.status, 503, JSON.stringify(body));
  assert.equal(body.error.code, 'cluster_full');
  assert.ok(Number(refused.headers.get('retry-after')) > 0);
  const gm = await fetch(gw + '/metrics').then((r) => r.text());
  assert.match(gm, /^armada_gateway_sessions_refused_full_total 1$/m);
  // Released, every session finishes with a whole log, each call having had one effect.
  tools.release();
  const ids = [...home, ...spill].map((s) => s.id);
  const done = await waitFor('every session to end', async () => {
    const all = await Promise.all(ids.map(session));
    return all.every((s) => ['completed', 'failed', 'cancelled'].includes(s.state)) ? all : null;
  }, 120000);
  for (const s of done) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 1);
  }
  for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
});
