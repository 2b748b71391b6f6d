// Tenants on one node: every API key belongs to a tenant; agents, sessions, responses and MCP
// connections of one tenant are invisible to another; the operator's agents are shared and
// read-only; /metrics needs an admin key on the main port and none on the metrics listener.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, rawPost, createdStatus, viaGateway } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, richAgent, tempDir, writeAgents } from './agents.mjs';
import { waitFor } from './session_helpers.mjs';
import { freePort, startEverything, startRecordingProxy, startSilentServer } from './mcp_peer.mjs';

const A1 = { Authorization: 'Bearer sk-acme-1' };
const A2 = { Authorization: 'Bearer sk-acme-2' };
const B = { Authorization: 'Bearer sk-beta' };
const SOLO = { Authorization: 'Bearer sk-solo' };
const ADMIN = { Authorization: 'Bearer sk-ops' };

let tools;
let srv;
let dir;
let args;
let mcp;
let proxy;
let metricsBase;

const get = async (route, headers = {}) => {
  const r = await fetch(srv.base + route, { headers });
  return { status: r.status, json: await r.json().catch(() => null) };
};
const del = async (route, headers = {}) => (await fetch(srv.base + route, { method: 'DELETE', headers })).status;
const declare = (yaml, headers, query = '') =>
  fetch(`${srv.base}/v1/agents${query}`, { method: 'POST', body: yaml, headers: { 'Content-Type': 'application/yaml', ...headers } });

