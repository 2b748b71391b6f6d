// Black-box tests of server-side agent sessions: the loop, tools, durability and the API.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, rawPost, tinyModel, createdStatus } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { getJson, waitFor, assertCompleteLog } from './session_helpers.mjs';

let tools;
let srv;
let dir;

// Agents of the operator's file besides `worker`: one whose tool waits 3 s (to hold a session in
// waiting_tool), and one whose header names a secret of the server's environment.
const operatorAgents = (url) => `  - id: slowpoke
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 96 }
    tools:
      - name: wait
        url: ${url}/slow
        timeout_ms: 10000
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
  - id: sec
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 96 }
    tools:
      - name: t
        url: ${url}/secret
        headers: { X-Token: "\${env:ARMADA_TEST_SECRET}" }
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
  - id: nosec
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 96 }
    tools:
      - name: t
        url: ${url}/secret
        headers: { X-Token: "\${env:ARMADA_NO_SUCH_VAR}" }
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;

before(async () => {
  tools = await startToolServer();
  dir = tempDir('armada-sessions-');
  const agents = writeAgents(dir, agentYaml(tools.url, { extra: operatorAgents(tools.url) }));
  srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1',
    '-np', '4', '-c', '8192'], { env: { ARMADA_TEST_SECRET: 's3cr3t-value-42' } });
});

after(async () => {
  if (srv) await srv.stop();
  if (tools) await tools.close();
});

test('a session runs its tool steps, answers, and logs every step once', async () => {
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'Process record alpha' });
  assert.equal(r.status, createdStatus, r.text);
  assert.match(r.json.id, /^sess_/);
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
  assertCompleteLog(s, 3);
  assert.equal(s.usage.model_steps, 4);
  assert.ok(s.usage.prompt_tokens > 0 && s.usage.completion_tokens > 0);
  for (const st of s.steps.filter((x) => x.kind === 'tool_result')) {
    assert.equal(st.data.is_error, false, JSON.stringify(st.data));
    assert.equal(tools.effects.get(st.idempotency_key), 1);
  }
  // Arguments the tool server received are the model's schema-valid JSON.
  for (const st of s.steps.filter((x) => x.kind === 'tool_call')) {
    const args = JSON.parse(st.data.arguments);
    if (st.data.name === 'lookup') assert.ok(['alpha', 'beta', 'gamma'].includes(args.record));
    else assert.ok([1, 2, 3].includes(args.value));
  }
});

// Event ids: "12" for the step with seq 12, "12.3" for the third event after it that is not
// stored (a token). Compared as (seq, sub).
const idKey = (id) => id.split('.').map(Number);
const idLess = (a, b) => { const [x, y] = [idKey(a), idKey(b)]; return x[0] !== y[0] ? x[0] < y[0] : (x[1] ?? 0) < (y[1] ?? 0); };
const durable = new Set(['message', 'tool_call', 'tool_result', 'state']);

test('events stream over SSE and resume after Last-Event-ID', async () => {
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'go' });
  const id = r.json.id;
  // Followed live, the stream has tokens too; it is read until the session completes.
  const all = await sseUntil(`${srv.base}/v1/sessions/${id}/events`, {},
    (e) => e.event === 'state' && JSON.parse(e.data).state === 'completed');
  const types = all.map((e) => e.event);
  for (const t of ['state', 'token', 'message', 'tool_call', 'tool_result']) assert.ok(types.includes(t), `missing ${t}`);
  for (let i = 1; i < all.length; i++) assert.ok(idLess(all[i - 1].id, all[i].id), `${all[i - 1].id} then ${all[i].id}`);
  // Stored events are the steps of the log: their ids are the steps' seq numbers.
  const s = await waitFor(srv.base, id, ['completed']);
  for (const e of all.filter((x) => durable.has(x.event))) {
    assert.match(e.id, /^\d+$/);
    assert.ok(s.steps.some((st) => st.seq === Number(e.id)), `event ${e.id} is a step`);
  }
  // From the middle: exactly the stored events after it, with the same ids and data.
  const mid = all.filter((e) => durable.has(e.event))[3].id;
  const rest = await sseUntil(`${srv.base}/v1/sessions/${id}/events`, { 'Last-Event-ID': mid },
    (e) => e.event === 'state' && JSON.parse(e.data).state === 'completed');
  const want = all.filter((e) => durable.has(e.event) && idLess(mid, e.id));
  assert.deepEqual(rest.map((e) => [e.id, e.event, e.data]), want.map((e) => [e.id, e.event, e.data]));
  // A token's id resumes from its place too.
  const tok = all.find((e) => e.event === 'token');
  const afterTok = await sseUntil(`${srv.base}/v1/sessions/${id}/events`, { 'Last-Event-ID': tok.id },
    (e) => e.event === 'state' && JSON.parse(e.data).state === 'completed');
  assert.ok(afterTok.length > 0 && afterTok.every((e) => idLess(tok.id, e.id)));
  const bad = await fetch(`${srv.base}/v1/sessions/${id}/events`, { headers: { 'Last-Event-ID': 'x1' } });
  assert.equal(bad.status, 400);
});

// Reads an SSE stream until `stop` says so for an event (or 60 s pass) and returns its events.
async function sseUntil(url, headers, stop) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 60000);
  const events = [];
  let buf = '';
  try {
    const res = await fetch(url, { headers, signal: ctl.signal });
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, at);
        buf = buf.slice(at + 2);
        const ev = {};
        for (const line of block.split('\n')) {
          const i = line.indexOf(': ');
          ev[line.slice(0, i)] = line.slice(i + 2);
        }
        events.push(ev);
        if (stop(ev)) { ctl.abort(); return events; }
      }
    }
  } catch {
    // aborted
  } finally {
    clearTimeout(timer);
  }
  return events;
}

test('a quiet event stream sends a keep-alive comment every 5 s, so proxies and clients see it live', async () => {
  // No input: the session waits for a message, and its stream has nothing to say.
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', {});
  assert.equal(r.status, createdStatus, r.text);
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 15000);
  let raw = '';
  let keptAt = 0;
  const t0 = Date.now();
  try {
    const res = await fetch(`${srv.base}/v1/sessions/${r.json.id}/events`, { signal: ctl.signal });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    while (!keptAt) {
      const { value, done } = await reader.read();
      if (done) break;
      raw += dec.decode(value, { stream: true });
      if (raw.includes('\n: keep-alive\n\n') || raw.startsWith(': keep-alive\n\n')) keptAt = Date.now();
    }
  } catch { /* aborted: judged below */ } finally {
    clearTimeout(timer);
    ctl.abort();
  }
  assert.ok(keptAt, `a keep-alive within 15 s; the stream said: ${JSON.stringify(raw)}`);
  assert.ok(keptAt - t0 >= 4000, `not before the 5 s period: ${keptAt - t0} ms`);
});

test('a later user message continues the same session', async () => {
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'first' });
  const id = r.json.id;
  const first = await waitFor(srv.base, id, ['completed']);
  const m = await rawPost(srv.base, `/v1/sessions/${id}/messages`, { content: 'and again' });
  assert.equal(m.status, 200, m.text);
  const s = await waitFor(srv.base, id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
  assert.ok(s.steps.length > first.steps.length);
  assert.equal(s.transcript.filter((x) => x.role === 'user').length, 2);
});

test('a session busy with a tool refuses a message with 409', async () => {
  const r = await rawPost(srv.base, '/v1/agents/slowpoke/sessions', { input: 'x' });
  await waitFor(srv.base, r.json.id, ['waiting_tool']);
  const busy = await rawPost(srv.base, `/v1/sessions/${r.json.id}/messages`, { content: 'now' });
  assert.equal(busy.status, 409, busy.text);
  assert.match(busy.json.error.message, /waiting_tool/);
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
});

test('cancel and delete', async () => {
  const r = await rawPost(srv.base, '/v1/agents/slowpoke/sessions', { input: 'slow' });
  const id = r.json.id;
  await waitFor(srv.base, id, ['waiting_tool']);
  const c = await rawPost(srv.base, `/v1/sessions/${id}/cancel`, {});
  assert.equal(c.status, 200, c.text);
  const s = await waitFor(srv.base, id, ['cancelled']);
  assert.equal(s.reason, 'cancelled by the client');
  assert.equal(s.steps.at(-1).kind, 'state');
  // Once ended, a cancel is refused.
  const again = await rawPost(srv.base, `/v1/sessions/${id}/cancel`, {});
  assert.equal(again.status, 409, again.text);
  const d = await fetch(`${srv.base}/v1/sessions/${id}`, { method: 'DELETE' });
  assert.equal(d.status, 200);
  assert.equal((await getJson(srv.base, `/v1/sessions/${id}`)).status, 404);
  assert.equal((await rawPost(srv.base, '/v1/agents/nobody/sessions', { input: 'x' })).status, 404);
  assert.equal((await getJson(srv.base, '/v1/sessions/sess_unknown')).status, 404);
});

test('a tool that fails reaches the model as an error result and the loop goes on', async () => {
  const yaml = `id: flaky
