// Overload and connection capacity, black-box against the real server (tiny model):
// - an open-loop flood at 10x the node's measured capacity: admitted requests keep their
//   latency, refusals are fast 429s with Retry-After, RSS stays flat, the process survives;
// - 2,000 idle keep-alive connections held and reused, and the connection cap answering 503;
// - 512 SSE streams open at once, every one finishing with [DONE];
// - per-key rate limits (requests/min, tokens/min) answering 429 with Retry-After.
import { test } from 'node:test';
import { assertFits } from './openapi_check.mjs';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import fs from 'node:fs';
import { tempDir } from './agents.mjs';
import path from 'node:path';
import { startServer, rawPost } from './harness.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Latency bounds are ratios to the unloaded run and hold on a release build; sanitizer runs (make test-asan/tsan) set 0.
const timing = process.env.ARMADA_TIMING !== '0';

function rssMiB(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]) / 1024;
}

function pct(xs, p) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

const chat = (maxTokens, extra = {}) => ({
  model: 'armada',
  messages: [{ role: 'user', content: 'Write one short sentence about ships.' }],
  max_tokens: maxTokens,
  temperature: 0,
  ...extra,
});

// One POST through `agent`; resolves with status, latency, headers and body.
function post(agent, base, route, body, headers = {}) {
  const data = JSON.stringify(body);
  const url = new URL(base + route);
  const t0 = performance.now();
  return new Promise((resolve) => {
    const req = http.request({
      host: url.hostname, port: url.port, path: url.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), ...headers },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let misfit = null;
        try { assertFits('POST', url, res.statusCode, res.headers, text); } catch (e) { misfit = String(e); }
        // An answer that does not fit docs/openapi.json counts as a failed request (status -2).
        resolve({ status: misfit ? -2 : res.statusCode, ms: performance.now() - t0, headers: res.headers, text, error: misfit });
      });
      res.on('error', (e) => resolve({ status: -1, ms: performance.now() - t0, error: String(e), text }));
    });
    req.on('error', (e) => resolve({ status: -1, ms: performance.now() - t0, error: String(e) }));
    req.end(data);
  });
}

