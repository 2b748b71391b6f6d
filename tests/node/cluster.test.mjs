// A cell of 3 nodes started by `armada cluster up` (real PostgreSQL, etcd, NATS JetStream and
// Redis from the Debian packages, two cell brains, a gateway), with the tiny model. 64 agent
// sessions of 3 tool steps (tools take about 1 s) run through the gateway while faults are
// injected, one per test: kill -9 a node, SIGSTOP a node past its lease, kill -9 the leading
// brain, and restarts of PostgreSQL, etcd, Redis and NATS. Each test starts from 3 live nodes
// (`cluster up` starts a crashed node again once its cell has failed it over). Each checks that
// every session completes with a whole log, that each Idempotency-Key had one effect and that no
// finished call was sent again.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog, assertNoFinishedCallRepeated } from './session_helpers.mjs';
import { alive, assertLintedMetrics, chatTurn, etcdRange, metricSum, sanitizerReports, sleep, waitFor } from './cluster_helpers.mjs';

// Sanitizer builds (ARMADA_TIMING=0) run several times slower: a longer lease keeps their slow
// processes from losing it without a fault, and time bounds are not judged there.
const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const SESSIONS = 64;
const ENDED = ['completed', 'failed', 'cancelled'];
let tools;
let dir;
let up;
let upLog = '';
let gw;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const proc = (name) => status().processes.find((p) => p.name === name);
const logOf = (name) => fs.readFileSync(proc(name).log, 'utf8');
// A brain leads when, since it last started (`cluster up` may have started it again after a
// kill, appending to its log), it said it leads and has not said since that it stopped.
function leadsNow(name) {
  const t = logOf(name);
  const since = t.slice(Math.max(0, t.lastIndexOf(`cell brain ${name} of cell`)));
  const i = since.lastIndexOf('leads cell');
  return i >= 0 && since.indexOf('no longer leads', i) < 0;
}

async function get(route) {
  const r = await fetch(gw + route);
  return { status: r.status, json: await r.json().catch(() => null) };
}

