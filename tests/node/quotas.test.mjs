// Tenants across gateways, from `armada cluster up --gateways 2` (real PostgreSQL, etcd, NATS
// and Redis; one cell of one node; the tiny model): tenants and keys made through /admin on one
// gateway work on the other; each tenant's quotas hold across both gateways together through
// Redis, and with Redis hung each gateway admits about its half.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, richAgent, tempDir, writeAgents } from './agents.mjs';
import { sanitizerReports, sleep } from './cluster_helpers.mjs';

const ADMIN = 'admin-key-for-quota-tests';
let tools;
let dir;
let up;
let upLog = '';
let gws = [];

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const logOf = (name) => fs.readFileSync(status().processes.find((p) => p.name === name).log, 'utf8');

async function call(gw, method, route, key, body) {
  const headers = { Authorization: `Bearer ${key}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(`${gw}${route}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, retryAfter: r.headers.get('retry-after') };
}

async function newTenant(name, quotas) {
  const t = await call(gws[0], 'POST', '/admin/tenants', ADMIN, { name, ...quotas });
  assert.equal(t.status, 201, t.text);
  const k = await call(gws[1], 'POST', '/admin/keys', ADMIN, { tenant: name });
  assert.equal(k.status, 201, k.text);
  return k.json.key;
}

// Until `key` is accepted by every gateway (their caches last about two seconds).
async function waitKnown(key) {
  const deadline = Date.now() + 10000;
  for (const gw of gws) {
    for (;;) {
      const r = await call(gw, 'GET', '/v1/models', key);
      if (r.status === 200) break;
      if (Date.now() > deadline) throw new Error(`${gw} does not know the key: ${r.status} ${r.text}`);
      await sleep(200);
    }
  }
}

// Sends a one-token chat completion to each gateway every `everyMs` for `ms`; counts the
// admitted (not 429) per gateway and checks every refusal names the quota.
async function hammer(key, ms, everyMs = 200) {
  const admitted = gws.map(() => 0);
  const refusals = [];
  const pending = [];
  const end = Date.now() + ms;
  while (Date.now() < end) {
    gws.forEach((gw, i) => {
      pending.push(call(gw, 'POST', '/v1/chat/completions', key, {
        model: 'tiny', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }],
      }).then((r) => {
        if (r.status === 429) refusals.push(r);
        else if (r.status === 200) admitted[i]++;
        else throw new Error(`unexpected ${r.status}: ${r.text}`);
      }));
    });
    await sleep(everyMs);
  }
  await Promise.all(pending);
  for (const r of refusals) {
    assert.equal(r.json.error.param, 'requests_per_minute', r.text);
    assert.equal(r.json.error.code, 'quota_exceeded', r.text);
    assert.ok(Number(r.retryAfter) >= 1 && Number(r.retryAfter) <= 60, `Retry-After ${r.retryAfter}`);
  }
  return { admitted, refused: refusals.length };
}

before(async () => {
  tools = await startToolServer({ minDelayMs: 2000, maxDelayMs: 2500 });
  dir = tempDir('armada-quotas-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 3, maxSteps: 6 }));
  up = spawn(process.env.ARMADA_BIN, ['cluster', 'up', '--cells', '1', '--nodes', '1', '--brains', '1',
    '--gateways', '2', '-m', tinyModel, '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents,
    '--lease-ttl', '3', '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8',
    '--node-arg=-c', '--node-arg=8192', '--node-arg=-t', '--node-arg=1'],
  { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ARMADA_API_KEY: ADMIN } });
  up.stdout.on('data', (d) => { upLog += d; });
  up.stderr.on('data', (d) => { upLog += d; });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('cluster up printed no gateways\n' + upLog)), 120000);
    up.stdout.on('data', () => {
      if (/gateway1 at http/.test(upLog)) { clearTimeout(timer); resolve(); }
    });
    up.on('exit', (code) => { clearTimeout(timer); reject(new Error(`cluster up exited with ${code}\n${upLog}`)); });
  });
  dir = path.join(dir, 'c');
  gws = status().gateways;
  assert.equal(gws.length, 2);
  const deadline = Date.now() + 120000;
  for (;;) {
    const ready = await Promise.all(gws.map((g) => fetch(`${g}/readyz`).then((r) => r.status === 200, () => false)));
    const models = await call(gws[0], 'GET', '/v1/models', ADMIN).catch(() => ({ status: 0 }));
    if (ready.every(Boolean) && models.status === 200) break;
    if (Date.now() > deadline) throw new Error('the cluster did not become ready\n' + upLog);
    await sleep(500);
  }
  // Both gateways count each other: without Redis each takes half of a quota.
  for (;;) {
    const m = await Promise.all(gws.map((g) => call(g, 'GET', '/metrics', ADMIN)));
    if (m.every((x) => /armada_gateway_live_gateways 2\b/.test(x.text))) break;
    if (Date.now() > deadline) throw new Error('the gateways do not see each other:\n' + m.map((x) => x.text).join('\n'));
    await sleep(250);
  }
});