test('a flood at 10x capacity: admitted requests keep their p95, refusals are fast 429s', async () => {
  // Two sequences and no queue: the queue bound is what keeps admitted
  // requests' latency close to the unloaded one.
  const srv = await startServer(['-np', '2', '--queue', '0', '-t', '1', '--http-threads', '2']);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 512 });
  try {
    const MAX = 16;
    // Unloaded: one request at a time.
    const solo = [];
    for (let i = 0; i < 20; i++) {
      const r = await post(agent, srv.base, '/v1/chat/completions', chat(MAX));
      assert.equal(r.status, 200, r.text);
      solo.push(r.ms);
    }
    const p95Solo = pct(solo, 95);

    // Capacity: closed loop at the number of sequences for 4 s.
    let done = 0;
    const until = performance.now() + 4000;
    await Promise.all(Array.from({ length: 2 }, async () => {
      while (performance.now() < until) {
        const r = await post(agent, srv.base, '/v1/chat/completions', chat(MAX));
        if (r.status === 429) continue;  // a sequence not yet handed back: no queue to wait in
        assert.equal(r.status, 200, r.text);
        done++;
      }
    }));
    const capacity = done / 4;  // requests per second
    const rssBefore = rssMiB(srv.proc.pid);

    // Open loop at 10x for 6 s.
    const rate = capacity * 10;
    const results = [];
    const pending = [];
    let rssPeak = rssBefore;
    const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, rssMiB(srv.proc.pid)); }, 100);
    const start = performance.now();
    let sent = 0;
    while (performance.now() - start < 6000) {
      const due = Math.floor(((performance.now() - start) / 1000) * rate);
      for (; sent < due; sent++) {
        pending.push(post(agent, srv.base, '/v1/chat/completions', chat(MAX)).then((r) => results.push(r)));
      }
      await sleep(5);
    }
    await Promise.all(pending);
    clearInterval(sampler);

    const ok = results.filter((r) => r.status === 200);
    const refused = results.filter((r) => r.status === 429);
    const other = results.filter((r) => r.status !== 200 && r.status !== 429);
    const p95Ok = pct(ok.map((r) => r.ms), 95);
    const p99Refused = pct(refused.map((r) => r.ms), 99);
    console.log(JSON.stringify({
      capacity_rps: +capacity.toFixed(1), offered_rps: +rate.toFixed(1), sent: results.length,
      admitted: ok.length, refused: refused.length, other: other.length,
      p95_unloaded_ms: +p95Solo.toFixed(1), p95_admitted_ms: +p95Ok.toFixed(1),
      p99_refused_ms: +p99Refused.toFixed(1), max_refused_ms: +Math.max(...refused.map((r) => r.ms)).toFixed(1),
      rss_before_mib: +rssBefore.toFixed(1), rss_peak_mib: +rssPeak.toFixed(1),
    }));
    assert.equal(other.length, 0, `unexpected statuses: ${JSON.stringify(other.slice(0, 3))}`);
    assert.ok(ok.length > 0 && refused.length > results.length / 2, 'most of a 10x flood must be refused');
    for (const r of refused.slice(0, 50)) {
      assert.ok(Number(r.headers['retry-after']) >= 1, 'a 429 carries Retry-After');
      assert.equal(JSON.parse(r.text).error.type, 'rate_limit_error');
    }
    if (timing) {
      // What this guards is that admitted requests do not queue: with a queue, 10x for 6 s puts
      // them seconds behind. The flood's own client shares the 2 cores with the server, which
      // alone made the admitted p95 3.1x the unloaded one in one CI run (101.4 ms against 32.8).
      assert.ok(p95Ok <= 5 * p95Solo, `admitted p95 ${p95Ok.toFixed(1)} ms > 5x unloaded ${p95Solo.toFixed(1)} ms`);
      // A refusal never waits on the engine: even its p99 under the flood beats one unloaded
      // request. (An absolute bound measured CI's load, not the server: 83 ms once on 2 busy cores.)
      assert.ok(p99Refused < p95Solo, `429s took ${p99Refused.toFixed(1)} ms at p99, unloaded requests ${p95Solo.toFixed(1)} ms`);
    }
    assert.ok(rssPeak - rssBefore < 64, `RSS grew ${(rssPeak - rssBefore).toFixed(1)} MiB under the flood`);

    // Alive, and serving as before.
    assert.equal((await fetch(srv.base + '/health')).status, 200);
    const after = await post(agent, srv.base, '/v1/chat/completions', chat(MAX));
    assert.equal(after.status, 200, after.text);
  } finally {
    agent.destroy();
    assert.equal(await srv.stop(), 0);
  }
});

// Opens `n` connections, each sending one keep-alive GET /health; resolves with the sockets
// and what each received first.
async function openIdle(base, n) {
  const url = new URL(base);
  const socks = [];
  const replies = [];
  for (let i = 0; i < n; i += 100) {
    await Promise.all(Array.from({ length: Math.min(100, n - i) }, () => new Promise((resolve) => {
      const s = net.connect(Number(url.port), url.hostname);
      s.setEncoding('utf8');
      let got = '';
      s.closedByPeer = false;
      s.on('close', () => { s.closedByPeer = true; resolve(); });
      s.on('error', () => {});
      s.on('data', (d) => {
        got += d;
        if (got.includes('\r\n\r\n') && /Content-Length: (\d+)/i.test(got)) {
          const len = Number(got.match(/Content-Length: (\d+)/i)[1]);
          if (got.length - got.indexOf('\r\n\r\n') - 4 >= len) {
            replies.push(got);
            got = '';
            resolve();
          }
        }
      });
      s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n'));
      socks.push(s);
    })));
  }
  return { socks, replies };
}

