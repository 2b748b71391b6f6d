// The gateway as a hostile-input boundary (docs/SECURITY.md): what a tenant sends cannot split
// into a second request to a node, cannot crash or stall the gateway, and cannot take its threads
// and descriptors from other tenants. One cell of one node, tenants from a key file.
import { test, before, after } from 'node:test';
import { assertFits } from './openapi_check.mjs';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { clusterUp, sanitizerReports, metricSum, waitFor } from './cluster_helpers.mjs';

const A = { Authorization: 'Bearer sk-acme' };
const B = { Authorization: 'Bearer sk-beta' };
const ADMIN = { Authorization: 'Bearer sk-ops' };
const STREAM_CAP = 24;
const CONN_CAP = 64;
const READ_CAP = 1500;  // above what the other tests read with one key
let dir, cluster, gw, nodeUrl;

before(async () => {
  dir = tempDir('armada-gw-hostile-');
  fs.chmodSync(dir, 0o755);
  fs.writeFileSync(path.join(dir, 'keys'), 'sk-acme tenant=acme\nsk-beta tenant=beta\nsk-reader tenant=beta\nsk-ops admin\n');
  fs.writeFileSync(path.join(dir, 'agents.yaml'), `agents:
  - id: talker
    instructions: Answer briefly.
    answer_without_tools: true
    limits: { max_steps: 2, max_tokens_per_step: 8 }
`);
  cluster = await clusterUp(['--nodes', '1', '--brains', '1', '-m', tinyModel, '--port', '0',
    '--data-dir', path.join(dir, 'c'), '--api-key-file', path.join(dir, 'keys'), '--agents', path.join(dir, 'agents.yaml'),
    '--gateway-arg=--max-streams-per-tenant', `--gateway-arg=${STREAM_CAP}`,
    '--gateway-arg=--header-timeout', '--gateway-arg=2',
    '--gateway-arg=--max-connections-per-client', `--gateway-arg=${CONN_CAP}`,
    '--gateway-arg=--reads-per-minute', `--gateway-arg=${READ_CAP}`,
    '--node-arg=-np', '--node-arg=4', '--node-arg=-c', '--node-arg=2048']);
  gw = cluster.gw;
  await waitFor('a node in the cluster', async () =>
    (await fetch(gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes >= 1, 120000);
  const status = JSON.parse(fs.readFileSync(path.join(dir, 'c', 'cluster.json'), 'utf8'));
  nodeUrl = status.processes.find((p) => p.role === 'node').url;
});

after(async () => {
  if (cluster) await cluster.stop();
  // Under a sanitizer build, every process's report (a leak at exit included) fails the file.
  assert.deepEqual(sanitizerReports(path.join(dir, 'c', 'logs')), [], 'no process logged a sanitizer report');
});

// One raw HTTP/1.1 exchange on its own connection: the bytes as written, the whole answer.
function raw(base, bytes, { timeoutMs = 10000, localAddress } = {}) {
  const { hostname, port } = new URL(base);
  return new Promise((resolve) => {
    const sock = net.createConnection({ host: hostname, port: Number(port), localAddress });
    let out = '';
    // An answer that does not fit docs/openapi.json comes back as the check's message instead.
    const done = () => {
      sock.destroy();
      try { checkFirstAnswer(base, bytes, out); } catch (e) { return resolve(String(e)); }
      resolve(out);
    };
    sock.setTimeout(timeoutMs, done);
    sock.on('data', (d) => { out += d; if (/\r\n\r\n/.test(out) && /Content-Length: (\d+)/i.test(out)) {
      const len = Number(out.match(/Content-Length: (\d+)/i)[1]);
      if (out.length >= out.indexOf('\r\n\r\n') + 4 + len) done();
    } });
    sock.on('error', done);
    sock.on('end', done);
    sock.write(bytes);
  });
}

// The first answer of a raw exchange, checked against docs/openapi.json as every fetch is (a
// request line that is not a plain one, or an answer cut short, is left alone).
function checkFirstAnswer(base, bytes, out) {
  const request = String(bytes).match(/^([A-Z]+) (\/\S*) HTTP\/1\.1\r\n/);
  const head = out.indexOf('\r\n\r\n');
  const status = out.match(/^HTTP\/1\.1 (\d{3}) /);
  if (!request || head < 0 || !status) return;
  const headers = {};
  for (const line of out.slice(0, head).split('\r\n').slice(1)) {
    const colon = line.indexOf(':');
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  const len = Number(headers['content-length'] ?? NaN);
  const rest = Buffer.from(out.slice(head + 4));
  if (!Number.isFinite(len) || rest.length < len) return;
  let url;
  try { url = new URL(request[2], base); } catch { return; }
  assertFits(request[1], url, Number(status[1]), headers, rest.subarray(0, len).toString());
}

// Session requests the node has answered (its own counter, by route).
async function nodeSessionRequests() {
  const m = await fetch(nodeUrl + '/metrics', { headers: ADMIN }).then((r) => r.text());
  let n = 0;
  for (const l of m.matchAll(/^armada_requests_total\{([^}]*)\} (\S+)$/gm))
    if (/route="\/v1\/sessions/.test(l[1])) n += Number(l[2]);
  return n;
}

async function newSession(headers) {
  const r = await fetch(`${gw}/v1/agents/talker/sessions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: '{}',
  });
  const j = await r.json();
  assert.equal(r.status, 201, JSON.stringify(j));
  return j.id;
}

test('a Last-Event-ID from the query that decodes to a line break is refused, and no second request reaches the node', async () => {
  const id = await newSession(A);
  const smuggled = encodeURIComponent(`1\r\nContent-Length: 0\r\n\r\nGET /v1/sessions/${id} HTTP/1.1\r\nHost: x\r\nX: `);
  const before = await nodeSessionRequests();
  const r = await fetch(`${gw}/v1/sessions/${id}/events?last_event_id=${smuggled}`, { headers: A });
  const j = await r.json();
  assert.equal(r.status, 400);
  assert.match(j.error.message, /Last-Event-ID/);
  // The header itself, too, and an id with a line break in the path.
  const h = await fetch(`${gw}/v1/sessions/${id}/events`, { headers: { ...A, 'Last-Event-ID': 'x1' } });
  assert.equal(h.status, 400);
  const p = await fetch(`${gw}/v1/sessions/sess%0d%0aX:%201`, { headers: A });
  assert.equal(p.status, 400);
  assert.match((await p.json()).error.message, /session id/);
  const after = await nodeSessionRequests();
  assert.equal(after - before, 0, 'no session request reached the node');
  // A good id still streams.
  const ok = await fetch(`${gw}/v1/sessions/${id}/events?last_event_id=0`, { headers: A });
  assert.equal(ok.status, 200);
  await ok.body.cancel();
});

test('a deeply nested body gets 400 and the gateway goes on answering', async () => {
  // Valid JSON, nested 300,000 deep inside a message: a gateway that built and serialized it
  // (its prompt-affinity hash reads the first messages) would overflow a worker's stack.
  const deep = (n) => '{"messages":[{"role":"user","content":' + '['.repeat(n) + ']'.repeat(n) + '}]}';
  for (const body of [deep(300000), '['.repeat(200000), '{"a":'.repeat(100000) + '1' + '}'.repeat(100000)]) {
    const r = await fetch(`${gw}/v1/chat/completions`, {
      method: 'POST', headers: { ...A, 'Content-Type': 'application/json' }, body,
    });
    const j = await r.json();
    assert.equal(r.status, 400, JSON.stringify(j));
    assert.match(j.error.message, /JSON nesting exceeds 64 levels/);
  }
  const m = await fetch(`${gw}/v1/models`, { headers: A });
  assert.equal(m.status, 200);
});

test('very many keys and invalid UTF-8 are refused with the reason', async () => {
  // 250,000 values in 500 KB, under the body size limit: a node would serve it (it ignores the
  // field), so only the gateway's own limit refuses it.
  const many = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, x: Array(250000).fill(1) });
  const r = await fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', headers: { ...A, 'Content-Type': 'application/json' }, body: many,
  });
  const j = await r.json();
  assert.equal(r.status, 400, JSON.stringify(j));
  assert.match(j.error.message, /more than 200000 values/);
  const bad = Buffer.concat([Buffer.from('{"model":"m","messages":[{"role":"user","content":"'),
    Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]);
  const u = await fetch(`${gw}/v1/chat/completions`, {
    method: 'POST', headers: { ...A, 'Content-Type': 'application/json' }, body: bad,
  });
  assert.equal(u.status, 400);
  // The gateway's own words (a node says "ill-formed UTF-8 byte"): refused before any parse.
  assert.match((await u.json()).error.message, /the body is not valid UTF-8/);
});

test('a client that trickles its headers is cut at the header timeout, before any authentication', async () => {
  const { hostname, port } = new URL(gw);
  const t0 = Date.now();
  // Resolves with how long the gateway held the connection, and whether it (not the test) closed it.
  const hold = (trickle) => new Promise((resolve) => {
    const s0 = Date.now();
    let connected = false, byServer = false;
    const sock = net.createConnection({ host: hostname, port: Number(port) }, () => { connected = true; });
    const line = 'GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ';
    let i = 0;
    const timer = trickle ? setInterval(() => { if (connected && !sock.destroyed) sock.write(line[i++ % line.length]); }, 200) : null;
    sock.on('end', () => { byServer = true; });
    sock.on('close', () => { clearInterval(timer); resolve({ ms: Date.now() - s0, connected, byServer }); });
    sock.on('error', () => {});
    setTimeout(() => sock.destroy(), 30000);
  });
  // --header-timeout 2 here: a byte every 200 ms would keep an idle timer alive, not this one.
  const slow = await hold(true);
  assert.ok(slow.connected && slow.byServer, `the gateway took the connection and closed it itself: ${JSON.stringify(slow)}`);
  assert.ok(slow.ms < 10000, `the connection was held ${slow.ms} ms`);
  // A connection that says nothing at all is dropped the same way.
  const silent = await hold(false);
  assert.ok(silent.connected && silent.byServer, JSON.stringify(silent));
  assert.ok(silent.ms < 10000, `a silent connection was held ${silent.ms} ms`);
  void t0;
});

test('a thousand event streams from one tenant: its cap answers 429, and another tenant still chats', async () => {
  const id = await newSession(A);
  const chat = async () => {
    const t0 = Date.now();
    const r = await fetch(`${gw}/v1/chat/completions`, {
      method: 'POST', headers: { ...B, 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    assert.equal(r.status, 200, await r.text());
    return Date.now() - t0;
  };
  const baseline = [];
  for (let i = 0; i < 3; i++) baseline.push(await chat());
  const open = [];
  let refused = 0, retryAfter = null;
  for (let i = 0; i < 1000; i++) {
    const ac = new AbortController();
    const r = await fetch(`${gw}/v1/sessions/${id}/events`, { headers: A, signal: ac.signal });
    // The response is kept: one left to the garbage collector has its stream closed by fetch.
    if (r.status === 200) open.push({ ac, r });
    else {
      assert.equal(r.status, 429);
      retryAfter = r.headers.get('retry-after');
      const j = await r.json();
      assert.equal(j.error.code, 'too_many_streams');
      refused++;
    }
  }
  assert.equal(open.length, STREAM_CAP, `streams open: ${open.length}`);
  assert.equal(refused, 1000 - STREAM_CAP);
  assert.ok(Number(retryAfter) > 0, 'a refusal says when to retry');
  // Another tenant's streams are not counted against this one's cap.
  const other = await newSession(B);
  const ob = await fetch(`${gw}/v1/sessions/${other}/events`, { headers: B });
  assert.equal(ob.status, 200);
  await ob.body.cancel();
  const loaded = [];
  for (let i = 0; i < 3; i++) loaded.push(await chat());
  const med = (a) => [...a].sort((x, y) => x - y)[1];
  if (process.env.ARMADA_TIMING !== '0')
    assert.ok(med(loaded) < med(baseline) * 3 + 300, `chat took ${loaded} ms with the streams open, ${baseline} without`);
  const m = await fetch(`${gw}/metrics`, { headers: ADMIN }).then((r) => r.text());
  assert.equal(metricSum(m, 'armada_gateway_streams_refused_total'), 1000 - STREAM_CAP);
  // Each refusal is a 4xx answer in the counts by class (what the 5xx-ratio alert reads).
  assert.ok(metricSum(m, 'armada_gateway_responses_total', 'code="4xx"') >= 1000 - STREAM_CAP, m);
  assert.ok(metricSum(m, 'armada_gateway_responses_total', 'code="2xx"') >= STREAM_CAP, m);
  for (const { ac } of open) ac.abort();
  // Closed streams free their slots.
  await waitFor('the cap to free up', async () => {
    const r = await fetch(`${gw}/v1/sessions/${id}/events`, { headers: A }).catch(() => null);
    if (r?.status === 200) { await r.body.cancel(); return true; }
    await r?.body?.cancel();
    return false;
  }, 30000);
});

test('one client address holds at most its cap of connections; the next gets 429 with Retry-After', async () => {
  // From 127.0.0.2, an address nothing else in this file uses (the test's own fetch keeps
  // connections from 127.0.0.1): CONN_CAP kept-alive connections, each known to the gateway
  // because it has answered one request on it, then one more.
  const { hostname, port } = new URL(gw);
  const from = '127.0.0.2';
  const socks = [];
  for (let i = 0; i < CONN_CAP; i++) {
    socks.push(await new Promise((resolve, reject) => {
      const s = net.createConnection({ host: hostname, port: Number(port), localAddress: from }, () =>
        s.write('GET /livez HTTP/1.1\r\nHost: x\r\n\r\n'));
      let got = '';
      s.on('data', (d) => {
        got += d;
        if (got.includes('\r\n\r\n')) {
          if (/^HTTP\/1\.1 200/.test(got)) resolve(s);
          else reject(new Error(`connection ${i}: ${got.slice(0, 120)}`));
        }
      });
      s.on('error', reject);
    }));
  }
  const request = 'GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-acme\r\n\r\n';
  const answer = await raw(gw, request, { localAddress: from });
  assert.match(answer, /^HTTP\/1\.1 429/, answer.slice(0, 200));
  assert.match(answer, /Retry-After: 1/);
  // Another client address is not held back meanwhile.
  const other = await raw(gw, request, { localAddress: '127.0.0.3' });
  assert.match(other, /^HTTP\/1\.1 200/, other.slice(0, 200));
  for (const s of socks) s.destroy();
  // The closed connections free their slots (the gateway sees each close when it next reads).
  await waitFor('the slots to free up', async () => /^HTTP\/1\.1 200/.test(await raw(gw, request, { localAddress: from })), 30000);
});

test('a key has a budget of reads a minute: past it, 429 with Retry-After, and another key still reads', async () => {
  const R = { Authorization: 'Bearer sk-reader' };
  let ok = 0, refused = null;
  while (!refused && ok <= READ_CAP) {
    // One at a time: each read is counted in Redis, shared by the gateways, as it would be under
    // any load this gateway handles without falling back to its own count.
    for (const r of [await fetch(`${gw}/v1/models`, { headers: R })]) {
      if (r.status === 200) { ok++; await r.arrayBuffer(); continue; }
      const j = await r.json();
      assert.equal(r.status, 429, JSON.stringify(j));
      refused ??= { retryAfter: r.headers.get('retry-after'), j };
    }
  }
  assert.ok(refused, `${ok} reads, none refused`);
  assert.equal(ok, READ_CAP, JSON.stringify(refused.j));
  assert.equal(refused.j.error.param, 'reads_per_minute', JSON.stringify(refused.j));
  assert.ok(Number(refused.retryAfter) >= 1);
  // The budget is the key's: another key of the same tenant reads, and an admin key is not counted.
  assert.equal((await fetch(`${gw}/v1/models`, { headers: B })).status, 200);
  assert.equal((await fetch(`${gw}/v1/models`, { headers: ADMIN })).status, 200);
});