async function createSessions(n, label) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    const r = await fetch(`${gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: `${label} ${i}` }),
    });
    const text = await r.text();
    assert.equal(r.status, 201, text);
    ids.push(JSON.parse(text).id);
  }
  return ids;
}

// Polls every session through the gateway until all have ended; returns id → final session.
async function waitAll(ids, timeoutMs = 240000) {
  const done = new Map();
  const deadline = Date.now() + timeoutMs * SLOW;
  while (done.size < ids.length) {
    for (const id of ids) {
      if (done.has(id)) continue;
      const r = await get(`/v1/sessions/${id}`);
      assert.notEqual(r.status, 404, `session ${id} lost`);
      if (r.status === 200 && ENDED.includes(r.json.state)) done.set(id, r.json);
    }
    if (Date.now() > deadline) throw new Error(`only ${done.size} of ${ids.length} sessions ended`);
    await sleep(250);
  }
  return done;
}

// Where each session is now: id → { node, epoch, steps }.
async function placements(ids) {
  const out = new Map();
  await Promise.all(ids.map(async (id) => {
    const r = await get(`/v1/sessions/${id}`);
    if (r.status === 200) out.set(id, { node: r.json.placement?.node ?? '', epoch: r.json.placement?.epoch ?? 0,
      state: r.json.state, steps: r.json.steps.length });
  }));
  return out;
}

async function waitProgress(ids, minToolCalls) {
  const deadline = Date.now() + 120000 * SLOW;
  for (;;) {
    const p = await placements(ids);
    const started = [...p.values()].filter((x) => x.steps >= 3).length;
    if (started >= minToolCalls) return p;
    if (Date.now() > deadline) throw new Error(`sessions did not start: ${started} of ${ids.length}`);
    await sleep(250);
  }
}

function checkAll(done, kills) {
  for (const s of done.values()) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 3);
    for (const st of s.steps.filter((x) => x.kind === 'tool_call'))
      assert.equal(tools.effects.get(st.idempotency_key), 1, `effects of ${st.idempotency_key}`);
  }
  for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
  // Repeats are judged for this batch's calls (earlier batches were judged with their own).
  const mine = new Set([...done.values()].flatMap((s) => s.steps.filter((x) => x.kind === 'tool_call')
    .map((x) => x.idempotency_key)));
  // Every call the tool server saw from these sessions is in their logs (none sent unlogged).
  const ids = [...done.keys()];
  for (const k of tools.effects.keys()) {
    if (ids.some((id) => k.startsWith(`${id}:`))) assert.ok(mine.has(k), `call ${k} reached the tool but is in no log`);
  }
  // No finished call is sent again (session_helpers.mjs says which repeats are allowed: its own
  // node's retries, a failover's re-send, and a call outstanding at a fault). A kill is a fault
  // of one instant; a SIGSTOP lasts from the stop to the SIGCONT, and counts from the stop.
  const replays = new Map([...tools.replays].filter(([k]) => mine.has(k)));
  assertNoFinishedCallRepeated({ ...tools, replays }, [...done.values()], kills.map(([at]) => at));
}

// Reads a session's event stream through the gateway until its state is final; returns the events,
// and passes each to `onEvent` as it comes. `signal` stops it early.
async function collectEvents(id, { onEvent = () => {}, signal } = {}) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 180000);
  signal?.addEventListener('abort', () => ctl.abort());
  const events = [];
  try {
    const res = await fetch(`${gw}/v1/sessions/${id}/events`, { signal: ctl.signal });
    assert.equal(res.status, 200);
    const dec = new TextDecoder();
    let buf = '';
    for await (const chunk of res.body) {
      buf += dec.decode(chunk, { stream: true });
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, end);
        buf = buf.slice(end + 2);
        const ev = { id: '', event: 'message', data: '' };
        for (const line of block.split('\n')) {
          if (line.startsWith('id:')) ev.id = line.slice(3).trim();
          else if (line.startsWith('event:')) ev.event = line.slice(6).trim();
          else if (line.startsWith('data:')) ev.data += line.slice(5).trim();
        }
        events.push(ev);
        onEvent(ev);
        if (ev.event === 'state' && ENDED.includes(JSON.parse(ev.data).state)) return events;
      }
    }
  } finally {
    clearTimeout(timer);
    ctl.abort();
  }
  return events;
}

async function waitLog(name, re, sinceLength, timeoutMs) {
  const deadline = Date.now() + timeoutMs * SLOW;
  for (;;) {
    const text = logOf(name).slice(sinceLength);
    if (re.test(text)) return Date.now();
    if (Date.now() > deadline) throw new Error(`${name} never logged ${re}:\n${text.slice(-3000)}`);
    await sleep(50);
  }
}

// n nodes up: n node processes alive, each ready by its own /readyz, and the gateway counting
// n. The gateway's count alone is not enough: a node killed a moment ago keeps its key until its
// lease runs out, so it would count while `cluster up` has yet to start it again.
async function nodesReady(n) {
  const deadline = Date.now() + 120000 * SLOW;
  for (;;) {
    const live = status().processes.filter((p) => p.role === 'node' && alive(p.pid));
    const r = await fetch(gw + '/readyz').then((x) => x.json()).catch(() => null);
    if (live.length >= n && r?.nodes >= n) {
      const ready = await Promise.all(live.map((p) => fetch(`${p.url}/readyz`).then((x) => x.ok).catch(() => false)));
      if (ready.filter(Boolean).length >= n) return;
    }
    if (Date.now() > deadline) {
      throw new Error(`the cluster never had ${n} nodes (${live.length} alive, the gateway counts ${r?.nodes}):\n${upLog}`);
    }
    await sleep(200);
  }
}

before(async () => {
  tools = await startToolServer({ minDelayMs: 800, maxDelayMs: 1200 });
  dir = tempDir('armada-cluster-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 3, maxSteps: 6, toolTimeoutMs: 3000 * SLOW }));
  up = spawn(process.env.ARMADA_BIN, ['cluster', 'up', '--nodes', '3', '-m', tinyModel, '--data-dir',
    path.join(dir, 'c'), '--port', '0', '--agents', agents, '--lease-ttl', String(TTL_S),
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=8', '--node-arg=-c',
    '--node-arg=16384', '--node-arg=-t', '--node-arg=1', '--node-arg=--drain-timeout', `--node-arg=${90 * SLOW}`,
    // Sessions are sharded over two databases, so every fault below runs on a sharded store.
    '--pg-shards', '2'],
  // Every 5th KV journal a draining node sends breaks off halfway (the migration test).
  { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ARMADA_KV_SEND_CUT: '5' } });
  up.stdout.on('data', (d) => { upLog += d; });
  up.stderr.on('data', (d) => { upLog += d; });
  gw = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('cluster up printed no gateway\n' + upLog)), 120000 * SLOW);
    const look = () => {
      const m = upLog.match(/gateway at (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    };
    up.stdout.on('data', look);
    up.on('exit', (code) => { clearTimeout(timer); reject(new Error(`cluster up exited with ${code}\n${upLog}`)); });
  });
  dir = path.join(dir, 'c');
  await nodesReady(3);
});

after(async () => {
  if (up && up.exitCode === null) {
    const done = new Promise((r) => up.on('exit', r));
    // Stopped processes would hold the shutdown up.
    for (const p of status().processes) if (alive(p.pid)) process.kill(p.pid, 'SIGCONT');
    up.kill('SIGINT');
    await done;
    // Ctrl-C stopped everything it started: no process and no server is left.
    const st = status();
    for (const p of [...st.processes, ...Object.entries(st.servers).map(([name, s]) => ({ name, pid: s.pid }))])
      assert.ok(!alive(p.pid), `${p.name} (pid ${p.pid}) still runs after cluster up stopped`);
  }
  if (tools) await tools.close();
  assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('each node reports its load in etcd under its lease', { timeout: 60000 * SLOW }, async () => {
  const prefix = '/armada/cells/cell0/nodes/';
  // `cluster up` turns etcd's authentication on: without the cluster's user, no read.
  await assert.rejects(etcdRange(status().servers.etcd.endpoint, prefix, { prefix: true }), /refused the read/);
  const nodes = (await etcdRange(status().servers.etcd, prefix, { prefix: true })).map((kv) => ({ key: Buffer.from(kv.key, 'base64').toString(), lease: kv.lease,
    load: JSON.parse(Buffer.from(kv.value, 'base64').toString()) }));
  assert.deepEqual(nodes.map((n) => n.key.slice(prefix.length)).sort(),
    status().processes.filter((p) => p.role === 'node').map((p) => p.name).sort());
  for (const { key, lease, load } of nodes) {
    assert.ok(Number(lease) > 0, `${key} is held by a lease`);
    assert.equal(load.url, proc(key.slice(prefix.length)).url, key);
    assert.equal(load.engines, 1, key);
    assert.equal(load.draining, false, key);
    assert.ok(load.fingerprint.length > 0 && load.version.length > 0, key);
    assert.equal(typeof load.by_state, 'object', key);
    assert.ok(load.free_seqs > 0, `${key} has free room: ${load.free_seqs}`);
    // KV headroom in bytes: at least a few sequences' worth of this small model's cache.
    assert.ok(load.kv_headroom > 1 << 20, `${key} KV headroom ${load.kv_headroom}`);
  }
  // Their pools, sized by the config (pg_pool 8 per database: two here; redis_pool 8: a node's
  // one Redis user takes 2), show in /metrics with their waits; so do the gateway's.
  const metric = (text, name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, 'm'))?.[1] ?? NaN);
  for (const p of status().processes.filter((x) => x.role === 'node')) {
    const text = await fetch(`${p.url}/metrics`).then((x) => x.text());
    assertLintedMetrics(text, p.name);
    assert.equal(metric(text, 'armada_store_pool_connections'), 16, p.name);
    assert.equal(metric(text, 'armada_redis_pool_connections'), 2, p.name);
    for (const m of ['armada_store_pool_waits_total', 'armada_redis_pool_waits_total', 'armada_redis_pool_wait_seconds'])
      assert.ok(metric(text, m) >= 0, `${p.name} ${m}`);
  }
  const gwText = await fetch(`${gw}/metrics`).then((x) => x.text());
  assertLintedMetrics(gwText, 'the gateway');
  assert.equal(metric(gwText, 'armada_store_pool_connections'), 16);
  assert.equal(metric(gwText, 'armada_redis_pool_connections'), 8);
  assert.ok(metric(gwText, 'armada_redis_pool_waits_total') >= 0, 'the gateway counts its Redis waits');
});

test('a node serves a session\'s KV journal only to the cluster\'s peer key, though clients need no key', { timeout: 30000 * SLOW }, async () => {
  const n = status().processes.find((p) => p.role === 'node' && alive(p.pid));
  // Clients need no key on this cluster: the API answers without one.
  assert.equal((await fetch(`${n.url}/v1/models`)).status, 200);
  const noKey = await fetch(`${n.url}/admin/kv/sess_x`);
  assert.equal(noKey.status, 401);
  assert.match((await noKey.json()).error.message, /peer key/);
  const wrong = await fetch(`${n.url}/admin/kv/sess_x`, { headers: { Authorization: 'Bearer not-the-peer-key' } });
  assert.equal(wrong.status, 401);
  // `cluster up` hands the nodes their key through the environment, never on a command line.
  const cmdline = fs.readFileSync(`/proc/${n.pid}/cmdline`, 'utf8');
  const env = fs.readFileSync(`/proc/${n.pid}/environ`, 'utf8').split('\0');
  const key = env.find((e) => e.startsWith('ARMADA_PEER_KEY='))?.slice('ARMADA_PEER_KEY='.length);
  assert.ok(key && key.length >= 32, 'the node has a peer key');
  assert.ok(!cmdline.includes(key), 'the peer key is not on the command line');
  // With the key, the route answers: that session is not moving from this node.
  const right = await fetch(`${n.url}/admin/kv/sess_x`, { headers: { Authorization: `Bearer ${key}` } });
  const body = await right.text();
  assert.equal(right.status, 409, body);
  assert.match(body, /not moving from this node/);
});

test('an agent declared through one node is known to every node; deleted through another, it is gone from all', { timeout: 60000 * SLOW }, async () => {
  const nodes = status().processes.filter((p) => p.role === 'node' && alive(p.pid));
  assert.equal(nodes.length, 3);
  const declared = await fetch(`${nodes[0].url}/v1/agents`, {
    method: 'POST', headers: { 'Content-Type': 'application/yaml' },
    body: agentYaml(tools.url, { id: 'passing', toolSteps: 1, maxSteps: 3 }),
  });
  assert.ok(declared.ok, await declared.text());
  for (const p of nodes) assert.equal((await fetch(`${p.url}/v1/agents/passing`)).status, 200, p.name);
  const del = await fetch(`${nodes[1].url}/v1/agents/passing`, { method: 'DELETE' });
  assert.ok(del.ok, await del.text());
  for (const p of nodes) {
    const deadline = Date.now() + 5000 * SLOW;
    let st;
    while ((st = (await fetch(`${p.url}/v1/agents/passing`)).status) === 200 && Date.now() < deadline) await sleep(100);
    assert.equal(st, 404, `${p.name} still knows the deleted agent`);
  }
  const r = await fetch(`${gw}/v1/agents/passing/sessions`, { method: 'POST', body: JSON.stringify({ input: 'x' }) });
  assert.equal(r.status, 404, await r.text());
});

test('a node asked about a session another live node holds answers 409 naming it, and does not take it over', { timeout: 120000 * SLOW }, async () => {
  const [id] = await createSessions(1, 'held elsewhere');
  // Placed and running (a tool step under way) on its node.
  const deadline = Date.now() + 60000 * SLOW;
  let at;
  while (!(at = (await placements([id])).get(id))?.node || at.steps < 2) {
    if (Date.now() > deadline) throw new Error(`session ${id} was not placed: ${JSON.stringify(at)}`);
    await sleep(100);
  }
  const other = status().processes.find((p) => p.role === 'node' && p.name !== at.node && alive(p.pid));
  const del = await fetch(`${other.url}/v1/sessions/${id}`, { method: 'DELETE' });
  const delBody = await del.text();
  assert.equal(del.status, 409, delBody);
  assert.match(delBody, new RegExp(`held by node ${at.node}, which is alive`));
  const msg = await fetch(`${other.url}/v1/sessions/${id}/messages`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: 'hi' }),
  });
  assert.equal(msg.status, 409, await msg.text());
  const events = await fetch(`${other.url}/v1/sessions/${id}/events`);
  const eventsBody = await events.text();
  assert.equal(events.status, 409, eventsBody);
  assert.match(eventsBody, new RegExp(`held by node ${at.node}`));
  // The row is still its holder's, under the same epoch, and the session completes there.
  const [done] = [...(await waitAll([id])).values()];
  assert.equal(done.state, 'completed', JSON.stringify(done));
  assert.equal(done.placement.node, at.node);
  assert.equal(done.placement.epoch, at.epoch);
});

test('chat turns of one conversation go to the node that served its start (prompt-prefix affinity)', { timeout: 120000 * SLOW }, async () => {
  const nodes = status().processes.filter((p) => p.role === 'node' && alive(p.pid));
  const turn = (messages) => chatTurn(gw, nodes, messages);
  const firsts = new Set();
  for (let c = 0; c < 6; c++) {
    const messages = [{ role: 'system', content: `You are assistant number ${c}.` }, { role: 'user', content: `Start ${c}` }];
    const first = await turn(messages);
    firsts.add(first.node);
    let reply = first.reply;
    for (let k = 0; k < 2; k++) {
      messages.push({ role: 'assistant', content: reply }, { role: 'user', content: `Go on (${k})` });
      const next = await turn(messages);
      assert.equal(next.node, first.node, `turn ${k + 2} of conversation ${c}`);
      reply = next.reply;
    }
  }
  // Going by load alone spreads them (equal room, round-robin): affinity is what keeps each together.
  assert.ok(firsts.size >= 2, `conversations started on ${[...firsts]}`);
});

test('kill -9 a node: its sessions take their next step elsewhere within the lease TTL + 2 s and all 64 complete', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'kill');
  const before = await waitProgress(ids, 24);
  const count = new Map();
  for (const p of before.values()) if (p.node) count.set(p.node, (count.get(p.node) ?? 0) + 1);
  assert.ok(count.size >= 2, `sessions were spread over the nodes: ${JSON.stringify([...count])}`);
  const victim = [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
  const theirs = [...before.entries()].filter(([, p]) => p.node === victim && !ENDED.includes(p.state))
    .map(([id]) => id);
  assert.ok(theirs.length > 0);
  // Three of its sessions are followed through the gateway's event stream across the move.
  const streams = theirs.slice(0, 3).map((id) => collectEvents(id).then((evs) => [id, evs]));
  await sleep(300);
  const victimMark = logOf(victim).length;
  const t0 = Date.now();
  process.kill(proc(victim).pid, 'SIGKILL');
  faults.push([t0, t0]);
  // Each of its open sessions gets another node, seen through the gateway.
  const movedAt = new Map();
  while (movedAt.size < theirs.length && Date.now() - t0 < 30000 * SLOW) {
    const now = await placements(theirs.filter((id) => !movedAt.has(id)));
    for (const [id, p] of now) if (p.node && p.node !== victim) movedAt.set(id, Date.now() - t0);
    await sleep(100);
  }
  assert.equal(movedAt.size, theirs.length, 'every session of the dead node moved');
  const done = await waitAll(ids);
  checkAll(done, faults);
  // Some of its calls were in flight: they were sent again, with their keys, by the new nodes.
  assert.ok([...tools.replays.keys()].some((k) => theirs.some((id) => k.startsWith(`${id}:`))),
    'a tool call in flight on the dead node was sent again');
  // The next step of each moved session, taken by its new node: its unfinished tool call sent
  // again (when it reaches the tool) or its model step begun (`started_ms`), whichever is first.
  // Only times past t0 + 1 s count: no other node can hold the session before the lease (3 s)
  // runs out, while a request the dead node wrote just before its kill may still be read after.
  // `written` is when that next step (or the one after a re-sent call) was durable.
  const written = [];
  const nextStep = theirs.map((id) => {
    const s = done.get(id);
    const after = (x) => x > t0 + 1000;
    const times = s.steps.filter((x) => x.kind === 'model_output').map((x) => x.data.started_ms).filter(after);
    const firstWritten = s.steps.map((x) => x.ts_ms).find(after);
    if (firstWritten) written.push(firstWritten - t0);
    for (const [k, at] of tools.arrivals) if (k.startsWith(`${id}:`)) times.push(...at.filter(after));
    return times.length ? Math.min(...times) - t0 : Infinity;
  }).sort((a, b) => a - b);
  {
    // Model steps (previous step written → model output written), before and after the kill.
    const durs = { before: [], after: [] };
    for (const s of done.values()) {
      for (let i = 1; i < s.steps.length; i++) {
        if (s.steps[i].kind !== 'model_output') continue;
        const d = s.steps[i].ts_ms - s.steps[i - 1].ts_ms;
        (s.steps[i].ts_ms < t0 ? durs.before : durs.after).push(d);
      }
    }
    for (const k of ['before', 'after']) {
      const a = durs[k].sort((x, y) => x - y);
      console.log(`model steps ${k} the kill: n ${a.length} p50 ${a[a.length >> 1]} p90 ${a[Math.floor(a.length * 0.9)]} max ${a.at(-1)}`);
    }
  }
  const moves = [...movedAt.values()].sort((a, b) => a - b);
  console.log(`kill -9 ${victim}: ${theirs.length} sessions moved; re-placed after ms p50 ${moves[moves.length >> 1]} ` +
    `max ${moves.at(-1)}; next step begun after ms p50 ${nextStep[nextStep.length >> 1]} max ${nextStep.at(-1)}; ` +
    `written after ms p50 ${written.sort((a, b) => a - b)[written.length >> 1]} max ${written.at(-1)}`);
  if (timing) {
    assert.ok(moves.at(-1) <= TTL_S * 1000 + 2000, `re-placed within the TTL + 2 s: ${moves.at(-1)} ms`);
    assert.ok(nextStep.at(-1) <= TTL_S * 1000 + 2000, `every moved session took its next step within the TTL + 2 s: ${nextStep}`);
  }
  for (const id of theirs) {
    const s = done.get(id);
    assert.notEqual(s.placement?.node, victim);
    // The failover is in its placement's moves, as a move without KV, and in its step log.
    const lost = s.placement.moves.filter((m) => m.from === victim);
    assert.equal(lost.length, 1, `${id}: ${JSON.stringify(s.placement.moves)}`);
    assert.equal(lost[0].kv_source, 'none', JSON.stringify(lost[0]));
    assert.match(lost[0].error, /^failover: node \S+ was lost$/, JSON.stringify(lost[0]));
    assert.equal(s.steps.find((x) => x.seq === lost[0].seq)?.kind, 'moved');
  }
  // `cluster up` starts the dead node again after its back-off (not before its sessions moved);
  // it joins the cell again, and the next tests have 3 nodes.
  const joined = await waitLog(victim, /node \S+ joined cell/, victimMark, 60000);
  assert.ok(joined - t0 >= 2 * TTL_S * 1000, `${victim} came back after its back-off: ${joined - t0} ms`);
  assert.match(upLog, new RegExp(`${victim} was killed by signal 9; starting it again`));
  // Each followed stream went on after the move: every durable event once, in step order, to the
  // final state (the gateway reconnected to the new node with Last-Event-ID).
  for (const [id, evs] of await Promise.all(streams)) {
    const durable = evs.filter((e) => /^\d+$/.test(e.id)).map((e) => Number(e.id));
    // (A client's input and a move are in the log, not in the event stream.)
    const want = done.get(id).steps.filter((x) => !['user_input', 'moved'].includes(x.kind)).map((x) => x.seq);
    assert.deepEqual(durable, want, `the stream of ${id} through the gateway`);
  }
});

// The shard a session id belongs to: FNV-1a 64 of the id, modulo the shard count (as the store).
function shardOf(id, n) {
  let h = 0xcbf29ce484222325n;
  for (const ch of Buffer.from(id)) h = BigInt.asUintN(64, (h ^ BigInt(ch)) * 0x100000001b3n);
  return Number(h % BigInt(n));
}

function psql(url, sql) {
  const r = spawnSync('psql', [url, '-v', 'ON_ERROR_STOP=1', '-Atc', sql], { encoding: 'utf8' });
  assert.equal(r.status, 0, `psql ${url}: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

test('sessions are sharded by id over the two PostgreSQL databases, each with its own steps', { timeout: 60000 * SLOW }, async () => {
  const shards = status().servers.postgres.shards;
  assert.equal(shards.length, 2, JSON.stringify(status().servers.postgres));
  const cfg = fs.readFileSync(path.join(dir, 'cluster.yaml'), 'utf8');
  for (const url of shards) assert.ok(cfg.includes(url), `cluster.yaml lists ${url}`);
  const rows = shards.map((url) => psql(url, 'SELECT id FROM sessions'));
  const stepOwners = shards.map((url) => psql(url, 'SELECT DISTINCT session_id FROM steps'));
  // The tests before this one ran sessions: each database holds some of them.
  for (let k = 0; k < 2; ++k) assert.ok(rows[k].length > 10, `shard ${k} holds ${rows[k].length} sessions`);
  for (let k = 0; k < 2; ++k) {
    for (const id of rows[k]) assert.equal(shardOf(id, 2), k, `session ${id} is on shard ${k}`);
    const here = new Set(rows[k]);
    for (const id of stepOwners[k]) assert.ok(here.has(id), `the steps of ${id} are on its session's shard ${k}`);
  }
  // Agents (declared through the API) are on the first database only, and sessions of both are
  // read back through the gateway.
  assert.deepEqual(psql(shards[1], 'SELECT id FROM agents'), []);
  for (const id of [...rows[0].slice(0, 3), ...rows[1].slice(0, 3)]) {
    const r = await get(`/v1/sessions/${id}`);
    assert.equal(r.status, 200, `${id}: ${JSON.stringify(r.json)}`);
    assert.ok(r.json.steps.length > 0, id);
  }
});

test('SIGSTOP a node past its lease: its sessions move, its late writes are fenced, it rejoins', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'stop');
  const before = await waitProgress(ids, 24);
  const live = status().processes.filter((p) => p.role === 'node' && alive(p.pid)).map((p) => p.name);
  const count = new Map(live.map((n) => [n, 0]));
  for (const p of before.values()) if (count.has(p.node) && !ENDED.includes(p.state)) count.set(p.node, count.get(p.node) + 1);
  const victim = [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
  assert.ok(count.get(victim) > 0, 'the stopped node holds sessions');
  const mark = logOf(victim).length;
  const pid = proc(victim).pid;
  const theirs = [...(await placements(ids)).entries()].filter(([, x]) => x.node === victim && !ENDED.includes(x.state))
    .map(([id]) => id);
  // Every step a client reads through the gateway from the stop until the end, by session and
  // index: a session must never show two different steps at one index.
  const seen = new Map();
  let watching = true;
  const watcher = (async () => {
    while (watching) {
      await Promise.all(ids.map(async (id) => {
        const r = await get(`/v1/sessions/${id}`);
        if (r.status !== 200) return;
        for (const st of r.json.steps) {
          const key = `${id}#${st.seq}`;
          const was = seen.get(key);
          if (was) assert.deepEqual(st, was, `${id} showed two different steps at index ${st.seq}`);
          else seen.set(key, st);
        }
      }));
      await sleep(300);
    }
  })();
  const t0 = Date.now();
  process.kill(pid, 'SIGSTOP');
  let done;
  try {
    await sleep((TTL_S + 3) * 1000);
    process.kill(pid, 'SIGCONT');
    faults.push([t0, Date.now()]);
    done = await waitAll(ids);
  } finally {
    watching = false;
    await watcher;
  }
  checkAll(done, faults);
  for (const [key, st] of seen) {
    const [id, seq] = key.split('#');
    assert.deepEqual(done.get(id).steps.find((x) => x.seq === Number(seq)), st, `${id} step ${seq} as seen, in the final log`);
  }
  // Its sessions moved: each open one it held at the stop ended under a later epoch elsewhere
  // (unless it completed in the instant before the stop).
  assert.ok(theirs.length > 0, 'the stopped node held open sessions');
  for (const id of theirs) {
    const s = done.get(id);
    const endedBefore = s.steps.at(-1).ts_ms < t0 + 100;
    if (endedBefore || (s.placement.epoch > 1 && s.placement.node !== victim)) continue;
    // What the brains and nodes said about the stopped node and this session, so that a failure
    // in CI says why it stayed (the brain never saw the node go, found no room, or its write
    // failed).
    const said = status().processes.filter((p) => p.role === 'cell' || p.role === 'node').flatMap((p) =>
      fs.readFileSync(p.log, 'utf8').split('\n').filter((l) => l.includes(id) || (p.role === 'cell' && l.includes(victim)))
        .map((l) => `${p.name}: ${l}`));
    assert.fail(`${id} moved off the stopped node ${victim} (stopped at ${new Date(t0).toISOString()}): ` +
      `${JSON.stringify(s.placement)}\n${said.slice(-80).join('\n')}`);
  }
  await waitLog(victim, /joined again/, mark, 20000);
  assert.match(logOf(victim).slice(mark), /fenced/, 'a write of the woken node was refused');
  // The woken node stopped the sessions it lost, and counts them.
  const fenced = (await fetch(`${proc(victim).url}/metrics`).then((r) => r.text()))
    .match(/^armada_sessions_fenced_total (\S+)$/m);
  assert.ok(fenced && Number(fenced[1]) >= 1, `the woken node counted fenced sessions: ${fenced?.[0]}`);
  // It takes new work again.
  await nodesReady(live.length);
  const more = await createSessions(12, 'after-stop');
  const p = await waitProgress(more, 6);
  assert.ok([...p.values()].some((x) => x.node === victim), 'the node that woke up got new sessions');
  checkAll(await waitAll(more), []);  // no fault since: nothing may repeat
});