instructions: try
min_tool_steps: 1
answer_without_tools: true
parallel_tool_calls: false
limits: { max_steps: 4, max_tokens_per_step: 64 }
tools:
  - name: down
    url: ${tools.url}/fail
    retries: 1
    parameters: { type: object, properties: { x: { type: boolean } }, required: [x] }
`;
  const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml, headers: { 'Content-Type': 'application/yaml' } });
  assert.equal(a.status, 200, await a.text());
  const r = await rawPost(srv.base, '/v1/agents/flaky/sessions', { input: 'x' });
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
  const res = s.steps.find((x) => x.kind === 'tool_result');
  assert.equal(res.data.is_error, true);
  assert.match(res.data.content, /503/);
  assert.equal(res.data.attempts, 2);
});

test('tool output in GBK arrives as UTF-8; a redirect to a denied address is blocked', async () => {
  const yaml = `id: gbk
min_tool_steps: 2
answer_without_tools: true
parallel_tool_calls: false
limits: { max_steps: 4, max_tokens_per_step: 64 }
tools:
  - name: cn
    url: ${tools.url}/gbk
    parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
  assert.equal((await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml })).status, 200);
  const r = await rawPost(srv.base, '/v1/agents/gbk/sessions', { input: 'x' });
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  const res = s.steps.filter((x) => x.kind === 'tool_result');
  assert.equal(res[0].data.content, '你好，世界');

  const yaml2 = `id: redirector
min_tool_steps: 1
answer_without_tools: true
parallel_tool_calls: false
limits: { max_steps: 3, max_tokens_per_step: 64 }
tools:
  - name: hop
    url: ${tools.url}/redirect-home
    parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
  assert.equal((await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml2 })).status, 200);
  const r2 = await rawPost(srv.base, '/v1/agents/redirector/sessions', { input: 'x' });
  const s2 = await waitFor(srv.base, r2.json.id, ['completed', 'failed']);
  const res2 = s2.steps.find((x) => x.kind === 'tool_result');
  assert.match(res2.data.content, /blocked: address 127\.0\.0\.2 is loopback/);
});

test('invalid agents are refused with the field and the reason', async () => {
  const bad = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: 'id: x\ntools:\n  - name: t\n    url: http://a/\n    parameters: { type: object, properties: { a: { type: wrong } } }\n' });
  assert.equal(bad.status, 400);
  const body = await bad.json();
  assert.match(body.error.message, /agent\.tools\[0\]\.parameters\.properties\.a\.type: 'wrong' is not a JSON Schema type/);

  // Aliases that make a node contain itself, found by fuzzing: a clear 400, not a stack overflow.
  for (const body of ['id: loop\nparameters: x\nx: &a [*a]\n',
    'id: loop\ntools:\n  - name: t\n    url: http://a/\n    parameters: &p { type: object, properties: { n: *p } }\n']) {
    const r = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body });
    assert.equal(r.status, 400, body);
    assert.match((await r.json()).error.message, /nested deeper than 64 levels \(or an alias refers to itself\)/);
  }
  // Bytes that are not UTF-8 in a schema's key (also found by fuzzing) become U+FFFD, not a 500.
  const bin = Buffer.concat([Buffer.from('{"id":"bytes","tools":[{"name":"t","url":"http://a/","parameters":{"type":"object","'),
    Buffer.from([0x9a, 0x8d]), Buffer.from('":{"type":"string"}}}]}')]);
  const rb = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: bin });
  assert.equal(rb.status, 200, await rb.text());
  const bytes = await (await fetch(`${srv.base}/v1/agents/bytes`)).json();
  assert.deepEqual(Object.keys(bytes.tools[0].parameters).sort(), ['type', '\ufffd\ufffd'].sort());
  assert.equal((await fetch(srv.base + '/health')).status, 200);

  const d = tempDir('armada-badagent-');
  const file = writeAgents(d, 'agents:\n  - id: a\n    limits: { max_steps: -3 }\n');
  const out = spawnSync(process.env.ARMADA_BIN, ['serve', '-m', tinyModel, '--port', '0', '--agents', file,
    '--data-dir', path.join(d, 'data')], { encoding: 'utf8', timeout: 30000 });
  assert.equal(out.status, 2);
  assert.match(out.stderr, /agents\[0\]\.limits\.max_steps: must be between 1 and 1000/);
  fs.writeFileSync(file, 'agents:\n  - id: a\n    tools:\n      - name: t\n        url: ftp://x\n');
  const out2 = spawnSync(process.env.ARMADA_BIN, ['serve', '-m', tinyModel, '--port', '0', '--agents', file,
    '--data-dir', path.join(d, 'data')], { encoding: 'utf8', timeout: 30000 });
  assert.equal(out2.status, 2);
  assert.match(out2.stderr, /agents\[0\]\.tools\[0\]\.url: must be http:\/\/ or https:\/\//);
});

test('sessions belong to the key that created them', async () => {
  const d = tempDir('armada-keys-');
  fs.writeFileSync(path.join(d, 'keys'), 'sk-a\nsk-b\n');
  const s = await startServer(['--api-key-file', path.join(d, 'keys'), '--agents', writeAgents(d, agentYaml(tools.url)),
    '--data-dir', path.join(d, 'data'), '--tool-allow', '127.0.0.1', '-c', '8192']);
  try {
    const a = { Authorization: 'Bearer sk-a' };
    const b = { Authorization: 'Bearer sk-b' };
    const r = await rawPost(s.base, '/v1/agents/worker/sessions', { input: 'mine' }, a);
    assert.equal(r.status, createdStatus, r.text);
    assert.equal((await getJson(s.base, `/v1/sessions/${r.json.id}`, a)).status, 200);
    assert.equal((await getJson(s.base, `/v1/sessions/${r.json.id}`, b)).status, 404);
    assert.equal((await rawPost(s.base, `/v1/sessions/${r.json.id}/cancel`, {}, b)).status, 404);
    assert.equal((await fetch(`${s.base}/v1/sessions/${r.json.id}`, { method: 'DELETE', headers: b })).status, 404);
    assert.equal((await getJson(s.base, `/v1/sessions/${r.json.id}`)).status, 401);
    await waitFor(s.base, r.json.id, ['completed', 'failed'], { headers: a });
  } finally {
    await s.stop();
  }
});

// Behind a gateway, /metrics is the gateway's own; the node's session metrics are read from it.
test('metrics count sessions, steps, tools and the chain survival rate', async () => {
  const t = await (await fetch(srv.metricsBase + '/metrics')).text();
  assert.match(t, /armada_sessions_total\{outcome="completed"\} [1-9]/);
  assert.match(t, /armada_session_steps_total [1-9]/);
  assert.match(t, /armada_tool_calls_total\{tool="lookup",result="ok"\} [1-9]|armada_tool_calls_total\{tool="store",result="ok"\} [1-9]/);
  assert.match(t, /armada_tool_call_seconds_bucket\{tool="/);
  const m = t.match(/^armada_chain_survival_ratio (\S+)/m);
  assert.ok(m && Number(m[1]) > 0 && Number(m[1]) <= 1);
});

test('a session\'s KV stays in its sequence across its tool calls, and the queue waits are in /metrics by policy', async () => {
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'Process record gamma' });
  assert.equal(r.status, createdStatus, r.text);
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
  const t = await (await fetch(srv.metricsBase + '/metrics')).text();
  const count = (re) => { const m = t.match(re); return m ? Number(m[1]) : 0; };
  // The test's tools answer in milliseconds, within any hold: the session comes back to its own
  // sequence (kept). Every tool step of every session so far ended its hold one way or another.
  const kept = count(/^armada_kv_holds_total\{outcome="kept"\} (\S+)/m);
  const all = ['kept', 'expired', 'taken', 'none']
    .reduce((n, o) => n + count(new RegExp(`^armada_kv_holds_total\\{outcome="${o}"\\} (\\S+)`, 'm')), 0);
  assert.ok(kept >= 1, t.split('\n').filter((l) => l.includes('holds')).join('\n'));
  assert.ok(all >= 3, `holds ended: ${all}`);
  assert.ok(count(/^armada_engine_queue_wait_seconds_count\{policy="fcfs"\} (\S+)/m) >= 4);
  assert.ok(count(/^armada_engine_programs\{engine="0"\} (\S+)/m) >= 1);
});

test('max_steps, the token budget and the deadline end a session as failed, with the reason', async () => {
  const agent = (id, limits, path = 'lookup') => `id: ${id}