after(async () => {
  if (up && up.exitCode === null) {
    up.kill('SIGINT');
    await new Promise((r) => up.once('exit', r));
  }
  await tools?.close();
  assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('/admin manages tenants and keys for every gateway; only admins reach it; keys are shown once', async () => {
  const acme = await newTenant('acme', { requests_per_minute: 1000 });
  await waitKnown(acme);
  // A tenant's key is not an admin's.
  const denied = await call(gws[0], 'GET', '/admin/tenants', acme);
  assert.equal(denied.status, 403, denied.text);
  assert.equal((await call(gws[0], 'GET', '/admin/tenants', 'no-such-key')).status, 401);
  // Listings name the key by id and prefix, never the key itself or its hash.
  const keys = await call(gws[1], 'GET', '/admin/keys?tenant=acme', ADMIN);
  assert.equal(keys.status, 200, keys.text);
  assert.equal(keys.json.data.length, 1);
  assert.ok(!keys.text.includes(acme), 'a listing shows a key');
  assert.ok(acme.startsWith(keys.json.data[0].prefix));
  assert.equal(keys.json.data[0].hash, undefined);
  // Clear errors.
  const dup = await call(gws[0], 'POST', '/admin/tenants', ADMIN, { name: 'acme' });
  assert.equal(dup.status, 409, dup.text);
  const typo = await call(gws[0], 'POST', '/admin/tenants', ADMIN, { name: 'x', requests_per_minut: 5 });
  assert.equal(typo.status, 400);
  assert.match(typo.json.error.message, /unknown field 'requests_per_minut'/);
  const neg = await call(gws[0], 'PATCH', '/admin/tenants/acme', ADMIN, { live_sessions: -1 });
  assert.equal(neg.status, 400, neg.text);
  const orphan = await call(gws[0], 'POST', '/admin/keys', ADMIN, { tenant: 'nobody' });
  assert.equal(orphan.status, 404, orphan.text);
  const patched = await call(gws[1], 'PATCH', '/admin/tenants/acme', ADMIN, { live_sessions: 7 });
  assert.equal(patched.status, 200, patched.text);
  assert.equal(patched.json.live_sessions, 7);
  assert.equal(patched.json.requests_per_minute, 1000);
  // Tenants stay apart on the nodes: another tenant cannot see acme's session.
  const other = await newTenant('other', {});
  await waitKnown(other);
  const s = await call(gws[0], 'POST', '/v1/agents/worker/sessions', acme, { input: 'mine' });
  assert.equal(s.status, 201, s.text);
  assert.equal((await call(gws[1], 'GET', `/v1/sessions/${s.json.id}`, acme)).status, 200);
  assert.equal((await call(gws[1], 'GET', `/v1/sessions/${s.json.id}`, other)).status, 404);
  // A tenant cannot pass itself off as another by naming it, on a route the gateway forwards.
  const declared = await fetch(`${gws[0]}/v1/agents`, {
    method: 'POST', body: richAgent(tools.url, 'acme-only'),
    headers: { Authorization: `Bearer ${acme}`, 'Content-Type': 'application/yaml' },
  });
  assert.equal(declared.status, 200, await declared.text());
  assert.equal((await call(gws[1], 'GET', '/v1/agents/acme-only', acme)).status, 200);
  const spoof = await fetch(`${gws[1]}/v1/agents/acme-only`, {
    headers: { Authorization: `Bearer ${other}`, 'X-Armada-Tenant': 't:acme' },
  });
  assert.equal(spoof.status, 404, await spoof.text());
  // An admin acting as the tenant is that tenant on the gateway too: the session is acme's.
  const acting = await fetch(`${gws[0]}/v1/agents/worker/sessions`, {
    method: 'POST', body: '{}', headers: { Authorization: `Bearer ${ADMIN}`, 'X-Armada-Tenant': 't:acme', 'Content-Type': 'application/json' },
  });
  const actingText = await acting.text();
  assert.equal(acting.status, 201, actingText);
  const actingId = JSON.parse(actingText).id;
  assert.equal((await call(gws[1], 'GET', `/v1/sessions/${actingId}`, acme)).status, 200);
  assert.equal((await call(gws[1], 'GET', `/v1/sessions/${actingId}`, other)).status, 404);
  // A deleted key stops working on every gateway within the cache's TTL.
  const del = await call(gws[0], 'DELETE', `/admin/keys/${keys.json.data[0].id}`, ADMIN);
  assert.equal(del.status, 200, del.text);
  const deadline = Date.now() + 8000;
  for (;;) {
    const seen = await Promise.all(gws.map((g) => call(g, 'GET', '/v1/models', acme)));
    if (seen.every((x) => x.status === 401)) break;
    assert.ok(Date.now() < deadline, 'a deleted key still works');
    await sleep(250);
  }
});

test('live sessions: over the quota is a 429 naming it while they are open; one that ends makes room', async () => {
  const key = await newTenant('few', { live_sessions: 2 });
  await waitKnown(key);
  const ids = [];
  for (let i = 0; i < 2; i++) {
    // No input: the session waits for it, open, for as long as the test needs.
    const r = await call(gws[i], 'POST', '/v1/agents/worker/sessions', key, {});
    assert.equal(r.status, 201, r.text);
    ids.push(r.json.id);
  }
  const over = await call(gws[0], 'POST', '/v1/agents/worker/sessions', key, { input: 'one too many' });
  assert.equal(over.status, 429, over.text);
  assert.equal(over.json.error.param, 'live_sessions');
  assert.match(over.json.error.message, /tenant 'few' is over its live_sessions quota \(2\)/);
  assert.ok(Number(over.retryAfter) >= 1);
  // Past the 10 s a gateway spares sessions it has just admitted, PostgreSQL still says both
  // are open: still refused, on either gateway.
  await sleep(11000);
  for (const gw of gws) {
    const still = await call(gw, 'POST', '/v1/agents/worker/sessions', key, {});
    assert.equal(still.status, 429, still.text);
  }
  const cancel = await call(gws[1], 'POST', `/v1/sessions/${ids[0]}/cancel`, key, {});
  assert.equal(cancel.status, 200, cancel.text);
  const deadline = Date.now() + 30000;
  for (;;) {
    const r = await call(gws[1], 'POST', '/v1/agents/worker/sessions', key, { input: 'after' });
    if (r.status === 201) break;
    assert.equal(r.status, 429, r.text);
    assert.ok(Date.now() < deadline, 'ended sessions still hold the quota');
    await sleep(1000);
  }
});

test('KV bytes: a tenant whose sessions hold its KV quota on the nodes gets no new work until they end', async () => {
  const key = await newTenant('kv', { kv_bytes: 1 });
  await waitKnown(key);
  const s = await call(gws[0], 'POST', '/v1/agents/worker/sessions', key, { input: 'hold some KV' });
  assert.equal(s.status, 201, s.text);  // nothing held yet
  const ids = [s.json.id];
  // The node's load report names what the session holds; then both gateways refuse.
  const deadline = Date.now() + 60000;
  let refused = null;
  while (!refused) {
    const r = await call(gws[1], 'POST', '/v1/agents/worker/sessions', key, { input: 'more' });
    if (r.status === 429) refused = r;
    else {
      assert.equal(r.status, 201, r.text);
      ids.push(r.json.id);
    }
    assert.ok(Date.now() < deadline, 'KV held was never refused');
    if (!refused) await sleep(300);
  }
  assert.equal(refused.json.error.param, 'kv_bytes');
  assert.match(refused.json.error.message, /tenant 'kv' is over its kv_bytes quota \(1\)/);
  const other = await call(gws[0], 'POST', '/v1/agents/worker/sessions', key, { input: 'more' });
  assert.equal(other.status, 429, other.text);
  // When they have ended, what they held is free again.
  for (;;) {
    const states = await Promise.all(ids.map((id) => call(gws[1], 'GET', `/v1/sessions/${id}`, key)));
    if (states.every((x) => ['completed', 'failed', 'cancelled'].includes(x.json?.state))) break;
    assert.ok(Date.now() < deadline + 60000, 'the sessions did not end');
    await sleep(500);
  }
  for (;;) {
    const r = await call(gws[0], 'POST', '/v1/chat/completions', key,
      { model: 'tiny', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] });
    if (r.status === 200) break;
    assert.equal(r.status, 429, r.text);
    assert.ok(Date.now() < deadline + 70000, 'KV of ended sessions still counts');
    await sleep(500);
  }
});

test('tokens per minute: a request is charged what it may use when admitted', async () => {
  const key = await newTenant('tok', { tokens_per_minute: 1000 });
  await waitKnown(key);
  const body = { model: 'tiny', max_tokens: 900, messages: [{ role: 'user', content: 'write' }] };
  const [a, b] = await Promise.all([call(gws[0], 'POST', '/v1/chat/completions', key, body),
    sleep(100).then(() => call(gws[1], 'POST', '/v1/chat/completions', key, body))]);
  assert.equal(a.status, 200, a.text);
  assert.equal(b.status, 429, b.text);
  assert.equal(b.json.error.param, 'tokens_per_minute');
  assert.ok(Number(b.retryAfter) >= 1);
});

// Starts a streamed completion and reads its first events; `leave()` then hangs up.
async function openStream(gw, key, body) {
  const ac = new AbortController();
  const r = await fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', signal: ac.signal,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}` },
    body: JSON.stringify({ ...body, stream: true }),
  });
  if (r.status !== 200) return { status: r.status, text: await r.text(), leave: () => {} };
  const reader = r.body.getReader();
  let seen = '';
  let ended = false;
  while ((seen.match(/\ndata: /g) ?? []).length < 3) {
    const { value, done } = await reader.read();
    if (done) { ended = true; break; }
    seen += '\n' + new TextDecoder().decode(value);
  }
  ended = ended || seen.includes('[DONE]');
  return { status: 200, ended, leave: () => ac.abort() };
}

