// GPU pools through the gateway, with real upstreams: a llama-server built from the project's
// llama.cpp (pool `gpu`) and a second `armada serve` behind an API key (pool `long`), both on the
// CPU here. The cluster (`armada cluster up`: PostgreSQL, etcd, NATS, Redis, two nodes) holds 512
// tokens a sequence, so long prompts only fit the pools. The gateway counts prompt tokens with
// the tiny model's own tokenizer; the nodes route their agents' steps by the same rules.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { startServer, tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { startDocumentTool } from './tool_server.mjs';
import { startRecordingProxy } from './mcp_peer.mjs';
import { assertLintedMetrics, clusterUp, metricSum, sanitizerReports, sleep, startLlamaServer, waitFor } from './cluster_helpers.mjs';

const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const POOL_KEY = 'sk-pool-upstream-key';
const ADMIN = 'sk-gateway-admin';
const LLAMA_SERVER = process.env.LLAMA_SERVER;
let dir;
let up;
let gw;
let llama;  // { proc, port, log }
let longPool;
let tools;
let rec;  // a recording proxy in front of llama-server: pool `rec`
const LLAMA_ARGS = ['-c', '8192', '-np', '2', '-t', '1'];

// Prompt tokens llama-server has processed, from its own metrics.
async function llamaPromptTokens() {
  const text = await fetch(`http://127.0.0.1:${llama.port}/metrics`).then((r) => r.text());
  const m = text.match(/^llamacpp:prompt_tokens_total (\S+)$/m);
  return m ? Number(m[1]) : 0;
}

async function metric(base, name, labels = '', headers = { Authorization: `Bearer ${ADMIN}` }) {
  return metricSum(await fetch(`${base}/metrics`, { headers }).then((r) => r.text()), name, labels);
}

// Random weights write random bytes, which llama-server's output parser refuses (HTTP 500) once
// a reply runs past a few dozen tokens. A bias towards <|im_end|> (Qwen2's end of turn) ends
// each reply at once, whatever its max_tokens.
const END_AT_ONCE = { logit_bias: { 151645: 100 } };
const chat = (body, headers = {}) => fetch(`${gw}/v1/chat/completions`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}`, ...headers },
  body: JSON.stringify({ max_tokens: 4, ...END_AT_ONCE, ...body }),
});

// Each pool's upstreams and their states (admin only: /readyz gives counts, not addresses).
const pools = () => fetch(`${gw}/admin/pools`, { headers: { Authorization: `Bearer ${ADMIN}` } })
  .then((r) => r.json()).then((j) => j.pools);

// Forwards to llama-server and records each POST's body and the upstream's whole answer (its raw
// bytes, before the gateway), so a test sees what a pool was sent and what it said.
async function startPoolRecorder(targetPort) {
  const log = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      const entry = { method: req.method, path: req.url, body, reply: '' };
      if (req.method === 'POST') log.push(entry);
      const up = http.request({ host: '127.0.0.1', port: targetPort, path: req.url, method: req.method, headers: req.headers },
        (r) => {
          res.writeHead(r.statusCode, r.headers);
          r.on('data', (d) => { entry.reply += d; res.write(d); });
          r.on('end', () => res.end());
        });
      up.on('error', () => { if (!res.headersSent) res.writeHead(502); res.end(); });
      up.end(body);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { base: `http://127.0.0.1:${server.address().port}`, log, close: () => new Promise((r) => server.close(r)) };
}

// A user message of `n` copies of `word`.
const TPM_KEY = 'sk-pool-tpm-' + crypto.randomUUID();
const say = (word, n) => [{ role: 'user', content: Array(n).fill(word).join(' ') }];