min_tool_steps: 5
parallel_tool_calls: false
limits: { ${limits} }
tools:
  - name: lookup
    url: ${tools.url}/${path}
    parameters: { type: object, properties: { r: { type: string, enum: [a, b] } }, required: [r] }
`;
  // The deadline's tool answers after 3 s, so five steps cannot fit in 1 s however fast the
  // model is.
  const cases = [
    ['steps', 'max_steps: 2, max_tokens_per_step: 96', /^max_steps \(2\) reached$/],
    ['budget', 'token_budget: 50, max_tokens_per_step: 96', /^token budget \(50\) spent$/],
    ['deadline', 'deadline_s: 1, max_tokens_per_step: 96', /^deadline \(1 s\) passed$/, 'slow'],
  ];
  for (const [id, limits, reason, path] of cases) {
    const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: agent(id, limits, path) });
    assert.equal(a.status, 200, await a.text());
    const r = await rawPost(srv.base, `/v1/agents/${id}/sessions`, { input: 'x' });
    const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
    assert.equal(s.state, 'failed', id);
    assert.match(s.reason, reason);
    assert.equal(s.steps.at(-1).kind, 'state');
  }
});

test('tool bodies are capped, slow tools time out, header secrets reach the tool and nothing else', async () => {
  const one = (id, url, extra = '') => `id: ${id}