test('tokens per minute: a stream the client leaves early is settled with what it used, and its room comes back', async () => {
  const key = await newTenant('settle', { tokens_per_minute: 1000 });
  await waitKnown(key);
  const body = { model: 'tiny', max_tokens: 900, temperature: 0, messages: [{ role: 'user', content: 'write' }] };
  const first = await openStream(gws[0], key, body);
  assert.equal(first.status, 200, first.text);
  assert.ok(!first.ended, 'the stream is still running when the client leaves');
  // While it runs it holds the 900 it may use: another is refused.
  const held = await call(gws[1], 'POST', '/v1/chat/completions', key, body);
  assert.equal(held.status, 429, held.text);
  first.leave();
  // Settled with the few tokens it used: 900 more fit in the minute again (without the
  // settlement they would not for 60 s).
  let again;
  const t0 = Date.now();
  while (Date.now() - t0 < 10000) {
    again = await openStream(gws[1], key, body);
    if (again.status === 200) break;
    await sleep(250);
  }
  again.leave();
  assert.equal(again.status, 200, `refused ${Date.now() - t0} ms after the first stream ended: ${again.text}`);
});

test('tokens per minute: the model steps of a tenant\'s sessions count, on every gateway', async () => {
  const key = await newTenant('steps', { tokens_per_minute: 400 });
  await waitKnown(key);
  const chat = { model: 'tiny', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] };
  // Nothing used yet: a small request fits.
  const first = await call(gws[1], 'POST', '/v1/chat/completions', key, chat);
  assert.equal(first.status, 200, first.text);
  const s = await call(gws[0], 'POST', '/v1/agents/worker/sessions', key, { input: 'work' });
  assert.equal(s.status, 201, s.text);
  // Its first model step reads the agent's instructions and tools: a few hundred tokens.
  const deadline = Date.now() + 60000;
  for (;;) {
    const r = await call(gws[0], 'GET', `/v1/sessions/${s.json.id}`, key);
    const used = r.json.steps.filter((x) => x.kind === 'model_output')
      .reduce((n, x) => n + x.data.prompt_tokens + x.data.completion_tokens, 0);
    if (used >= 400) break;
    assert.ok(Date.now() < deadline, `the session used ${used} tokens`);
    await sleep(250);
  }
  // The node charges them within a quarter of a second. A few tries at most: the chats' own
  // tokens (a few dozen each) cannot reach the quota by themselves.
  let refused = null;
  for (let i = 0; i < 5 && !refused; i++) {
    const r = await call(gws[1], 'POST', '/v1/chat/completions', key, chat);
    if (r.status === 429) refused = r;
    else assert.equal(r.status, 200, r.text);
    if (!refused) await sleep(500);
  }
  assert.ok(refused, 'the session\'s tokens were never counted');
  assert.equal(refused.json.error.param, 'tokens_per_minute', refused.text);
  const more = await call(gws[0], 'POST', '/v1/agents/worker/sessions', key, { input: 'more' });
  assert.equal(more.status, 429, more.text);
  assert.equal(more.json.error.param, 'tokens_per_minute');
});