before(async () => {
  assert.ok(LLAMA_SERVER && fs.existsSync(LLAMA_SERVER), `llama-server is built (LLAMA_SERVER=${LLAMA_SERVER})`);
  dir = tempDir('armada-pools-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  // 800 words: a prompt over 400 tokens, for the pool; too long for a node's 512.
  tools = await startDocumentTool(800);
  fs.writeFileSync(path.join(dir, 'agents.yaml'), `agents:
  - id: reader
    instructions: Read what the tool returns, then answer.
    min_tool_steps: 2
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 11 }
    limits: { max_steps: 4, max_tokens_per_step: 48, tool_timeout_ms: ${30000 * SLOW} }
    tools:
      - name: read
        description: Read a part of the document
        url: ${tools.url}/read
        timeout_ms: ${30000 * SLOW}
        parameters:
          type: object
          properties:
            part: { type: string, enum: [intro, body, end] }
          required: [part]
          additionalProperties: false
`);
  llama = await startLlamaServer(tinyModel, LLAMA_ARGS);
  rec = await startPoolRecorder(llama.port);
  longPool = await startServer(['-c', '16384', '-np', '2', '-t', '1'], { env: { ARMADA_API_KEY: POOL_KEY } });
  fs.writeFileSync(path.join(dir, 'pools.yaml'), `
pools:
  - name: gpu
    context: 4096
    timeout_ms: ${3000 * SLOW}
    health_ms: 600000       # the breaker, not the health check, notices trouble in this test
    breaker_errors: 2
    breaker_open_ms: 1500
    upstreams:
      - {url: 'http://127.0.0.1:${llama.port}', model: tiny, max_in_flight: 4}
  - name: long
    context: 2048
    upstreams:
      - {url: '${longPool.base}', model: armada-tiny-q8_0, api_key_env: POOL_KEY, max_in_flight: 4}
  - name: rec
    context: 4096
    upstreams:
      - {url: '${rec.base}', model: tiny, max_in_flight: 4}
routes:
  - {when: {latency: batch}, to: cpu}
  - {when: {model: long-model}, to: long}
  - {when: {model: rec-model}, to: rec}
  - {when: {prompt_tokens_over: 400}, to: gpu}
  - {when: {max_tokens_over: 500}, to: gpu}
  - {when: {latency: realtime}, to: gpu}
tenant_latency: {acme: realtime}
`);
  // A key with its own tokens per minute, which its pool traffic counts against.
  fs.writeFileSync(path.join(dir, 'keys.txt'), `${TPM_KEY} tpm=500\n`);
  up = await clusterUp(['--cells', '1', '--nodes', '2', '--brains', '1', '-m', tinyModel, '--data-dir', path.join(dir, 'c'), '--port', '0', '--api-key', ADMIN,
    '--api-key-file', path.join(dir, 'keys.txt'), '--pools', path.join(dir, 'pools.yaml'), '--agents', path.join(dir, 'agents.yaml'), '--lease-ttl', String(TTL_S),
    '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=2', '--node-arg=-c', '--node-arg=1024', '--node-arg=-t', '--node-arg=1'],
  { env: { ...process.env, POOL_KEY }, timeoutMs: 120000 * SLOW });
  gw = up.gw;
  dir = path.join(dir, 'c');
  await waitFor('two nodes, and both pools warmed', async () => {
    const r = await fetch(gw + '/readyz').then((x) => x.json()).catch(() => null);
    return r?.nodes >= 2 && r.pools?.gpu?.up === 1 && r.pools?.long?.up === 1 && r.pools?.rec?.up === 1;
  }, 120000);
  // /readyz needs no key: it counts upstreams and never shows where they are.
  const ready = await fetch(gw + '/readyz').then((x) => x.text());
  assert.ok(!ready.includes(String(llama.port)) && !ready.includes(longPool.base), ready);
});

after(async () => {
  await up?.stop();
  if (llama?.proc.exitCode === null) { llama.proc.kill('SIGCONT'); llama.proc.kill('SIGKILL'); }
  await longPool?.stop();
  await rec?.close();
  tools?.server.close();
  if (dir) assert.deepEqual(sanitizerReports(path.join(dir, 'logs')), [], 'no process logged a sanitizer report');
});

test('each rule routes: prompt tokens as the tokenizer counts them, max_tokens, the latency class and the model', { timeout: 120000 * SLOW }, async () => {
  // 500 short words: over 400 tokens in 1,499 bytes, which a guess of 4 bytes a token puts at 375.
  let r = await chat({ messages: say('ox', 500) });
  let body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'prompt_tokens>400');
  assert.ok(body.usage.prompt_tokens > 400, `counted ${body.usage.prompt_tokens}`);
  // 80 long words: under 400 tokens in 1,679 bytes, which a byte guess would put at 420.
  r = await chat({ messages: say('internationalization', 80) });
  body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  assert.equal(r.headers.get('x-armada-route'), 'cpu');
  assert.ok(body.usage.prompt_tokens < 400, `counted ${body.usage.prompt_tokens}`);

  const before = await llamaPromptTokens();
  r = await chat({ messages: say('hello', 3), max_tokens: 501 });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'max_tokens>500');
  assert.ok(await llamaPromptTokens() > before, 'llama-server did the work');

  r = await chat({ messages: say('hello', 3) }, { 'X-Armada-Latency': 'realtime' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'latency=realtime');
  // A tenant's default class (tenant_latency), with no header: acme's requests are realtime.
  const admin = (route, body) => fetch(gw + route, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` }, body: JSON.stringify(body),
  });
  assert.equal((await admin('/admin/tenants', { name: 'acme' })).status, 201);
  const key = await admin('/admin/keys', { tenant: 'acme' }).then((x) => x.json());
  r = await chat({ messages: say('hello', 3) }, { Authorization: `Bearer ${key.key}` });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'latency=realtime');
  // The header still overrides it.
  r = await chat({ messages: say('hello', 3) }, { Authorization: `Bearer ${key.key}`, 'X-Armada-Latency': 'batch' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'cpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'latency=batch');

  const served = () => metric(longPool.base, 'armada_requests_total', 'route="/v1/chat/completions",code="200"',
    { Authorization: `Bearer ${POOL_KEY}` });
  const longBefore = await served();
  r = await chat({ messages: say('hello', 3), model: 'long-model' });
  body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  assert.equal(r.headers.get('x-armada-route'), 'long');
  assert.equal(await served(), longBefore + 1, 'the long pool (another Armada, behind its key) answered');

  // None matches: the CPU node.
  r = await chat({ messages: say('hello', 3) });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'cpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'default');

  // Streamed through a pool too.
  r = await chat({ messages: say('hello', 3), max_tokens: 501, stream: true });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  const text = await r.text();
  assert.match(text, /data: \[DONE\]/);

  assert.ok(await metric(gw, 'armada_gateway_routed_total', 'route="gpu",rule="prompt_tokens>400"') >= 1);
  assert.ok(await metric(gw, 'armada_gateway_routed_total', 'route="long",rule="model=long-model"') >= 1);
  assert.equal(await metric(gw, 'armada_gateway_pool_upstream_up', 'pool="gpu"'), 1);
  assert.ok(await metric(gw, 'armada_gateway_pool_upstream_seconds_count', 'pool="gpu"') >= 3);
  // The gateway's and the nodes' families, pools and routes included, pass Prometheus' lint.
  const auth = { headers: { Authorization: `Bearer ${ADMIN}` } };
  assertLintedMetrics(await fetch(`${gw}/metrics`, auth).then((x) => x.text()), 'the gateway');
  const nodes = JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8')).processes.filter((x) => x.role === 'node');
  assert.equal(nodes.length, 2);
  for (const p of nodes)
    assertLintedMetrics(await fetch(`${p.url}/metrics`, auth).then((x) => x.text()), p.name);
});

test('a prompt too long for every target gets 413; one too long for the CPU goes to a pool that holds it', { timeout: 60000 * SLOW }, async () => {
  // 700 tokens: over the CPU's 512 a sequence, under the pools' 4,096. The first rule says cpu
  // for the batch class, but it only fits a pool.
  let r = await chat({ messages: say('ox', 700) }, { 'X-Armada-Latency': 'batch' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'context');
  // The rule names the long pool (2,048), which cannot hold 3,000 tokens, nor can the CPU: the
  // gpu pool (4,096) can.
  r = await chat({ model: 'long-model', messages: say('ox', 3000) });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  assert.equal(r.headers.get('x-armada-route-rule'), 'context');
  r = await chat({ messages: say('ox', 5000) });
  const body = await r.json();
  assert.equal(r.status, 413, JSON.stringify(body));
  assert.equal(body.error.code, 'context_length_exceeded');
  assert.match(body.error.message, /4096.*512/);
});

test('a node killed while its agent step is on the pool: another node sends the step again and the session completes', { timeout: 180000 * SLOW }, async () => {
  const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
  const nodeOf = (name) => status().processes.find((p) => p.role === 'node' && p.name === name);
  const poolSteps = (node) => metric(node.url, 'armada_session_pool_steps_total', 'pool="gpu"');
  const sessionNow = async (id) => fetch(`${gw}/v1/sessions/${id}`, { headers: { Authorization: `Bearer ${ADMIN}` } })
    .then((r) => r.json());
  // The pool holds the step (SIGSTOP) until the node that sent it is dead.
  tools.onFirst = async () => { llama.proc.kill('SIGSTOP'); };
  let victim;
  let id;
  try {
    const r = await fetch(`${gw}/v1/agents/reader/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` },
      body: JSON.stringify({ input: 'Read the document, then answer.' }),
    });
    const created = await r.json();
    assert.equal(r.status, 201, JSON.stringify(created));
    id = created.id;
    victim = nodeOf((await waitFor('the session placed', async () => (await sessionNow(id)).placement?.node)));
    // The node's own pool metrics: the step is in flight on llama-server (which holds it).
    await waitFor('the step in flight on the pool', async () =>
      (await metric(victim.url, 'armada_node_pool_upstream_in_flight', 'pool="gpu"')) === 1, 60000);
    assert.equal(await poolSteps(victim), 1);
    const exited = new Promise((res) => {
      const t = setInterval(() => { try { process.kill(victim.pid, 0); } catch { clearInterval(t); res(); } }, 50);
    });
    process.kill(victim.pid, 'SIGKILL');
    await exited;
  } finally {
    tools.onFirst = null;
    llama.proc.kill('SIGCONT');
  }
  const s = await waitFor('the session ended', async () => {
    const x = await sessionNow(id);
    return ['completed', 'failed', 'cancelled'].includes(x.state) ? x : null;
  }, 120000);
  assert.equal(s.state, 'completed', s.reason);
  assert.notEqual(s.placement.node, victim.name, 'another node finished it');
  const out = s.steps.filter((x) => x.kind === 'model_output').map((x) => x.data);
  assert.equal(out.length, 3, JSON.stringify(out));
  assert.equal(out[0].ran_on, 'cpu');
  // The step the dead node had sent was sent again by the new node, to the pool (it does not
  // fit a node's 512 tokens), and its tool call is schema-valid.
  assert.ok(out[1].prompt_tokens > 512, `${out[1].prompt_tokens}`);
  assert.equal(out[1].ran_on, 'gpu', JSON.stringify(out[1]));
  assert.equal(out[1].tool_calls.length, 1);
  assert.ok(['intro', 'body', 'end'].includes(JSON.parse(out[1].tool_calls[0].arguments).part), out[1].tool_calls[0].arguments);
  assert.ok(await poolSteps(nodeOf(s.placement.node)) >= 1);
  // The tool call made before the kill was not made again.
  assert.equal(tools.calls.get(id), 2);
  // The victim comes back after its back-off; the next tests want two nodes again.
  await waitFor('the killed node back', async () =>
    (await fetch(gw + '/readyz').then((x) => x.json()).catch(() => null))?.nodes >= 2, 60000);
});

test('a hung pool opens its breaker, requests fall back to the CPU with a header, and the breaker closes when it is back', { timeout: 180000 * SLOW }, async () => {
  const fallbacks = () => metric(gw, 'armada_gateway_route_fallbacks_total', 'pool="gpu"');
  const failed = () => metric(gw, 'armada_gateway_pool_upstream_requests_total', 'outcome="failed"');
  const f0 = await fallbacks();
  const failed0 = await failed();
  llama.proc.kill('SIGSTOP');  // accepts connections (the kernel does), answers nothing
  try {
    for (let i = 0; i < 2; i++) {
      const r = await chat({ messages: say('hello', 3) }, { 'X-Armada-Latency': 'realtime' });
      assert.equal(r.status, 200, await r.text());
      assert.equal(r.headers.get('x-armada-route'), 'cpu; degraded=gpu-unavailable');
    }
    assert.equal(await failed(), failed0 + 2, 'two timeouts');
    assert.equal(await metric(gw, 'armada_gateway_pool_upstream_breaker_open', 'pool="gpu"'), 1);
    assert.equal((await pools()).gpu.upstreams[0].state, 'open');
    // Open: the next request does not wait for the pool.
    const r = await chat({ messages: say('hello', 3) }, { 'X-Armada-Latency': 'realtime' });
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('x-armada-route'), 'cpu; degraded=gpu-unavailable');
    assert.equal(await failed(), failed0 + 2, 'the open breaker sent it nothing');
    assert.equal(await fallbacks(), f0 + 3);
    // A request that fits only the pool is refused as busy, with a time to come back.
    const big = await chat({ messages: say('ox', 600) });  // over 512 tokens
    const bb = await big.json();
    assert.equal(big.status, 503, JSON.stringify(bb));
    assert.ok(Number(big.headers.get('retry-after')) > 0);
    assert.match(bb.error.message, /pool gpu is unavailable/);
  } finally {
    llama.proc.kill('SIGCONT');
  }
  await waitFor('the breaker closing after a probe', async () =>
    (await pools()).gpu.upstreams[0].state === 'up', 60000);
  const r = await chat({ messages: say('hello', 3) }, { 'X-Armada-Latency': 'realtime' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
});

test('a pool that is down sends its requests to the CPU with the header, and takes them again once it is back', { timeout: 180000 * SLOW }, async () => {
  const port = llama.port;
  const exited = new Promise((r) => llama.proc.on('exit', r));
  llama.proc.kill('SIGKILL');
  await exited;
  for (let i = 0; i < 3; i++) {
    const r = await chat({ messages: say('hello', 3), max_tokens: 501 });
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('x-armada-route'), 'cpu; degraded=gpu-unavailable');
  }
  assert.ok(await metric(gw, 'armada_gateway_route_fallbacks_total', 'pool="gpu"') >= 3);
  llama = await startLlamaServer(tinyModel, LLAMA_ARGS, port);
  await waitFor('the pool back in the gateway', async () =>
    (await fetch(gw + '/readyz').then((x) => x.json())).pools.gpu.up === 1, 60000);
  const r = await chat({ messages: say('hello', 3), max_tokens: 501 });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
});

test('a full pool: a request that fits the CPU falls back with the header; one that fits only the pool gets 503 with Retry-After', { timeout: 120000 * SLOW }, async () => {
  const full = () => metric(gw, 'armada_gateway_route_fallbacks_total', 'pool="long",reason="full"');
  const f0 = await full();
  // Four long streams fill the long pool (max_in_flight 4).
  const streams = [];
  const pending = [];
  try {
    for (let i = 0; i < 4; i++) {
      const ac = new AbortController();
      streams.push(ac);
      pending.push(fetch(`${gw}/v1/chat/completions`, {
        method: 'POST', signal: ac.signal,
        headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` },
        body: JSON.stringify({ model: 'long-model', messages: say('hello', 3), max_tokens: 2000, stream: true, temperature: 1 }),
      }).catch(() => null));  // left unread: each holds its place on the pool until aborted
    }
    await waitFor('the long pool full', async () =>
      (await metric(gw, 'armada_gateway_pool_upstream_in_flight', 'pool="long"')) === 4, 30000);
    let r = await chat({ model: 'long-model', messages: say('hello', 3) });
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('x-armada-route'), 'cpu; degraded=long-unavailable');
    assert.equal(await full(), f0 + 1);
    // 600 tokens: over the CPU's 512, under the long pool's 2,048.
    r = await chat({ model: 'long-model', messages: say('ox', 600) });
    const body = await r.json();
    assert.equal(r.status, 503, JSON.stringify(body));
    assert.ok(Number(r.headers.get('retry-after')) > 0);
    assert.match(body.error.message, /pool long is full/);
  } finally {
    for (const ac of streams) ac.abort();
    await Promise.all(pending);
  }
  await waitFor('the long pool free again', async () =>
    (await metric(gw, 'armada_gateway_pool_upstream_in_flight', 'pool="long"')) === 0, 30000);
  const r = await chat({ model: 'long-model', messages: say('hello', 3) });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'long');
});