test('2,000 idle keep-alive connections are held and reused; past the cap, 503', async () => {
  const srv = await startServer([]);
  try {
    const { socks, replies } = await openIdle(srv.base, 2000);
    assert.equal(replies.length, 2000);
    assert.ok(replies.every((r) => r.startsWith('HTTP/1.1 200')));
    // While they idle, a client on a new connection is served.
    const r = await rawPost(srv.base, '/v1/chat/completions', chat(8));
    assert.equal(r.status, 200, r.text);
    // The connections stay idle for a while: idleness is what is tested here, not a wait for
    // some state to arrive.
    await sleep(1500);
    // Every connection is still open and usable: each answers a second request.
    const again = await Promise.all(socks.map((s) => new Promise((resolve) => {
      let got = '';
      s.on('data', (d) => { got += d; if (got.includes('"status":"ok"')) resolve(got); });
      s.on('close', () => resolve(got));
      s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    })));
    assert.ok(again.every((g) => g.startsWith('HTTP/1.1 200')));
    assert.equal(socks.filter((s) => s.closedByPeer).length, 0, 'the server closed idle keep-alive connections');
    const rss = rssMiB(srv.proc.pid);
    console.log(JSON.stringify({ idle_connections: socks.length, server_rss_mib: +rss.toFixed(1) }));
    for (const s of socks) s.destroy();
  } finally {
    assert.equal(await srv.stop(), 0);
  }

  const capped = await startServer(['--max-connections', '50']);
  try {
    const { socks } = await openIdle(capped.base, 50);
    const extra = await openIdle(capped.base, 1);
    assert.equal(extra.replies.length, 1);
    assert.match(extra.replies[0], /^HTTP\/1\.1 503/);
    assert.match(extra.replies[0], /Retry-After: 1/);
    assert.match(extra.replies[0], /too many open connections/);
    socks[0].destroy();
    // Once the server has seen that connection close, there is room for one more.
    let room;
    for (let i = 0; i < 200; i++) {
      room = await openIdle(capped.base, 1);
      if (/^HTTP\/1\.1 200/.test(room.replies[0])) break;
      for (const s of room.socks) s.destroy();
    }
    assert.match(room.replies[0], /^HTTP\/1\.1 200/);
    for (const s of [...socks, ...room.socks, ...extra.socks]) s.destroy();
  } finally {
    assert.equal(await capped.stop(), 0);
  }
});

test('512 SSE streams open at once all finish with [DONE]', async () => {
  const srv = await startServer(['-np', '64', '--queue', '512', '-c', String(64 * 2048)]);
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  // Long requests hold every sequence first, so the streams wait in the queue, open, until all
  // 512 are: on a slow (sanitizer) build the first streams would otherwise end before the last
  // one is accepted. Cancelling the holders lets the streams run.
  const holders = Array.from({ length: 64 }, () => new AbortController());
  const held = holders.map((ac) => fetch(srv.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chat(2000)), signal: ac.signal,
  }).then((r) => r.text()).catch(() => null));
  const release = () => holders.forEach((ac) => ac.abort());
  try {
    for (let i = 0; ; i++) {
      const m = (await (await fetch(srv.base + '/metrics')).text()).match(/^armada_sequences_active (\d+)/m);
      if (m && Number(m[1]) === 64) break;
      assert.ok(i < 600, 'the holding requests never took every sequence');
      await sleep(50);
    }
    const N = 512;
    const url = new URL(srv.base);
    const data = JSON.stringify(chat(32, { stream: true }));
    let open = 0;
    let peak = 0;
    const streams = await Promise.all(Array.from({ length: N }, () => new Promise((resolve) => {
      const req = http.request({
        host: url.hostname, port: url.port, path: '/v1/chat/completions', method: 'POST', agent,
        headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) },
      }, (res) => {
        open++;
        peak = Math.max(peak, open);
        if (open === N) release();
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => { text += d; });
        res.on('end', () => {
          open--;
          let misfit = null;
          try { assertFits('POST', new URL('/v1/chat/completions', url), res.statusCode, res.headers, text); } catch (e) { misfit = String(e); }
          resolve({ status: misfit ? -2 : res.statusCode, type: res.headers['content-type'], text: misfit ?? text });
        });
      });
      req.on('error', (e) => resolve({ status: -1, text: String(e) }));
      req.end(data);
    })));
    const bad = streams.filter((s) => s.status !== 200 || !s.text.trimEnd().endsWith('data: [DONE]'));
    console.log(JSON.stringify({ streams: N, peak_open: peak, bad: bad.length }));
    assert.equal(bad.length, 0, JSON.stringify(bad.slice(0, 2)));
    assert.ok(streams.every((s) => s.type === 'text/event-stream'));
    assert.ok(streams.every((s) => s.text.includes('"delta"')));
    assert.equal(peak, N, `only ${peak} streams were open at once`);
    assert.equal((await fetch(srv.base + '/health')).status, 200);
  } finally {
    release();
    await Promise.all(held);
    agent.destroy();
    assert.equal(await srv.stop(), 0);
  }
});