before(async () => {
  tools = await startToolServer();
  const port = await freePort();
  mcp = await startEverything(port);
  proxy = await startRecordingProxy(port);
  dir = tempDir('armada-tenants-');
  fs.writeFileSync(path.join(dir, 'keys'),
    'sk-acme-1 tenant=acme\nsk-acme-2 tenant=acme rpm=1000\nsk-beta tenant=beta\nsk-solo\nsk-ops tenant=ops admin\n');
  const opAgents = agentYaml(tools.url, { extra: `  - id: mcpop
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 96 }
    tools:
      - mcp: { url: "${proxy.url}", allowed_tools: [get-sum] }
  - id: slowpoke
    min_tool_steps: 1
    answer_without_tools: true
    limits: { max_steps: 3, max_tokens_per_step: 64 }
    tools:
      - name: wait
        url: ${tools.url}/slow
        timeout_ms: 10000
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
` });
  args = ['--api-key-file', path.join(dir, 'keys'), '--agents', writeAgents(dir, opAgents), '--data-dir',
    path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-c', '8192', '--metrics-port', '0', '--mcp-discover-ms', '3000'];
  srv = await startServer(args);
  metricsBase = srv.stdout().match(/metrics on (http:\/\/[^\s]+)\/metrics/)[1];
});

after(async () => {
  if (srv) await srv.stop();
  if (tools) await tools.close();
  if (proxy) await proxy.close();
  if (mcp) mcp.kill('SIGTERM');
});

test('an agent declared by one tenant is invisible to another; the operator\'s are shared and read-only', async () => {
  const made = await declare(richAgent(tools.url), A1);
  assert.equal(made.status, 200, await made.text());
  // The same tenant through another key sees it; its page has the declaration and the schemas.
  const mine = await get('/v1/agents/rich', A2);
  assert.equal(mine.status, 200);
  assert.equal(mine.json.owner, 'acme');
  assert.equal(mine.json.tools[0].parameters.properties.count.maximum, 3);
  assert.deepEqual(mine.json.tools[0].parameters.properties.count.enum, [1, 2, 3]);
  // Another tenant, and a key of its own: 404 on read, run, delete; absent from the list.
  for (const h of [B, SOLO]) {
    assert.equal((await get('/v1/agents/rich', h)).status, 404);
    assert.ok(!(await get('/v1/agents', h)).json.data.some((a) => a.id === 'rich'));
    assert.equal((await rawPost(srv.base, '/v1/agents/rich/sessions', { input: 'x' }, h)).status, 404);
    assert.equal(await del('/v1/agents/rich', h), 404);
  }
  // Declaring the same id elsewhere makes that tenant's own agent; acme's is untouched.
  const theirs = await declare(richAgent(tools.url).replace('maximum: 3', 'maximum: 2').replace('enum: [1, 2, 3]', 'enum: [1, 2]'), B);
  assert.equal(theirs.status, 200, await theirs.text());
  assert.equal((await get('/v1/agents/rich', B)).json.tools[0].parameters.properties.count.maximum, 2);
  assert.equal((await get('/v1/agents/rich', A1)).json.tools[0].parameters.properties.count.maximum, 3);
  // The operator's agents: every tenant sees them, nobody changes them over the API.
  for (const h of [A1, B, SOLO]) {
    const list = (await get('/v1/agents', h)).json.data;
    assert.ok(list.some((a) => a.id === 'worker' && a.owner === 'operator'));
  }
  // Their declaration (URLs, literal header values) is the operator's: admins see it, tenants
  // see the tools and schemas only.
  const seen = await get('/v1/agents/worker', A1);
  assert.equal(seen.status, 200);
  assert.equal(seen.json.spec, undefined);
  assert.equal(seen.json.tools[0].parameters.type, 'object');
  assert.equal((await get('/v1/agents/worker', ADMIN)).json.spec.id, 'worker');
  const replace = await declare('id: worker\ninstructions: mine now\n', A1);
  assert.equal(replace.status, 403, await replace.text());
  assert.equal(await del('/v1/agents/worker', A1), 403);
  assert.equal(await del('/v1/agents/worker', ADMIN), 403);
  // An admin sees every tenant's agents and manages them with ?tenant=.
  const all = (await get('/v1/agents', ADMIN)).json.data.filter((a) => a.id === 'rich').map((a) => a.owner).sort();
  assert.deepEqual(all, ['acme', 'beta']);
  assert.equal((await get('/v1/agents/rich?tenant=beta', ADMIN)).json.owner, 'beta');
  assert.equal((await get('/v1/agents?tenant=beta', A1)).status, 403, 'only an admin acts for another tenant');
  assert.equal(await del('/v1/agents/rich?tenant=beta', ADMIN), 200);
  assert.equal((await get('/v1/agents/rich', B)).status, 404);
  assert.equal((await get('/v1/agents/rich', A1)).status, 200);
});

test('a live session is the tenant\'s too: another tenant cannot read, follow, message, cancel or delete it', async () => {
  const r = await rawPost(srv.base, '/v1/agents/slowpoke/sessions', { input: 'go' }, A1);
  assert.equal(r.status, createdStatus, r.text);
  const id = r.json.id;
  await waitFor(srv.base, id, ['waiting_tool'], { headers: A2 });
  for (const h of [B, SOLO]) {
    assert.equal((await get(`/v1/sessions/${id}`, h)).status, 404);
    assert.equal((await fetch(`${srv.base}/v1/sessions/${id}/events`, { headers: h })).status, 404);
    assert.equal((await rawPost(srv.base, `/v1/sessions/${id}/messages`, { content: 'x' }, h)).status, 404);
    assert.equal((await rawPost(srv.base, `/v1/sessions/${id}/cancel`, {}, h)).status, 404);
    assert.equal(await del(`/v1/sessions/${id}`, h), 404);
  }
  assert.equal((await get(`/v1/sessions/${id}`, A1)).json.state, 'waiting_tool', 'untouched by the others');
  assert.equal((await rawPost(srv.base, `/v1/sessions/${id}/cancel`, {}, A2)).status, 200, 'the tenant\'s other key may');
});

test('sessions, their events and stored responses belong to the tenant', async () => {
  const r = await rawPost(srv.base, '/v1/agents/rich/sessions', { input: 'go' }, A1);
  assert.equal(r.status, createdStatus, r.text);
  const id = r.json.id;
  const s = await waitFor(srv.base, id, ['completed', 'failed'], { headers: A2 });
  assert.equal(s.state, 'completed', s.reason);
  const args = JSON.parse(s.steps.find((x) => x.kind === 'tool_call').data.arguments);
  assert.ok([1, 2, 3].includes(args.count) && ['alpha', 'beta'].includes(args.record), JSON.stringify(args));
  for (const h of [B, SOLO]) {
    assert.equal((await get(`/v1/sessions/${id}`, h)).status, 404);
    assert.equal((await fetch(`${srv.base}/v1/sessions/${id}/events`, { headers: h })).status, 404);
    assert.equal((await rawPost(srv.base, `/v1/sessions/${id}/messages`, { content: 'x' }, h)).status, 404);
    assert.equal(await del(`/v1/sessions/${id}`, h), 404);
  }
  // A stored response: the other key of the tenant reads it; another tenant does not.
  const resp = await rawPost(srv.base, '/v1/responses', { input: 'keep', max_output_tokens: 4 }, A1);
  assert.equal(resp.status, 200, resp.text);
  assert.equal((await get(`/v1/responses/${resp.json.id}`, A2)).status, 200);
  assert.equal((await get(`/v1/responses/${resp.json.id}`, B)).status, 404);
  const cont = await rawPost(srv.base, '/v1/responses', { input: 'more', previous_response_id: resp.json.id }, B);
  assert.equal(cont.status, 404);
});

test('an API agent comes back unchanged after a restart, and its sessions run', {
  skip: viaGateway && 'a node restarting under a gateway is cluster_faults\' (this would kill the whole cluster)',
}, async () => {
  const before = (await get('/v1/agents/rich', A1)).json;
  srv.proc.kill('SIGKILL');
  await new Promise((r) => srv.proc.on('exit', r));
  srv = await startServer(args);
  metricsBase = srv.stdout().match(/metrics on (http:\/\/[^\s]+)\/metrics/)[1];
  const again = (await get('/v1/agents/rich', A1)).json;
  assert.deepEqual(again.spec, before.spec);
  assert.deepEqual(again.tools, before.tools);
  assert.equal(typeof again.tools[0].parameters.properties.record.maxLength, 'number');
  assert.equal((await get('/v1/agents/rich', B)).status, 404, 'still not beta\'s');
  const r = await rawPost(srv.base, '/v1/agents/rich/sessions', { input: 'again' }, A1);
  const s = await waitFor(srv.base, r.json.id, ['completed', 'failed'], { headers: A1 });
  assert.equal(s.state, 'completed', s.reason);
});

test('/metrics needs an admin key on the main port and none on the metrics listener', async () => {
  assert.equal((await fetch(srv.base + '/metrics')).status, 401);
  const plain = await fetch(srv.base + '/metrics', { headers: A1 });
  assert.equal(plain.status, 403);
  assert.match((await plain.json()).error.message, /admin key/);
  assert.equal((await fetch(srv.base + '/metrics', { headers: ADMIN })).status, 200);
  if (viaGateway) return;  // a gateway has no metrics listener of its own: nodes and brains do
  const scraped = await fetch(metricsBase + '/metrics');
  assert.equal(scraped.status, 200);
  assert.match(await scraped.text(), /^armada_sessions_live\{state="running"\} /m);
  assert.equal((await fetch(metricsBase + '/v1/models')).status, 404, 'the metrics listener serves nothing else');
  assert.equal((await fetch(metricsBase + '/readyz')).status, 200);
});

test('the prompt cache is per tenant, and GET /v1/cache is for admins', async () => {
  const system = Array.from({ length: 60 }, (_, i) => `Rule ${i}: answer in plain words about item ${i * 7}.`).join(' ');
  const chat = async (headers) => {
    const r = await fetch(srv.base + '/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
      body: JSON.stringify({ messages: [{ role: 'system', content: system }, { role: 'user', content: 'Hello there' }], max_tokens: 4 }),
    });
    assert.equal(r.status, 200);
    return (await r.json()).usage;
  };
  const first = await chat(A1);
  assert.ok(first.prompt_tokens > 600, `a long prompt (${first.prompt_tokens} tokens)`);
  // The same prompt from another tenant reuses nothing: no entry, no sequence of acme's.
  assert.equal((await chat(B)).prompt_tokens_details.cached_tokens, 0);
  assert.equal((await chat(SOLO)).prompt_tokens_details.cached_tokens, 0);
  // Another key of the same tenant does.
  const same = await chat(A2);
  assert.ok(same.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 64,
    `acme's second key reused ${same.prompt_tokens_details.cached_tokens} of ${same.prompt_tokens}`);

  assert.equal((await get('/v1/cache', A1)).status, 403);
  const c = await get('/v1/cache', ADMIN);
  assert.equal(c.status, 200);
  assert.equal(c.json.enabled, true);
  assert.ok(c.json.hits >= 1 && c.json.tokens_saved >= same.prompt_tokens_details.cached_tokens, JSON.stringify(c.json));
  if (viaGateway) return;  // the hits are counted on the node (its /metrics is checked on one)
  const m = await (await fetch(metricsBase + '/metrics')).text();
  assert.match(m, /^armada_prompt_cache_hits_total [1-9]/m);
});