test('a client that goes away cancels its request on the pool', { timeout: 60000 * SLOW }, async () => {
  const gen = () => metric(longPool.base, 'armada_generated_tokens_total', '', { Authorization: `Bearer ${POOL_KEY}` });
  const active = () => metric(longPool.base, 'armada_sequences_active', '', { Authorization: `Bearer ${POOL_KEY}` });
  const ac = new AbortController();
  const r = await fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', signal: ac.signal,
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` },
    body: JSON.stringify({ model: 'long-model', messages: say('hello', 3), max_tokens: 2000, stream: true,
      temperature: 1 }),
  });
  assert.equal(r.headers.get('x-armada-route'), 'long');
  const reader = r.body.getReader();
  await reader.read();  // the stream has begun
  await waitFor('the pool generating', async () => await active() >= 1);
  ac.abort();
  // Left alone, 2,000 tokens would keep the pool busy for about 3 s (measured alone), and the
  // pool would have generated them all.
  await waitFor('the pool to stop generating', async () => await active() === 0, 3000);
  await sleep(500);
  const total = await gen();
  assert.ok(total < 1000, `the generation was cut short (${total} tokens generated by the pool in all)`);
});

test('armada bench gateway runs: 300 requests routed to a pool, each on a new connection, all answered', { timeout: 120000 * SLOW }, async () => {
  // The same small request to the CPU node directly and through the gateway (where its model
  // routes it to the long pool), alternately, one at a time. Any request without an answer
  // fails the run.
  const node = JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8')).processes
    .find((p) => p.role === 'node').url;
  const body = JSON.stringify({ model: 'long-model', messages: say('hi', 1), max_tokens: 1 });
  const out = await new Promise((resolve, reject) => {
    const p = spawn(process.env.ARMADA_BIN, ['bench', 'gateway', '--gateway', gw, '--node', node, '-n', '300',
      '--route', '/v1/chat/completions', '--body', body, '--api-key', ADMIN],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ARMADA_API_KEY: '' } });
    let text = '';
    p.stdout.on('data', (d) => { text += d; });
    p.stderr.on('data', (d) => { text += d; });
    p.on('exit', (code) => (code === 0 ? resolve(text) : reject(new Error(`bench gateway exited ${code}\n${text}`))));
  });
  assert.match(out, /\| through the gateway \| [\d.]+ \| [\d.]+ \| [\d.]+ \|/);
  assert.match(out, /added p99/);
});

test('SIGHUP reloads the pools and routes: a new upstream warms first, a removed one drains its stream and goes', { timeout: 180000 * SLOW }, async () => {
  const status = JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
  const gatewayPid = status.processes.find((p) => p.role === 'gateway').pid;
  // A long stream on the long pool, in flight while the pool is changed under it.
  const r = await fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` },
    // n: 2 doubles the work, so the stream outlasts the reload (max_tokens is bounded by the pool's context, 2,048).
    body: JSON.stringify({ model: 'long-model', messages: say('hello', 3), max_tokens: 2000, n: 2, stream: true }),
  });
  assert.equal(r.headers.get('x-armada-route'), 'long');
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let streamed = decoder.decode((await reader.read()).value);
  // The long pool now names llama-server instead of the second Armada.
  const file = path.join(dir, 'cluster.yaml');
  const yaml = fs.readFileSync(file, 'utf8');
  const next = yaml.replace(`{url: '${longPool.base}', model: armada-tiny-q8_0, api_key_env: POOL_KEY, max_in_flight: 4}`,
    `{url: 'http://127.0.0.1:${llama.port}', model: tiny, max_in_flight: 4}`)
    .replace('{when: {model: long-model}, to: long}', '{when: {model: [long-model, other-long]}, to: long}');
  assert.equal(next.split('other-long').length, 2, 'the test found the long pool and its rule in the cluster file');
  // Before the reload, no rule names the model `other-long`.
  const old = await chat({ model: 'other-long', messages: say('hello', 3) });
  assert.equal(old.headers.get('x-armada-route'), 'cpu', await old.text());
  fs.writeFileSync(file, next);
  process.kill(gatewayPid, 'SIGHUP');
  const long = async () => (await pools()).long;
  const during = await waitFor('the old upstream draining beside the new one', async () => {
    const l = await long();
    return l.upstreams.some((u) => u.url === longPool.base && u.state === 'draining') ? l : null;
  }, 30000);
  assert.ok(during.upstreams.some((u) => u.url === `http://127.0.0.1:${llama.port}`), JSON.stringify(during));
  await waitFor('the new upstream warmed', async () => (await long()).up === 1, 30000);
  const before = await llamaPromptTokens();
  const x = await chat({ model: 'long-model', messages: say('hello', 3) });
  assert.equal(x.status, 200, await x.text());
  assert.equal(x.headers.get('x-armada-route'), 'long');
  assert.ok(await llamaPromptTokens() > before, 'the new upstream took it');
  // The rules were read again too.
  const y = await chat({ model: 'other-long', messages: say('hello', 3) });
  assert.equal(y.status, 200, await y.text());
  assert.equal(y.headers.get('x-armada-route'), 'long');
  assert.equal(y.headers.get('x-armada-route-rule'), 'model=long-model|other-long');
  // The stream that was in flight ends whole, and then the old upstream is gone.
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    streamed += decoder.decode(value);
  }
  assert.match(streamed, /data: \[DONE\]/);
  await waitFor('the drained upstream dropped', async () =>
    (await long()).upstreams.every((u) => u.url !== longPool.base), 30000);
});