test('requests per minute: two gateways together admit the quota in a minute; with Redis hung each admits its half', async () => {
  const key = await newTenant('rpm', { requests_per_minute: 60 });
  await waitKnown(key);
  const shared = await hammer(key, 58000);
  const total = shared.admitted[0] + shared.admitted[1];
  console.log(`# Redis up: the two gateways admitted ${shared.admitted.join(' + ')} in 58 s, refused ${shared.refused}`);
  assert.ok(total >= 55 && total <= 65, `admitted ${shared.admitted} in a minute`);
  assert.ok(shared.refused > 100, `refused ${shared.refused}`);

  // Redis hung: it accepts connections and answers nothing.
  // Redis answered every decision of that minute: neither gateway decided alone.
  for (const gw of gws)
    assert.match((await call(gw, 'GET', '/metrics', ADMIN)).text, /armada_gateway_quota_local_decisions_total 0\b/);
  const key2 = await newTenant('rpm2', { requests_per_minute: 60 });
  await waitKnown(key2);
  const redis = status().servers.redis.pid;
  process.kill(redis, 'SIGSTOP');
  let alone;
  try {
    alone = await hammer(key2, 58000);
  } finally {
    process.kill(redis, 'SIGCONT');
  }
  console.log(`# Redis hung: the two gateways admitted ${alone.admitted.join(' + ')} in 58 s, refused ${alone.refused}`);
  for (const n of alone.admitted) assert.ok(n >= 25 && n <= 35, `each gateway admitted ${alone.admitted}`);
  for (const name of ['gateway', 'gateway1'])
    assert.match(logOf(name), /Redis cannot be reached; each gateway now enforces its share/);
  const m = await call(gws[0], 'GET', '/metrics', ADMIN);
  assert.match(m.text, /armada_gateway_quota_local_decisions_total [1-9]/);
});