test('a client following a session through the gateway sees it go on when its node hangs', { timeout: 180000 * SLOW }, async () => {
  await nodesReady(3);
  const [id] = await createSessions(1, 'hang');
  const victim = (await waitProgress([id], 1)).get(id).node;
  const pid = proc(victim).pid;
  // The client's stream, through the gateway, from the node that holds the session.
  const events = [];
  const ctl = new AbortController();
  let endedAt = 0;
  const following = collectEvents(id, {
    signal: ctl.signal,
    onEvent: (ev) => {
      events.push(ev);
      if (ev.event === 'state' && ENDED.includes(JSON.parse(ev.data).state)) endedAt = Date.now();
    },
  }).catch((e) => { if (!ctl.signal.aborted) throw e; });
  await waitFor('the stream begun', async () => events.some((e) => /^\d+$/.test(e.id)), 30000);
  // The node hangs (no reset: its connections stay open and silent) until the client's stream
  // has reached the end of the session, for at most a minute.
  process.kill(pid, 'SIGSTOP');
  const t0 = Date.now();
  let resumedAt;
  try {
    await waitFor('the stream to the end of the session', async () => endedAt > 0, 60000);
  } catch { /* judged below */ } finally {
    resumedAt = Date.now();
    process.kill(pid, 'SIGCONT');
  }
  ctl.abort();
  await following;
  assert.ok(endedAt > 0 && endedAt <= resumedAt,
    `the stream reached the end while ${victim} was still stopped (ended ${endedAt ? endedAt - t0 : 'never'} ms after the stop)`);
  const s = (await waitAll([id])).get(id);
  assert.equal(s.state, 'completed', s.reason);
  assert.notEqual(s.placement.node, victim);
  // Every durable event once, in step order (the gateway reconnected with Last-Event-ID).
  const durable = events.filter((e) => /^\d+$/.test(e.id)).map((e) => Number(e.id));
  assert.deepEqual(durable, s.steps.filter((x) => !['user_input', 'moved'].includes(x.kind)).map((x) => x.seq));
  console.log(`hung ${victim}: the stream followed the session and ended ${endedAt - t0} ms after the stop`);
});