test('a request relayed to a pool carries the client\'s trace context to the upstream', { timeout: 120000 * SLOW }, async () => {
  const status = JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
  const gatewayPid = status.processes.find((p) => p.role === 'gateway').pid;
  // The long pool's llama-server, now behind a proxy that records each request's traceparent.
  const proxy = await startRecordingProxy(llama.port, ['traceparent']);
  try {
    const file = path.join(dir, 'cluster.yaml');
    const yaml = fs.readFileSync(file, 'utf8');
    const upstream = `{url: 'http://127.0.0.1:${llama.port}', model: tiny, max_in_flight: 4}`;
    const next = yaml.replaceAll(upstream, `{url: '${proxy.base}', model: tiny, max_in_flight: 4}`);
    assert.notEqual(next, yaml, 'the test found the upstream in the cluster file');
    fs.writeFileSync(file, next);
    process.kill(gatewayPid, 'SIGHUP');
    await waitFor('the proxied upstream warmed', async () =>
      (await pools()).long.upstreams.some((u) => u.url === proxy.base && u.state === 'up'), 30000);
    const trace = '4bf92f3577b34da6a3ce929d0e0e4736';
    const r = await chat({ model: 'long-model', messages: say('hello', 3) }, { traceparent: `00-${trace}-00f067aa0ba902b7-01` });
    assert.equal(r.status, 200, await r.text());
    assert.equal(r.headers.get('x-armada-route'), 'long');
    const sent = proxy.log.filter((e) => e.path === '/v1/chat/completions' && (e.traceparent ?? '').includes(trace));
    assert.equal(sent.length, 1, JSON.stringify(proxy.log));
    // Untraced (no collector here), the gateway passes the client's context on as it came.
    assert.equal(sent[0].traceparent, `00-${trace}-00f067aa0ba902b7-01`);
  } finally {
    await proxy.close();
  }
});

