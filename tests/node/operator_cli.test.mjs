// The operator's CLI against a gateway (`armada sessions|agents|tenants ...`, `armada cluster
// status`): each verb as a table and with --json, the key from the environment, and clear errors
// for a gateway that is not there and a key it refuses. One cell of one node.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { clusterUp, sanitizerReports, waitFor } from './cluster_helpers.mjs';

let dir, cluster, gw;
const ADMIN_KEY = 'sk-ops';

// Runs `armada ARGS` with the key in the environment; resolves { code, stdout, stderr }.
function armada(args, { key = ADMIN_KEY, gateway } = {}) {
  const env = { ...process.env, ARMADA_GATEWAY: gateway ?? gw };
  delete env.ARMADA_API_KEY;
  if (key) env.ARMADA_API_KEY = key;
  return new Promise((resolve) => {
    const p = spawn(process.env.ARMADA_BIN, args, { env });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    p.on('exit', (code) => resolve({ code, stdout, stderr }));
  });
}
const ok = async (args, opts) => {
  const r = await armada(args, opts);
  assert.equal(r.code, 0, `armada ${args.join(' ')}: ${r.stderr}${r.stdout}`);
  return r.stdout;
};
const okJson = async (args, opts) => JSON.parse(await ok([...args, '--json'], opts));