min_tool_steps: 1
answer_without_tools: true
parallel_tool_calls: false
limits: { max_steps: 3, max_tokens_per_step: 96 }
tools:
  - name: t
    url: ${url}
${extra}    parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
  const run = async (id, yaml) => {
    assert.equal((await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml })).status, 200);
    const r = await rawPost(srv.base, `/v1/agents/${id}/sessions`, { input: 'x' });
    return waitFor(srv.base, r.json.id, ['completed', 'failed']);
  };
  const big = await run('big', one('big', `${tools.url}/big`));
  const bigRes = big.steps.find((x) => x.kind === 'tool_result').data;
  assert.equal(bigRes.is_error, false);
  assert.match(bigRes.content, /^x{65536}\n\[output truncated at 65536 bytes\]$/);

  const slow = await run('slow', one('slow', `${tools.url}/slow`, '    timeout_ms: 500\n'));
  const slowRes = slow.steps.find((x) => x.kind === 'tool_result').data;
  assert.equal(slowRes.is_error, true);
  assert.match(slowRes.content, /did not answer within 500 ms/);

  // A secret named by the operator's agent file reaches the tool, and nothing else.
  const r = await rawPost(srv.base, '/v1/agents/sec/sessions', { input: 'x' });
  const sec = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
  assert.equal(sec.state, 'completed', sec.reason);
  assert.ok(tools.secrets.includes('s3cr3t-value-42'), 'the tool received the secret');
  const all = JSON.stringify(sec) + JSON.stringify(await (await fetch(`${srv.base}/v1/agents`)).json()) +
    JSON.stringify(await (await fetch(`${srv.base}/v1/agents/sec`)).json());
  assert.ok(!all.includes('s3cr3t-value-42'), 'the secret is not in the session or the agent');
  assert.ok(!srv.stdout().includes('s3cr3t') && !srv.stderr().includes('s3cr3t'), 'nor in the logs');

  // A secret the operator named but did not provide is a clear tool error.
  const r2 = await rawPost(srv.base, '/v1/agents/nosec/sessions', { input: 'x' });
  const missing = await waitFor(srv.base, r2.json.id, ['completed', 'failed']);
  const missRes = missing.steps.find((x) => x.kind === 'tool_result').data;
  assert.equal(missRes.is_error, true);
  assert.match(missRes.content, /environment variable ARMADA_NO_SUCH_VAR is not set/);
});