test('MCP sessions are kept per tenant and per header set', async () => {
  const tool = (headers) => [{ type: 'mcp', server_label: 'ev', server_url: proxy.url, allowed_tools: ['get-sum'], headers }];
  const ask = async (h, headers) => {
    const from = proxy.log.length;
    const r = await rawPost(srv.base, '/v1/responses', {
      input: 'Add two numbers', max_output_tokens: 64, tools: tool(headers), tool_choice: 'required', parallel_tool_calls: false,
    }, h);
    assert.equal(r.status, 200, r.text);
    return proxy.log.slice(from);
  };
  const sessions = (entries) => new Set(entries.map((e) => e.session).filter(Boolean));
  const same = { 'X-Tenant-Token': 'shared' };
  const a1 = await ask(A1, same);
  const b1 = await ask(B, same);
  const a2 = await ask(A2, same);
  const a3 = await ask(A1, { 'X-Tenant-Token': 'other' });
  assert.ok(a1.some((e) => e.method === 'initialize'));
  // Beta, with the very same headers, opened its own MCP session and never used acme's.
  assert.ok(b1.some((e) => e.method === 'initialize'), 'beta initialized a session of its own');
  for (const s of sessions(b1)) assert.ok(!sessions(a1).has(s), `session ${s} served both tenants`);
  // Acme's second key reuses acme's session (same tenant, same headers) ...
  assert.ok(!a2.some((e) => e.method === 'initialize'));
  for (const s of sessions(a2)) assert.ok(sessions(a1).has(s));
  // ... and another header set gets another session.
  assert.ok(a3.some((e) => e.method === 'initialize'));
  for (const s of sessions(a3)) assert.ok(!sessions(a1).has(s) && !sessions(b1).has(s));
  assert.ok(a3.every((e) => e['x-tenant-token'] === 'other'));

  // Which tools a request allows is its own, even on a client (and MCP session) it shares.
  const only = async (allowed) => {
    const r = await rawPost(srv.base, '/v1/responses', {
      input: 'x', max_output_tokens: 4, tools: [{ type: 'mcp', server_label: 'ev', server_url: proxy.url, allowed_tools: allowed, headers: same }],
    }, A1);
    assert.equal(r.status, 200, r.text);
    return r.json.output.find((o) => o.type === 'mcp_list_tools').tools.map((t) => t.name).sort();
  };
  assert.deepEqual(await only(['get-sum']), ['get-sum']);
  assert.deepEqual(await only(['echo']), ['echo']);
  assert.deepEqual(await only(['echo', 'get-sum']), ['echo', 'get-sum']);

  // The operator's agent with MCP tools: each tenant's sessions use an MCP session of their own.
  const run = async (h) => {
    const from = proxy.log.length;
    const r = await rawPost(srv.base, '/v1/agents/mcpop/sessions', { input: 'add' }, h);
    const s = await waitFor(srv.base, r.json.id, ['completed', 'failed'], { headers: h });
    assert.equal(s.state, 'completed', s.reason);
    return proxy.log.slice(from);
  };
  const opA = await run(A1);
  const opB = await run(B);
  assert.ok(sessions(opA).size > 0 && sessions(opB).size > 0);
  for (const s of sessions(opB)) assert.ok(!sessions(opA).has(s), `operator agent: session ${s} served both tenants`);
});