test('a node that wakes after its lease ended stops its idle sessions that moved, though they never write', { timeout: 180000 * SLOW }, async () => {
  await nodesReady(3);
  // Created without input, a session waits for it: idle, it writes nothing, so no refused write
  // would tell a woken node that it moved.
  const r = await fetch(`${gw}/v1/agents/worker/sessions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}',
  });
  assert.equal(r.status, 201, await r.clone().text());
  const { id } = await r.json();
  let placed;
  await waitFor('the idle session placed', async () => {
    placed = (await placements([id])).get(id);
    return placed?.node && placed.state === 'waiting_input';
  }, 30000 * SLOW);
  const victim = placed.node;
  // The row names the node as soon as the brain decides; the node holds a copy only once its run
  // command arrived. Stopped before that, it has nothing to stop when it wakes.
  await waitLog(victim, new RegExp(`running session ${id} \\(epoch`), 0, 15000);
  const pid = proc(victim).pid;
  const mark = logOf(victim).length;
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  const brainMarks = brains.map((b) => logOf(b.name).length);
  const moved = new RegExp(`session ${id} moved to (\\S+)`);
  process.kill(pid, 'SIGSTOP');
  try {
    await waitFor('the brain to move the session', async () =>
      brains.some((b, i) => moved.test(logOf(b.name).slice(brainMarks[i]))), 30000 * SLOW);
  } finally {
    process.kill(pid, 'SIGCONT');
  }
  await waitLog(victim, /joined again/, mark, 20000);
  // It stops its copy on its own, within a few of its 5 s checks.
  await waitLog(victim, new RegExp(`session ${id}: fenced`), mark, 20000);
  // The session goes on where it moved.
  const m = await fetch(`${gw}/v1/sessions/${id}/messages`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ content: 'go on' }),
  });
  assert.ok(m.status === 200 || m.status === 202, await m.text());
  const s = (await waitAll([id])).get(id);
  assert.equal(s.state, 'completed', s.reason);
  assert.notEqual(s.placement.node, victim);
});

test('kill -9 the leading cell brain: a standby leads within the TTL + 1 s and placement goes on', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  assert.equal(brains.length, 2);
  const leader = brains.find((b) => leadsNow(b.name));
  assert.ok(leader, 'a brain leads');
  const standby = brains.find((b) => b !== leader);
  const mark = logOf(standby.name).length;
  // The failovers of the node tests before this one, as the dashboard shows them now.
  const failoversOf = async () => (await fetch(`${gw}/dashboard/snapshot`).then((r) => r.json())).failovers
    .map((f) => `${f.node}@${f.at_ms}`);
  const seen = await failoversOf();
  assert.ok(seen.length > 0, 'the nodes killed and stopped earlier are among the recent failovers');
  // Sessions are running when it dies, and more come while no brain leads.
  await nodesReady(3);
  const running = await createSessions(SESSIONS - 16, 'brain');
  await waitProgress(running, 16);
  process.kill(leader.pid, 'SIGKILL');
  const t0 = Date.now();
  const ids = [...running, ...await createSessions(16, 'brain-after')];
  const ledAt = await waitLog(standby.name, /leads cell/, mark, 20000);
  console.log(`kill -9 brain ${leader.name}: ${standby.name} leads after ${ledAt - t0} ms`);
  if (timing) assert.ok(ledAt - t0 <= TTL_S * 1000 + 1000, `a standby led within the TTL + 1 s: ${ledAt - t0} ms`);
  const done = await waitAll(ids);
  checkAll(done, faults);
  // No node died meanwhile: each session was placed once, at epoch 1.
  for (const s of done.values()) assert.equal(s.placement?.epoch, 1, `${s.id} placed more than once`);
  // The new leader reports the failovers its predecessor saw.
  const now = await failoversOf();
  for (const f of seen) assert.ok(now.includes(f), `${f} is still among the recent failovers: ${now}`);
});

test('a new leader moves the sessions of a node that dies after it took over (it knows them from PostgreSQL)', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  // Two brains again (`cluster up` started the one killed before), one leading.
  let brains;
  const deadline = Date.now() + 90000 * SLOW;
  for (;;) {
    brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
    if (brains.length === 2 && brains.filter((b) => leadsNow(b.name)).length === 1) break;
    if (Date.now() > deadline) throw new Error(`not two brains with one leading: ${brains.map((b) => b.name)}`);
    await sleep(200);
  }
  const leader = brains.find((b) => leadsNow(b.name));
  const standby = brains.find((b) => b !== leader);
  const mark = logOf(standby.name).length;
  // Sessions placed by the leader, running when it dies.
  const ids = await createSessions(SESSIONS, 'handover');
  await waitProgress(ids, 16);
  process.kill(leader.pid, 'SIGKILL');
  await waitLog(standby.name, /leads cell/, mark, 20000);
  // Then a node holding open sessions the new leader never placed dies.
  const now = await placements(ids);
  const count = new Map();
  for (const p of now.values()) if (p.node && !ENDED.includes(p.state)) count.set(p.node, (count.get(p.node) ?? 0) + 1);
  const victim = [...count.entries()].sort((a, b) => b[1] - a[1])[0]?.[0];
  assert.ok(victim, 'a node held open sessions');
  const theirs = [...now.entries()].filter(([, p]) => p.node === victim && !ENDED.includes(p.state)).map(([id]) => id);
  const t0 = Date.now();
  process.kill(proc(victim).pid, 'SIGKILL');
  faults.push([t0, t0]);
  const done = await waitAll(ids);
  checkAll(done, faults);
  // The sessions still open on it were moved by the new leader, at the next epoch.
  const moved = theirs.filter((id) => done.get(id).placement?.epoch === 2);
  assert.ok(moved.length > 0, `none of ${theirs.length} sessions of ${victim} was moved`);
  for (const id of moved) assert.notEqual(done.get(id).placement.node, victim);
  assert.match(logOf(standby.name).slice(mark), new RegExp(`node ${victim} left \\(its lease is gone\\); [1-9]\\d* sessions to move`));
});

test('PostgreSQL killed and restarted: steps wait, then go on, nothing lost', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'pg');
  await waitProgress(ids, 24);
  // Every step a client sees through the gateway, by session: what was acknowledged.
  const seen = new Map(ids.map((id) => [id, []]));
  const look = async () => {
    const out = new Map();
    await Promise.all(ids.map(async (id) => {
      const r = await get(`/v1/sessions/${id}`);
      if (r.status !== 200) return;
      out.set(id, r.json.steps.length);
      if (r.json.steps.length > seen.get(id).length) seen.set(id, r.json.steps);
    }));
    return out;
  };
  await look();
  const old = status().servers.postgres.pid;
  // cluster up would restart PostgreSQL within a second: it is held for a while, so that the
  // outage is long enough to look at.
  process.kill(up.pid, 'SIGSTOP');
  let during1;
  let during2;
  let created;  // a session asked for while PostgreSQL is down: { status, at } once answered
  let createdBody = '';
  try {
    process.kill(old, 'SIGKILL');  // no tool call may be sent twice for it: a commit is retried, not the call
    await sleep(1000);  // a commit that was under way when it died is answered by now
    during1 = await look();
    const asked = fetch(`${gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: 'pg-down' }),
    }).then(async (r) => { createdBody = await r.text(); created = { status: r.status, at: Date.now() }; });
    created = null;
    await sleep(3000);
    during2 = await look();
    created ??= { pending: asked };
  } finally {
    process.kill(up.pid, 'SIGCONT');
  }
  // A new session is acknowledged (201) only once its row is durable: never while PostgreSQL is
  // down. It is refused then, or answered once PostgreSQL is back.
  if (!created.pending) assert.notEqual(created.status, 201, `a session was created while PostgreSQL was down: ${createdBody}`);
  // While PostgreSQL is down, no step is acknowledged: nothing a client can see moves.
  const both = ids.filter((id) => during1.has(id) && during2.has(id));
  assert.ok(both.length >= ids.length / 2, `sessions were readable through the gateway during the outage (${both.length})`);
  for (const id of both) assert.equal(during2.get(id), during1.get(id), `${id} showed a step while PostgreSQL was down`);
  const deadline = Date.now() + 30000 * SLOW;
  while (status().servers.postgres.pid === old && Date.now() < deadline) await sleep(100);
  assert.notEqual(status().servers.postgres.pid, old, 'cluster up restarted PostgreSQL');
  if (created.pending) {
    await created.pending;
    if (created.status === 201) ids.push(JSON.parse(createdBody).id);  // it runs like the others
  }
  if (created.status !== 201) assert.equal(created.status, 503, createdBody);
  const done = await waitAll(ids);
  checkAll(done, faults);
  // Nothing acknowledged was lost: every step seen at any time is in the final log, unchanged.
  for (const [id, steps] of seen) {
    const final = done.get(id).steps;
    for (const st of steps) assert.deepEqual(final.find((x) => x.seq === st.seq), st, `${id} step ${st.seq}`);
  }
});