test('a client cannot make the server read its own environment or files', async () => {
  const secrets = tools.secrets.length;
  for (const ref of ['${env:ARMADA_TEST_SECRET}', 'Bearer ${file:/etc/hostname}']) {
    // In a tool's header, and anywhere else in the agent.
    for (const yaml of [
      `id: leak\ntools:\n  - name: t\n    url: ${tools.url}/secret\n    headers: { X-Token: "${ref}" }\n`,
      `id: leak\ninstructions: "${ref}"\n`,
      `id: leak\ntools:\n  - mcp: { url: "http://127.0.0.1:1/mcp", headers: { Authorization: "${ref}" } }\n`,
    ]) {
      const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml });
      assert.equal(a.status, 400, yaml);
      assert.match((await a.json()).error.message, /expanded only in agent files the operator gives with --agents/);
    }
  }
  assert.equal((await fetch(`${srv.base}/v1/agents/leak`)).status, 404);
  // The Responses API's mcp tool headers, too.
  const resp = await rawPost(srv.base, '/v1/responses', {
    input: 'x', tools: [{ type: 'mcp', server_label: 's', server_url: `${tools.url}/mcp`, headers: { 'X-Token': '${env:ARMADA_TEST_SECRET}' } }],
  });
  assert.equal(resp.status, 400, resp.text);
  assert.match(resp.json.error.message, /expanded only in the operator's agent files/);
  assert.equal(tools.secrets.length, secrets, 'no request reached the tool');
});