test('a request the rules send to a pool is checked as a node checks it, and only the fields Armada knows go upstream', { timeout: 120000 * SLOW }, async () => {
  const posts = () => rec.log.filter((e) => e.path === '/v1/chat/completions');
  const before = posts().length;
  for (const [extra, field] of [[{ n: 100 }, /'n' must be between 1 and 8/], [{ top_logprobs: 3 }, /'top_logprobs' needs 'logprobs'/],
    [{ logprobs: true, top_logprobs: 50 }, /'top_logprobs' must be between 0 and 20/], [{ max_tokens: 100000 }, /'max_tokens' is too large/],
    [{ messages: [{ role: 'wizard', content: 'x' }] }, /role/]]) {
    const r = await chat({ model: 'rec-model', messages: say('hi', 2), ...extra });
    const j = await r.json();
    assert.equal(r.status, 400, JSON.stringify(j));
    assert.match(j.error.message, field);
  }
  assert.equal(posts().length, before, 'no refused request reached the pool');
  const r = await chat({ model: 'rec-model', messages: say('hi', 2), ignore_eos: true, id_slot: 0, cache_prompt: false,
    cache_salt: 'mine', n_probs: 2, user: 'u1', metadata: { a: 1 }, samplers: 'k' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route'), 'rec');
  const sent = JSON.parse(posts().at(-1).body);
  for (const k of ['ignore_eos', 'id_slot', 'cache_prompt', 'cache_salt', 'n_probs', 'user', 'metadata', 'samplers'])
    assert.ok(!(k in sent), `'${k}' reached the pool: ${JSON.stringify(sent)}`);
  assert.equal(sent.model, 'tiny');
  // llama.cpp's n_probs, which a node honours, in OpenAI's fields.
  assert.equal(sent.logprobs, true);
  assert.equal(sent.top_logprobs, 2);
  assert.deepEqual(sent.messages, say('hi', 2));
});

test('a pool\'s answers carry no cached-token counts or timings: a second tenant sending the first one\'s prefix sees no sign of it', { timeout: 120000 * SLOW }, async () => {
  const admin = (route, body) => fetch(gw + route, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` }, body: JSON.stringify(body),
  });
  const keys = {};
  for (const t of ['prefa', 'prefb']) {
    assert.equal((await admin('/admin/tenants', { name: t })).status, 201);
    keys[t] = (await admin('/admin/keys', { tenant: t }).then((x) => x.json())).key;
  }
  const prompt = say('orange', 300);
  const ask = (key, extra = {}) => chat({ model: 'rec-model', messages: prompt, ...extra }, { Authorization: `Bearer ${key}` });
  let r = await ask(keys.prefa);
  assert.equal(r.status, 200, await r.text());
  r = await ask(keys.prefb);
  const b = await r.json();
  assert.equal(r.status, 200, JSON.stringify(b));
  assert.ok(!('timings' in b), JSON.stringify(b));
  assert.ok(!b.usage?.prompt_tokens_details, JSON.stringify(b.usage));
  // The upstream did report them (it found the prefix cached): the gateway is what keeps them out.
  const raw = JSON.parse(rec.log.at(-1).reply);
  assert.ok('timings' in raw || raw.usage?.prompt_tokens_details, `llama-server said: ${rec.log.at(-1).reply}`);
  // Streamed, too: no event carries them.
  r = await ask(keys.prefb, { stream: true, stream_options: { include_usage: true } });
  assert.equal(r.status, 200);
  const text = await r.text();
  assert.match(text, /data: /);
  assert.doesNotMatch(text, /timings|cached_tokens|prompt_tokens_details/, text);
  assert.match(rec.log.at(-1).reply, /timings|cached_tokens/, 'the upstream\'s stream had them');
});

test('the latency class is the tenant\'s: a client header may lower it, not raise it', { timeout: 60000 * SLOW }, async () => {
  const admin = (route, body) => fetch(gw + route, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${ADMIN}` }, body: JSON.stringify(body),
  });
  assert.equal((await admin('/admin/tenants', { name: 'plain' })).status, 201);
  const key = (await admin('/admin/keys', { tenant: 'plain' }).then((x) => x.json())).key;
  // 'plain' is standard (default_latency): realtime would send it to the gpu pool.
  let r = await chat({ messages: say('hello', 3) }, { Authorization: `Bearer ${key}`, 'X-Armada-Latency': 'realtime' });
  let j = await r.json();
  assert.equal(r.status, 403, JSON.stringify(j));
  assert.equal(j.error.code, 'latency_class');
  r = await chat({ messages: say('hello', 3) }, { Authorization: `Bearer ${key}`, 'X-Armada-Latency': 'warp' });
  assert.equal(r.status, 400);
  r = await chat({ messages: say('hello', 3) }, { Authorization: `Bearer ${key}`, 'X-Armada-Latency': 'batch' });
  assert.equal(r.status, 200, await r.text());
  assert.equal(r.headers.get('x-armada-route-rule'), 'latency=batch');
});

test('a key\'s tokens per minute (tpm=) count what it sends to a pool: a second request past the budget gets 429', { timeout: 120000 * SLOW }, async () => {
  const posts = () => rec.log.filter((e) => e.path === '/v1/chat/completions').length;
  const before = posts();
  // About 300 prompt tokens each: the first fits the key's 500 a minute, and is charged what
  // the pool reports it used; a second would pass the budget.
  const body = { model: 'rec-model', messages: say('write', 300) };
  const first = await chat(body, { Authorization: `Bearer ${TPM_KEY}` });
  const used = await first.json();
  assert.equal(first.status, 200, JSON.stringify(used));
  assert.equal(first.headers.get('x-armada-route'), 'rec');
  assert.ok(used.usage.prompt_tokens > 250 && used.usage.prompt_tokens < 500, JSON.stringify(used.usage));
  const second = await chat(body, { Authorization: `Bearer ${TPM_KEY}` });
  const refused = await second.json();
  assert.equal(second.status, 429, JSON.stringify(refused));
  assert.equal(refused.error.param, 'tokens_per_minute', JSON.stringify(refused));
  assert.ok(Number(second.headers.get('retry-after')) >= 1);
  assert.equal(posts(), before + 1, 'only the first went upstream');
});