test('etcd restarted on its data directory: no session is moved', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'etcd');
  await waitProgress(ids, 24);
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  const marks = brains.map((b) => logOf(b.name).length);
  const old = status().servers.etcd.pid;
  process.kill(old, 'SIGKILL');
  const deadline = Date.now() + 30000 * SLOW;
  while (status().servers.etcd.pid === old && Date.now() < deadline) await sleep(100);
  assert.notEqual(status().servers.etcd.pid, old, 'cluster up restarted etcd');
  const done = await waitAll(ids);
  checkAll(done, faults);
  brains.forEach((b, i) => assert.doesNotMatch(logOf(b.name).slice(marks[i]), /moved to/, `${b.name} moved sessions`));
  for (const s of done.values()) assert.equal(s.placement?.epoch, 1, `${s.id} was moved`);
});

async function metric(name) {
  const text = await fetch(gw + '/metrics').then((r) => r.text());
  const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}

test('Redis killed and restarted: clients see no error beyond one retry', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'redis');
  await waitProgress(ids, 24);
  // A placed session's reads are routed by the Redis cache (the first read fills it).
  const hitsBefore = await metric('armada_gateway_route_cache_hits_total');
  for (let i = 0; i < 3; i++) assert.equal((await get(`/v1/sessions/${ids[0]}`)).status, 200);
  const hits = await metric('armada_gateway_route_cache_hits_total');
  assert.ok(hits >= hitsBefore + 2, `session reads were routed by the Redis cache (${hitsBefore} → ${hits})`);
  let failures = 0;
  let calls = 0;
  const chat = async (i) => {
    for (let attempt = 0; attempt < 2; attempt++) {
      const r = await fetch(`${gw}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ messages: [{ role: 'user', content: `conversation ${i % 4}` }], max_tokens: 4 }) });
      await r.text();
      if (r.status === 200) return;
    }
    failures++;
  };
  const old = status().servers.redis.pid;
  // Requests go on from before the kill until Redis has been back a while: at least 4 s and 8
  // rounds after the kill (with 64 sessions running, a round can take a second).
  let killedAt = 0;
  let afterKill = 0;
  const load = (async () => {
    const end = Date.now() + 60000 * SLOW;
    for (let i = 0; Date.now() < end; i++) {
      if (killedAt && Date.now() > killedAt + 4000 && afterKill >= 8) break;
      calls++;
      if (killedAt) afterKill++;
      await Promise.all([chat(i), get(`/v1/sessions/${ids[i % ids.length]}`).then((r) => {
        if (r.status !== 200) failures++;
      })]);
    }
  })();
  await sleep(1500);
  process.kill(old, 'SIGKILL');
  killedAt = Date.now();
  await load;
  assert.notEqual(status().servers.redis.pid, old, 'cluster up restarted Redis');
  assert.ok(afterKill >= 8 && calls > afterKill, `requests were sent before and after Redis was killed (${calls}, ${afterKill})`);
  assert.equal(failures, 0, 'no request failed beyond one retry');
  checkAll(await waitAll(ids), faults);
});

test('NATS restarted while place requests wait: they are placed after it', { timeout: 300000 * SLOW }, async () => {
  const faults = [];  // this test's faults: [start, end] in ms
  await nodesReady(3);
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  const marks = brains.map((b) => logOf(b.name).length);
  for (const b of brains) process.kill(b.pid, 'SIGSTOP');
  let ids;
  try {
    ids = await createSessions(SESSIONS, 'nats');
    const old = status().servers.nats.pid;
    process.kill(old, 'SIGKILL');
    const deadline = Date.now() + 30000 * SLOW;
    while (status().servers.nats.pid === old && Date.now() < deadline) await sleep(100);
    assert.notEqual(status().servers.nats.pid, old, 'cluster up restarted NATS');
  } finally {
    for (const b of brains) process.kill(b.pid, 'SIGCONT');
  }
  checkAll(await waitAll(ids), faults);
  // The place messages, published before NATS went down, were delivered after it came back (the
  // brains' reconcile would have placed the sessions from PostgreSQL anyway; this checks the
  // queue): each session's own message, counted once however often it came.
  const taken = new Set(brains.flatMap((b, i) => [...logOf(b.name).slice(marks[i])
    .matchAll(/place request\(s\) taken from the queue:([^\n]*)/g)].flatMap((x) => x[1].trim().split(/\s+/))));
  const missing = ids.filter((id) => !taken.has(id));
  assert.deepEqual(missing, [], `${missing.length} of the ${ids.length} queued place requests were not taken after the restart`);
});

test('a chat completion whose node dies while answering gets 502 and is not sent to another node', { timeout: 120000 * SLOW }, async () => {
  const nodes = status().processes.filter((p) => p.role === 'node' && alive(p.pid));
  const active = async (p) => {
    const text = await fetch(`${p.url}/metrics`).then((r) => r.text());
    return Number(text.match(/^armada_sequences_active (\S+)$/m)?.[1] ?? 0);
  };
  for (const p of nodes) assert.equal(await active(p), 0, `${p.name} is idle before the test`);
  // Long answers (no agent session runs now): each holds one sequence on the node that took it.
  const sent = [0, 1, 2, 3].map((i) => `long answer ${i} ${Date.now()}`);
  const calls = sent.map((content) => fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: 1800 }),
  }).then(async (r) => ({ status: r.status, body: await r.text() })));
  // Once all four are being answered, the node holding the most of them is killed.
  let counts = [];
  const deadline = Date.now() + 20000 * SLOW;
  while (Date.now() < deadline) {
    counts = await Promise.all(nodes.map(active));
    if (counts.reduce((a, b) => a + b, 0) === 4) break;
    await sleep(50);
  }
  assert.equal(counts.reduce((a, b) => a + b, 0), 4, `all four were being answered: ${counts}`);
  const held = Math.max(...counts);
  const victim = nodes[counts.indexOf(held)];
  process.kill(victim.pid, 'SIGKILL');
  const results = await Promise.all(calls);
  const failed = results.filter((r) => r.status === 502);
  // The requests the dead node had taken fail, each once; sent again elsewhere, they would be 200.
  assert.equal(failed.length, held, JSON.stringify(results.map((r) => [r.status, r.body.slice(0, 120)])));
  for (const r of failed) assert.match(r.body, /may or may not have taken effect/);
  for (const r of results.filter((x) => x.status !== 502)) assert.equal(r.status, 200, r.body);
  // The conversations whose node died go on: their next request (same messages, so the same
  // prefix-affinity key, naming the dead node) is answered by another node.
  for (let i = 0; i < 4; i++) {
    if (results[i].status !== 502) continue;
    const again = await fetch(`${gw}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: sent[i] }], max_tokens: 4 }),
    });
    assert.equal(again.status, 200, await again.text());
  }
});