test('an MCP call that is redirected to another origin leaves the headers behind', async () => {
  // A front that sends every request on to the recording proxy, a different origin (port).
  const http = await import('node:http');
  const front = http.createServer((req, res) => {
    req.resume();
    res.writeHead(307, { Location: proxy.url });
    res.end();
  });
  await new Promise((r) => front.listen(0, '127.0.0.1', r));
  try {
    const from = proxy.log.length;
    const r = await rawPost(srv.base, '/v1/responses', {
      input: 'Add two numbers', max_output_tokens: 64, tool_choice: 'required', parallel_tool_calls: false,
      tools: [{ type: 'mcp', server_label: 'ev', server_url: `http://127.0.0.1:${front.address().port}/mcp`,
        allowed_tools: ['get-sum'], headers: { Authorization: 'Bearer mcp-secret', 'X-Tenant-Token': 'spec' } }],
    }, A1);
    assert.equal(r.status, 200, r.text);
    const got = proxy.log.slice(from);
    assert.ok(got.length >= 2, 'the redirected requests reached the server');
    for (const e of got) {
      assert.equal(e.authorization, null);
      assert.equal(e['x-tenant-token'], null);
    }
  } finally {
    front.close();
  }
});

test('an MCP call redirected within its origin keeps the headers; follow_redirects: false stops', async () => {
  // One origin that answers /hop with a redirect to its own /mcp, which forwards to the server.
  const http = await import('node:http');
  const upstream = new URL(proxy.url);
  const seenAuth = [];
  const front = http.createServer((req, res) => {
    if (req.url === '/hop') {
      req.resume();
      res.writeHead(307, { Location: '/mcp' });
      res.end();
      return;
    }
    seenAuth.push(req.headers.authorization ?? null);
    const up = http.request({ host: upstream.hostname, port: upstream.port, path: '/mcp', method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    req.pipe(up);
  });
  await new Promise((r) => front.listen(0, '127.0.0.1', r));
  const hop = `http://127.0.0.1:${front.address().port}/hop`;
  try {
    const r = await rawPost(srv.base, '/v1/responses', {
      input: 'x', max_output_tokens: 4,
      tools: [{ type: 'mcp', server_label: 'ev', server_url: hop, allowed_tools: ['get-sum'], headers: { Authorization: 'Bearer same-origin' } }],
    }, A1);
    assert.equal(r.status, 200, r.text);
    assert.ok(seenAuth.length >= 2 && seenAuth.every((a) => a === 'Bearer same-origin'), JSON.stringify(seenAuth));
    const stay = await declare(`id: nohop\ntools:\n  - mcp: { url: "${hop}", follow_redirects: false }\n`, A1);
    assert.equal(stay.status, 400);
    assert.match((await stay.json()).error.message, /answered HTTP 307 \(a redirect to \/mcp\), and its follow_redirects is false/);
  } finally {
    front.close();
  }
});

test('an agent declared before tenants existed comes back with its numbers, shared and read-only', {
  skip: viaGateway && 'it writes a node\'s SQLite file; a cluster keeps agents in PostgreSQL',
}, async () => {
  // What builds before this one stored: the YAML re-emitted with every scalar quoted, no tenant.
  const { spawnSync } = await import('node:child_process');
  const ldir = tempDir('armada-legacy-');
  const data = path.join(ldir, 'data');
  const first = await startServer(['--data-dir', data]);
  await first.stop();
  const old = `- "id": "legacy"\n  "min_tool_steps": "1"\n  "answer_without_tools": "true"\n  "limits":\n    "max_steps": "3"\n    "max_tokens_per_step": "64"\n  "tools":\n    - "name": "lookup"\n      "url": "${tools.url}/lookup"\n      "parameters":\n        "type": "object"\n        "properties":\n          "count":\n            "type": "integer"\n            "enum":\n              - "1"\n              - "2"\n            "maximum": "2"\n        "required":\n          - "count"\n`;
  const py = spawnSync('python3', ['-c', `import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("INSERT INTO agents VALUES('', 'legacy', ?, '', 1, 1)", (sys.argv[2],)); c.commit()`,
    path.join(data, 'armada.db'), old], { encoding: 'utf8' });
  assert.equal(py.status, 0, py.stderr);
  const s2 = await startServer(['--data-dir', data, '--api-key-file', path.join(dir, 'keys'), '--tool-allow', '127.0.0.1', '-c', '8192']);
  try {
    const g = async (route, h) => { const r = await fetch(s2.base + route, { headers: h }); return { status: r.status, json: await r.json() }; };
    for (const h of [A1, B]) {
      const a = await g('/v1/agents/legacy', h);
      assert.equal(a.status, 200);
      assert.equal(a.json.owner, 'shared');
      assert.deepEqual(a.json.tools[0].parameters.properties.count.enum, [1, 2]);
      assert.equal(a.json.tools[0].parameters.properties.count.maximum, 2);
    }
    const r = await rawPost(s2.base, '/v1/agents/legacy/sessions', { input: 'x' }, B);
    const s = await waitFor(s2.base, r.json.id, ['completed', 'failed'], { headers: B });
    assert.equal(s.state, 'completed', s.reason);
    assert.equal((await fetch(`${s2.base}/v1/agents/legacy`, { method: 'DELETE', headers: A1 })).status, 403);
    assert.equal((await fetch(`${s2.base}/v1/agents/legacy`, { method: 'DELETE', headers: ADMIN })).status, 200);
    assert.equal((await g('/v1/agents/legacy', A1)).status, 404);
  } finally {
    await s2.stop();
  }
});

test('MCP servers that never answer do not stall the node', { timeout: 120000 }, async () => {
  const silent = await startSilentServer();
  try {
    // Usual speed first.
    const t0 = Date.now();
    assert.equal((await fetch(srv.base + '/health')).status, 200);
    const chat = () => rawPost(srv.base, '/v1/chat/completions',
      { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }, B);
    assert.equal((await chat()).status, 200);
    const usual = Date.now() - t0;
    // 16 Responses requests name the hung server at once.
    const sent = Date.now();
    const hung = Array.from({ length: 16 }, () => rawPost(srv.base, '/v1/responses', {
      input: 'x', tools: [{ type: 'mcp', server_label: 'dead', server_url: silent.url }],
    }, A1).then((r) => ({ ...r, ms: Date.now() - sent })));
    for (let i = 0; i < 200 && silent.accepted() === 0; i++) await new Promise((r) => setTimeout(r, 25));
    assert.ok(silent.accepted() > 0, 'the hung server was reached');
    const t1 = Date.now();
    const health = await fetch(srv.base + '/health');
    const healthMs = Date.now() - t1;
    const c = await chat();
    const both = Date.now() - t1;
    assert.equal(health.status, 200);
    assert.equal(c.status, 200);
    // Blocked I/O threads would hold these for the whole discovery budget (10 s).
    assert.ok(healthMs < 2000, `/health took ${healthMs} ms while MCP servers hung`);
    assert.ok(both < Math.max(4 * usual, usual + 3000), `health + chat took ${both} ms (usually ${usual} ms)`);
    const done = await Promise.all(hung);
    const codes = done.map((d) => d.status).sort();
    // At most 4 of one tenant's calls run at once (--mcp-per-tenant); the rest are refused at once.
    assert.equal(codes.filter((x) => x === 429).length, 12, codes.join(','));
    assert.equal(codes.filter((x) => x === 424).length, 4, codes.join(','));
    for (const d of done.filter((x) => x.status === 424)) {
      assert.match(d.json.error.message, /no answer within/);
      // Within the discovery budget (--mcp-discover-ms 3000), whatever the server does.
      assert.ok(d.ms < 3000 + 2000, `a hung discovery answered after ${d.ms} ms`);
    }
    for (const d of done.filter((x) => x.status === 429)) assert.ok(d.ms < 2000, `a refusal took ${d.ms} ms`);
  } finally {
    await silent.close();
  }
});