test('redirects: the same origin keeps the headers, another origin gets none of them, follow_redirects: false stops', async () => {
  const other = await startToolServer();
  try {
    const agent = (id, url, extra = '') => `id: ${id}
min_tool_steps: 1
answer_without_tools: true
parallel_tool_calls: false
limits: { max_steps: 3, max_tokens_per_step: 64 }
tools:
  - name: t
    url: ${url}
    headers: { Authorization: "Bearer tool-token", Cookie: "c=1", X-Token: "spec-header" }
${extra}    parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
    const run = async (id, yaml) => {
      const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: yaml });
      assert.equal(a.status, 200, await a.text());
      const r = await rawPost(srv.base, `/v1/agents/${id}/sessions`, { input: 'x' });
      const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
      return s.steps.find((x) => x.kind === 'tool_result').data;
    };
    const before = tools.seen.length;
    const same = await run('hopsame', agent('hopsame', `${tools.url}/hop`));
    assert.equal(same.is_error, false, same.content);
    const got = tools.seen.slice(before);
    assert.equal(got.length, 1);
    assert.deepEqual([got[0].authorization, got[0].cookie, got[0].token, got[0].method], ['Bearer tool-token', 'c=1', 'spec-header', 'POST']);

    const away = await run('hopaway', agent('hopaway', `${tools.url}/hop?to=${encodeURIComponent(other.url + '/headers')}`));
    assert.equal(away.is_error, false, away.content);
    assert.equal(other.seen.length, 1);
    assert.deepEqual([other.seen[0].authorization, other.seen[0].cookie, other.seen[0].token], [null, null, null],
      'another origin (another port) gets none of the credentials or spec headers');
    assert.match(other.seen[0].key, /:\d+:\d+$/, 'the idempotency key still goes along');

    const stay = await run('nohop', agent('nohop', `${tools.url}/hop`, '    follow_redirects: false\n'));
    assert.equal(stay.is_error, true);
    assert.match(stay.content, /answered HTTP 307 \(a redirect to http:\/\/127\.0\.0\.1:\d+\/headers\), and its follow_redirects is false/);
    assert.equal(tools.seen.length, before + 1, 'the redirect was not followed');
  } finally {
    await other.close();
  }
});