test('armada cell drain during 64 sessions: its sessions move with their KV, and all complete', { timeout: 300000 * SLOW }, async () => {
  await nodesReady(3);
  const ids = await createSessions(SESSIONS, 'drain');
  const before = await waitProgress(ids, 24);
  const count = new Map();
  for (const p of before.values()) if (p.node) count.set(p.node, (count.get(p.node) ?? 0) + 1);
  const victim = [...count.entries()].sort((a, b) => b[1] - a[1])[0][0];
  const theirs = [...before.entries()].filter(([, p]) => p.node === victim && !ENDED.includes(p.state))
    .map(([id]) => id);
  assert.ok(theirs.length >= 4, `the drained node runs sessions: ${theirs.length}`);
  const others = status().processes.filter((p) => p.role === 'node' && p.name !== victim && alive(p.pid));
  const restores = async () => {
    let journal = 0, failures = 0;
    for (const p of others) {
      const text = await fetch(`${p.url}/metrics`).then((x) => x.text());
      journal += metricSum(text, 'armada_kv_restores_total', 'from="journal"');
      failures += metricSum(text, 'armada_kv_restore_failures_total');
    }
    return { journal, failures };
  };
  const r0 = await restores();
  const victimPid = proc(victim).pid;
  const mark = logOf(victim).length;
  const t0 = Date.now();
  // Async: the tool server runs in this process and must keep answering meanwhile.
  const drained = await new Promise((resolve) => {
    const c = spawn(process.env.ARMADA_BIN, ['cell', 'drain', victim, '--wait', '--timeout', String(120 * SLOW),
      '--cluster', path.join(dir, 'cluster.yaml')], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    c.stdout.on('data', (d) => { out += d; });
    c.stderr.on('data', (d) => { out += d; });
    c.on('exit', (code) => resolve({ code, out }));
  });
  assert.equal(drained.code, 0, drained.out);
  assert.match(drained.out, new RegExp(`node ${victim} left after`));
  // It leaves etcd (its lease revoked) just before it exits.
  const gone = Date.now() + 30000 * SLOW;
  while (alive(victimPid) && Date.now() < gone) await sleep(100);
  assert.ok(!alive(victimPid), 'the drained node exited');
  const victimLog = logOf(victim).slice(mark);
  assert.match(victimLog, /drained; stopping/, 'it left empty, not at its drain timeout');
  // Nothing failed over: every session moved between steps, fetched by its new node.
  const done = await waitAll(ids);
  checkAll(done, []);
  let transfers = 0, none = 0, cuts = 0;
  for (const id of theirs) {
    const s = done.get(id);
    assert.notEqual(s.placement.node, victim, id);
    const moves = s.placement.moves.filter((m) => m.from === victim);
    // A session may have ended on the drained node before the drain began.
    if (s.steps.at(-1).ts_ms < t0 && moves.length === 0) continue;
    assert.equal(moves.length, 1, `${id} moved once: ${JSON.stringify(s.placement.moves)}`);
    const m = moves[0];
    assert.notEqual(m.to, victim, id);
    const at = s.steps.findIndex((x) => x.seq === m.seq);
    assert.equal(s.steps[at].kind, 'moved');
    const next = s.steps.slice(at + 1).find((x) => x.kind === 'model_output');
    assert.ok(next, `${id} took a model step after its move`);
    if (m.kv_source === 'transfer') {
      ++transfers;
      assert.ok(m.bytes > 0 && m.tokens > 0 && m.ms >= 0, JSON.stringify(m));
      // It resumed from the transferred KV: no re-prefill of what it held. (The KV ends with
      // the reply as generated; the next prompt renders that reply through the chat template,
      // so the shared prefix is at least the last prompt, not every token of the reply.)
      assert.equal(next.data.kv_source, 'journal', `${id}: ${JSON.stringify(next.data)}`);
      const prev = s.steps.slice(0, at).filter((x) => x.kind === 'model_output').at(-1);
      const floor = prev ? prev.data.prompt_tokens : 1;
      assert.ok(next.data.cached_tokens >= floor && next.data.cached_tokens <= m.tokens,
        `${id}: cached ${next.data.cached_tokens}, the last prompt ${floor}, the KV ${m.tokens}`);
    } else {
      ++none;
      assert.equal(m.kv_source, 'none', JSON.stringify(m));
      // Only a cut transfer, or a session that never took a step there (no KV), moves without.
      assert.match(m.error, /broke off|no KV of session/, `a move without KV says why: ${JSON.stringify(m)}`);
      if (/broke off/.test(m.error)) ++cuts;
      assert.notEqual(next.data.kv_source, 'journal', id);
    }
  }
  console.log(`drain of ${victim}: ${transfers} sessions moved with their KV, ${none} without ` +
    `(ARMADA_KV_SEND_CUT=5 cuts every 5th send)`);
  assert.ok(transfers > 0, 'some sessions moved with their KV');
  assert.ok(cuts > 0, 'a cut transfer still moved its session (it re-prefilled)');
  // Every fifth send is cut: with no other failure, that many and no more.
  assert.equal(cuts, Math.floor((transfers + cuts) / 5), `${cuts} cuts in ${transfers + cuts} sends`);
  const r1 = await restores();
  assert.ok(r1.journal - r0.journal >= transfers, `journal restores ${r0.journal} -> ${r1.journal}`);
  assert.equal(r1.failures, r0.failures, 'no restore failed');
});

test('a node that drains tells the brain at once (an event on armada.event), then leaves', { timeout: 120000 * SLOW }, async () => {
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  // Exactly one: a brain killed earlier and started again does not count from its old log.
  const leaders = brains.filter((b) => leadsNow(b.name));
  assert.equal(leaders.length, 1, `one brain leads: ${leaders.map((b) => b.name)}`);
  const leader = leaders[0];
  const node = status().processes.find((p) => p.role === 'node' && alive(p.pid));
  const mark = logOf(leader.name).length;
  process.kill(node.pid, 'SIGTERM');
  // Only the event path logs this (a load report saying "draining" is taken silently).
  await waitLog(leader.name, new RegExp(`node ${node.name} drains`), mark, 10000);
  const deadline = Date.now() + 60000 * SLOW;
  while (alive(node.pid) && Date.now() < deadline) await sleep(100);
  assert.ok(!alive(node.pid), 'the drained node exited');
});

// The candidates in a cell's brain election: each key (name/lease) with the revision it was made
// at. A campaign that gives up (a deadline, a dropped call) is withdrawn by the server, which
// deletes the candidate's key; standing again makes a new one.
async function candidacies(cell) {
  const prefix = `/armada/cells/${cell}/brain/`;
  return (await etcdRange(status().servers.etcd, prefix, { prefix: true })).map((kv) => [Buffer.from(kv.key, 'base64').toString(), kv.create_revision]).sort();
}

// Keys etcd has deleted and reads it has served so far. Reads at rest come from processes that
// poll instead of watching.
async function etcdCounts() {
  const text = await fetch(`http://${status().servers.etcd.endpoint.replace(/^https?:\/\//, '')}/metrics`).then((r) => r.text());
  const count = (name) => {
    const m = text.match(new RegExp(`^${name} (\\d+)`, 'm'));
    assert.ok(m, `etcd reports ${name}`);
    return Number(m[1]);
  };
  return { ranges: count('etcd_mvcc_range_total') };
}

test('a standby waits on observe, not by campaigning again; the leader resigns on SIGINT and the standby leads at once', { timeout: 120000 * SLOW }, async () => {
  const brains = status().processes.filter((p) => p.role === 'cell' && alive(p.pid));
  assert.equal(brains.length, 2);
  const leader = brains.find((b) => leadsNow(b.name));
  assert.ok(leader, 'a brain leads');
  const standby = brains.find((b) => b !== leader);
  // Both brains stand, each once. A standby's campaign call has a 60 s deadline, after which it
  // stands anew (a new key, a newer create revision); one 5 s window can catch that, two in a row
  // cannot. A standby that campaigned with a 1 s deadline, again and again, changes its key in
  // every window.
  let keysBefore, keysAfter, before, after;
  for (let window = 0; window < 2; ++window) {
    keysBefore = await candidacies('cell0');
    before = await etcdCounts();
    await sleep(5000);
    after = await etcdCounts();
    keysAfter = await candidacies('cell0');
    assert.equal(keysBefore.length, 2, `two candidacies: ${JSON.stringify(keysBefore)}`);
    if (JSON.stringify(keysAfter) === JSON.stringify(keysBefore)) break;
    console.log(`window ${window}: a candidacy changed: ${JSON.stringify(keysBefore)} -> ${JSON.stringify(keysAfter)}`);
  }
  assert.deepEqual(keysAfter, keysBefore, 'the same candidacies, unchanged, for 5 s (in one of two windows)');
  // Brains and the gateway watch and observe: a few reads (reconciles) in 5 s at rest. A gateway
  // listing the cluster every 250 ms, or a leader asking etcd who leads every second, would
  // make dozens.
  const reads = after.ranges - before.ranges;
  console.log(`etcd reads in 5 s at rest: ${reads}`);
  assert.ok(reads <= 10, `${reads} etcd reads in 5 s at rest`);
  // Each brain serves its own metrics (Prometheus' lint passes): who leads, the leaders it saw,
  // the decisions it wrote.
  const brainMetrics = async (b) => {
    const text = await fetch(`${b.url}/metrics`).then((x) => x.text());
    assertLintedMetrics(text, b.name);
    return (name, labels = '') => metricSum(text, name, labels);
  };
  const lm = await brainMetrics(leader);
  const sm = await brainMetrics(standby);
  assert.equal(lm('armada_brain_leading'), 1, leader.name);
  assert.equal(sm('armada_brain_leading'), 0, standby.name);
  assert.ok(lm('armada_brain_epoch') > 0);
  // Both name the election they stand in (the rule "a cell without a leading brain" joins on it).
  assert.equal(lm('armada_brain_info', 'election="'), 1, leader.name);
  assert.equal(sm('armada_brain_info', 'election="'), 1, standby.name);
  assert.ok(lm('armada_brain_decisions_total', 'kind="place"') + sm('armada_brain_decisions_total', 'kind="place"') > 0,
    'the sessions of the tests before were placed by these brains');
  // Re-placements, by kind: sessions of the lost nodes moved (the fault tests), and the drained
  // node's moved with their KV. Each round of decisions is timed.
  const both = (name, labels) => lm(name, labels) + sm(name, labels);
  assert.ok(both('armada_brain_decisions_total', 'kind="move"') > 0, 'the lost nodes\' sessions were re-placed');
  assert.ok(both('armada_brain_decisions_total', 'kind="migrate"') > 0, 'the drained node\'s sessions migrated');
  const rounds = both('armada_brain_decision_seconds_count');
  const mean = both('armada_brain_decision_seconds_sum') / rounds;
  assert.ok(rounds > 0 && mean > 0 && mean < 1, `${rounds} timed rounds of decisions, ${mean} s each on average`);
  assert.equal(both('armada_brain_decision_seconds_bucket', 'le="+Inf"'), rounds);
  // The cell's aggregates and its chain survival, read from the store's rows: the 64 sessions of
  // the first fault test completed in this hour, whatever was killed under them.
  const cell = (name, outcome) => lm(name, outcome ? `cell="cell0",outcome="${outcome}"` : 'cell="cell0"');
  assert.ok(cell('armada_cell_sessions_ended', 'completed') >= 64, 'the fault tests\' sessions completed');
  const decided = ['completed', 'failed', 'timed_out', 'lost'].reduce((n, o) => n + cell('armada_cell_sessions_ended', o), 0);
  assert.ok(Math.abs(cell('armada_cell_chain_survival_ratio') - cell('armada_cell_sessions_ended', 'completed') / decided) < 1e-9);
  assert.equal(cell('armada_cell_nodes'), status().processes.filter((p) => p.role === 'node' && alive(p.pid)).length);
  // At least one node is live after the drain tests (each began from 3 and took one away).
  assert.ok(cell('armada_cell_nodes') >= 1, 'a node is left to report its KV budget');
  const watermark = cell('armada_cell_kv_watermark_ratio');
  assert.ok(!Number.isNaN(watermark) && watermark >= 0 && watermark < 1, `KV watermark ${watermark} (every node reports its KV budget)`);
  assert.ok(cell('armada_cell_free_sequences') > 0);
  // Only the leader speaks for the cell (a standby that led before has dropped its figures).
  assert.doesNotMatch(await fetch(`${standby.url}/metrics`).then((x) => x.text()), /^armada_cell_/m, standby.name);
  const changesSeen = sm('armada_brain_leader_changes_total');
  assert.ok(changesSeen >= 1);
  const mark = logOf(standby.name).length;
  const leaderMark = logOf(leader.name).length;
  const t0 = Date.now();
  process.kill(leader.pid, 'SIGINT');
  const ledAt = await waitLog(standby.name, /leads cell/, mark, 10000);
  await waitFor('the new leader\'s metrics', async () => (await brainMetrics(standby))('armada_brain_leading') === 1, 5000);
  assert.ok((await brainMetrics(standby))('armada_brain_leader_changes_total') > changesSeen);
  console.log(`SIGINT ${leader.name}: ${standby.name} leads after ${ledAt - t0} ms`);
  // Well inside the lease TTL: the key went with the resignation, not with the lease's expiry.
  assert.ok(ledAt - t0 < (timing ? 1500 : TTL_S * 1000), `${standby.name} led after ${ledAt - t0} ms`);
  await waitLog(leader.name, /resigned/, leaderMark, 5000);
});