test('per-key rate limits: requests and tokens per minute, each key on its own', async () => {
  const dir = tempDir('armada-rate-');
  const keys = path.join(dir, 'keys');
  fs.writeFileSync(keys, 'sk-default\nsk-few rpm=3\nsk-tokens tpm=40\nsk-free rpm=0 tpm=0 admin\n');
  const srv = await startServer(['--api-key-file', keys, '--rate-limit-rpm', '5']);
  const as = (k) => ({ Authorization: `Bearer ${k}` });
  try {
    // Defaults: five requests a minute.
    const t0 = Date.now();
    for (let i = 0; i < 5; i++) assert.equal((await rawPost(srv.base, '/v1/chat/completions', chat(4), as('sk-default'))).status, 200);
    const r = await rawPost(srv.base, '/v1/chat/completions', chat(4), as('sk-default'));
    const spent = (Date.now() - t0) / 1000;
    assert.equal(r.status, 429);
    assert.equal(r.json.error.code, 'rate_limit_exceeded');
    assert.equal(r.json.error.type, 'rate_limit_error');
    assert.match(r.json.error.message, /requests per minute \(limit 5\)/);
    // The bucket refills one request every 60/5 = 12 s, and it has been refilling since the
    // first request: the wait is 12 s less that time, in whole seconds.
    const wait = Number(r.headers.get('retry-after'));
    assert.ok(wait >= Math.floor(60 / 5 - spent) - 1 && wait <= 60 / 5, `Retry-After ${wait} after ${spent} s`);
    // Reading does not count.
    assert.equal((await fetch(srv.base + '/v1/models', { headers: as('sk-default') })).status, 200);

    // A key's own line wins: three.
    for (let i = 0; i < 3; i++) assert.equal((await rawPost(srv.base, '/v1/chat/completions', chat(4), as('sk-few'))).status, 200);
    assert.equal((await rawPost(srv.base, '/v1/chat/completions', chat(4), as('sk-few'))).status, 429);

    // Tokens: the first request runs (the bucket is full), its tokens put the key in debt.
    const first = await rawPost(srv.base, '/v1/chat/completions', chat(32), as('sk-tokens'));
    assert.equal(first.status, 200, first.text);
    assert.ok(first.json.usage.total_tokens > 40);
    const t = await rawPost(srv.base, '/v1/chat/completions', chat(4), as('sk-tokens'));
    assert.equal(t.status, 429);
    assert.match(t.json.error.message, /tokens per minute \(limit 40\)/);
    assert.ok(Number(t.headers.get('retry-after')) >= 1);

    // Unlimited key.
    for (let i = 0; i < 8; i++) assert.equal((await rawPost(srv.base, '/v1/chat/completions', chat(2), as('sk-free'))).status, 200);

    const m = await (await fetch(srv.base + '/metrics', { headers: as('sk-free') })).text();
    assert.match(m, /armada_rate_limited_total\{limit="requests"\} 2/);
    assert.match(m, /armada_rate_limited_total\{limit="tokens"\} 1/);
  } finally {
    assert.equal(await srv.stop(), 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