before(async () => {
  dir = tempDir('armada-operator-');
  fs.chmodSync(dir, 0o755);
  fs.writeFileSync(path.join(dir, 'agents.yaml'), `agents:
  - id: talker
    instructions: Answer briefly.
    answer_without_tools: true
    limits: { max_steps: 2, max_tokens_per_step: 8 }
`);
  cluster = await clusterUp(['--nodes', '1', '--brains', '1', '-m', tinyModel, '--port', '0', '--api-key', ADMIN_KEY,
    '--data-dir', path.join(dir, 'c'), '--agents', path.join(dir, 'agents.yaml'),
    '--node-arg=-np', '--node-arg=4', '--node-arg=-c', '--node-arg=2048']);
  gw = cluster.gw;
  await waitFor('a node in the cluster', async () =>
    (await fetch(gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes >= 1, 120000);
});

after(async () => {
  if (cluster) await cluster.stop();
  assert.deepEqual(sanitizerReports(path.join(dir, 'c', 'logs')), [], 'no process logged a sanitizer report');
});

test('tenants create, list and keys: a new key is printed once and then listed by its prefix', async () => {
  assert.match(await ok(['tenants', 'create', 'acme', '--rpm', '600']), /tenant acme created/);
  const table = await ok(['tenants', 'list']);
  assert.match(table, /^NAME\s+RPM\s+TPM\s+LIVE SESSIONS\s+KV BYTES\s+CREATED$/m);
  assert.match(table, /^acme\s+600\s+0\s+0\s+/m);
  const listed = await okJson(['tenants', 'list']);
  assert.equal(listed.data.find((t) => t.name === 'acme').requests_per_minute, 600);
  const made = await okJson(['tenants', 'keys', 'acme', '--new']);
  assert.match(made.key, /^sk-armada-[0-9a-f]+$/);
  const keys = await ok(['tenants', 'keys', 'acme']);
  assert.ok(keys.includes(made.id) && keys.includes(made.prefix), keys);
  assert.ok(!keys.includes(made.key), 'the key itself is not shown again');
  // A second tenant's keys are not among acme's.
  await ok(['tenants', 'create', 'beta']);
  await ok(['tenants', 'keys', 'beta', '--new']);
  assert.equal((await okJson(['tenants', 'keys', 'acme'])).data.length, 1);
  const dup = await armada(['tenants', 'create', 'acme']);
  assert.equal(dup.code, 1);
  assert.match(dup.stderr, /^error: POST \/admin\/tenants: HTTP 409: /m);
});

test('agents apply -f, list, show and delete, with a tenant key', async () => {
  const key = (await okJson(['tenants', 'keys', 'acme', '--new'])).key;
  const file = path.join(dir, 'helper.yaml');
  fs.writeFileSync(file, 'id: helper\ninstructions: Help.\nanswer_without_tools: true\nlimits: { max_steps: 2, max_tokens_per_step: 8 }\n');
  assert.match(await ok(['agents', 'apply', '-f', file], { key }), /agent helper applied/);
  const table = await ok(['agents', 'list'], { key });
  assert.match(table, /^ID\s+MODEL\s+TOOLS\s+TENANT$/m);
  assert.match(table, /^helper\s/m);
  assert.match(table, /^talker\s/m, 'the operator\'s agents are shared');
  assert.equal((await okJson(['agents', 'show', 'helper'], { key })).id, 'helper');
  assert.match(await ok(['agents', 'show', 'helper'], { key }), /^id:\s+helper$/m);
  assert.match(await ok(['agents', 'delete', 'helper'], { key }), /agent helper deleted/);
  const gone = await armada(['agents', 'show', 'helper'], { key });
  assert.equal(gone.code, 1);
  assert.match(gone.stderr, /HTTP 404/);
  const missing = await armada(['agents', 'apply', '-f', path.join(dir, 'nope.yaml')], { key });
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /cannot read .*nope\.yaml/);
});

test('sessions list, show, events and cancel: the tenant sees its own sessions only', async () => {
  const key = (await okJson(['tenants', 'keys', 'acme', '--new'])).key;
  const other = (await okJson(['tenants', 'keys', 'beta', '--new'])).key;
  const create = async (k) => {
    const r = await fetch(`${gw}/v1/agents/talker/sessions`, {
      method: 'POST', headers: { Authorization: `Bearer ${k}`, 'Content-Type': 'application/json' }, body: '{"input":"hi"}' });
    const j = await r.json();
    assert.equal(r.status, 201, JSON.stringify(j));
    return j.id;
  };
  const first = await create(key);
  const second = await create(key);
  const theirs = await create(other);
  await waitFor('the first session to end', async () =>
    ['completed', 'failed'].includes((await okJson(['sessions', 'show', first], { key })).state), 120000);
  const listed = await okJson(['sessions', 'list'], { key });
  const ids = listed.data.map((s) => s.id);
  assert.ok(ids.includes(first) && ids.includes(second), ids.join(','));
  assert.ok(!ids.includes(theirs), 'another tenant\'s session is not listed');
  assert.ok(ids.indexOf(second) < ids.indexOf(first), 'newest first');
  const table = await ok(['sessions', 'list'], { key });
  assert.match(table, /^ID\s+AGENT\s+STATE\s+CELL\s+NODE\s+CREATED$/m);
  assert.match(table, new RegExp(`^${first}\\s+talker\\s+(completed|failed)\\s`, 'm'));
  const done = await okJson(['sessions', 'list', '--state', 'completed', '--limit', '1'], { key });
  assert.ok(done.data.length <= 1 && done.data.every((s) => s.state === 'completed'));
  const bad = await armada(['sessions', 'list', '--state', 'sleeping'], { key });
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /state must be one of/);
  assert.match(await ok(['sessions', 'show', first], { key }), new RegExp(`^id:\\s+${first}$`, 'm'));
  const notMine = await armada(['sessions', 'show', theirs], { key });
  assert.equal(notMine.code, 1);
  assert.match(notMine.stderr, /HTTP 404/);
  // Events: a line each, and as JSON lines.
  const events = await ok(['sessions', 'events', first], { key });
  assert.ok(events.trim().split('\n').length >= 2, events);
  const lines = (await ok(['sessions', 'events', first, '--json'], { key })).trim().split('\n').map((l) => JSON.parse(l));
  const ended = lines.filter((e) => e.event === 'state' && ['completed', 'failed'].includes(e.data?.state));
  assert.equal(ended.length, 1, JSON.stringify(lines));
  assert.match(events, /^\d+\s+state\s+\{"state":"(completed|failed)"\}$/m);
  // A session waiting for input (created without any) stays open until it is cancelled.
  const r = await fetch(`${gw}/v1/agents/talker/sessions`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' }, body: '{}' });
  assert.equal(r.status, 201);
  const waiting = (await r.json()).id;
  await waitFor('the waiting session placed', async () =>
    (await okJson(['sessions', 'show', waiting], { key })).state === 'waiting_input', 30000);
  assert.match(await ok(['sessions', 'cancel', waiting], { key }), new RegExp(`^session ${waiting} cancelled$`, 'm'));
  assert.equal((await okJson(['sessions', 'show', waiting], { key })).state, 'cancelled');
  const theirsCancel = await armada(['sessions', 'cancel', theirs], { key });
  assert.equal(theirsCancel.code, 1, 'another tenant\'s session cannot be cancelled');
  assert.match(theirsCancel.stderr, /HTTP 404/);
});

test('cluster status: the cell with its leader and nodes, and the rollout, in one table', async () => {
  await waitFor('the cell\'s report with its leader', async () =>
    (await okJson(['cluster', 'status'])).cells?.some((c) => c.leader), 30000);
  const s = await ok(['cluster', 'status']);
  assert.match(s, /^1 cells, 1 nodes, \d+ live sessions, \d+ queued$/m);
  assert.match(s, /^CELL\s+LEADER\s+NODES\s+LIVE\s+FREE\s+QUEUED\s+KV\s+NODE NAMES$/m);
  assert.match(s, /^cell0\s+\S+\s+1\s+\d+\s+\d+\s+\d+\s+\S+\s+\S+$/m);
  assert.match(s, /^no rollout$/m);
  const j = await okJson(['cluster', 'status']);
  assert.equal(j.cells.length, 1);
  assert.equal(j.cells[0].node_list.length, 1);
});

test('a gateway that is not there, and a key it refuses, are told plainly', async () => {
  const port = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
  const gone = await armada(['sessions', 'list'], { gateway: `http://127.0.0.1:${port}` });
  assert.equal(gone.code, 1);
  assert.match(gone.stderr, new RegExp(`^error: cannot reach the gateway at http://127\\.0\\.0\\.1:${port}: .*\\(is it running\\? --gateway or ARMADA_GATEWAY names it\\)$`, 'm'));
  const refused = await armada(['tenants', 'list'], { key: 'sk-nobody' });
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, /refused the key \(HTTP 401\): it does not know this key; check --api-key or ARMADA_API_KEY/);
  const none = await armada(['agents', 'list'], { key: null });
  assert.equal(none.code, 1);
  assert.match(none.stderr, /refused the key \(HTTP 401\): give one with --api-key or ARMADA_API_KEY/);
  const tenantKey = (await okJson(['tenants', 'keys', 'acme', '--new'])).key;
  const notAdmin = await armada(['tenants', 'list'], { key: tenantKey });
  assert.equal(notAdmin.code, 1);
  assert.match(notAdmin.stderr, /HTTP 403.*\(it needs an admin key\)/);
  const usage = await armada(['sessions', 'show']);
  assert.equal(usage.code, 106, usage.stderr);  // CLI11: a required argument is missing
});
