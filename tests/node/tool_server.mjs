// A tool server for the agent tests. It honours Idempotency-Key the way a careful API does: the
// first request with a key has an effect and its reply is stored; a repeat gets the stored reply
// and has no new effect. It counts both, so tests can prove each key had exactly one effect.
import http from 'node:http';

// With `hold`, keyed tool calls wait (after their arrival is recorded) until `release()`: a
// test can keep sessions open at a tool call for as long as it needs, with no timing guess.
export async function startToolServer({ minDelayMs = 20, maxDelayMs = 200, hold = false } = {}) {
  let release = () => {};
  const gate = hold ? new Promise((r) => { release = r; }) : null;
  const effects = new Map();  // key -> count of effects
  const replays = new Map();  // key -> count of repeated deliveries
  const stored = new Map();   // key -> reply body
  const firstAt = new Map();  // key -> when its first request arrived (ms)
  const replayAt = new Map(); // key -> when its first repeat was answered (ms)
  const arrivals = new Map(); // key -> when each of its requests arrived (ms)
  const noKey = [];
  const secrets = [];
  const traceparents = new Map();  // key -> the traceparent header of its first request
  let inFlight = 0;
  const seen = [];
  const server = http.createServer((req, res) => {
    inFlight++;
    res.on('close', () => { inFlight--; });
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      const key = req.headers['idempotency-key'];
      const url = new URL(req.url, 'http://x');
      if (url.pathname === '/gbk') {
        // "你好，世界" in GBK, declared as such.
        res.writeHead(200, { 'Content-Type': 'text/plain; charset=GBK' });
        res.end(Buffer.from([0xc4, 0xe3, 0xba, 0xc3, 0xa3, 0xac, 0xca, 0xc0, 0xbd, 0xe7]));
        return;
      }
      if (url.pathname === '/headers') {
        // Records what a request carried, for the redirect tests.
        seen.push({ authorization: req.headers.authorization ?? null, cookie: req.headers.cookie ?? null,
          token: req.headers['x-token'] ?? null, key: req.headers['idempotency-key'] ?? null, method: req.method });
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end('{"seen":true}');
        return;
      }
      if (url.pathname === '/hop') {
        // 307 keeps the method and body; `to` names where (default: /headers here).
        res.writeHead(307, { Location: url.searchParams.get('to') ?? '/headers' });
        res.end();
        return;
      }
      if (url.pathname === '/redirect-home') {
        res.writeHead(302, { Location: 'http://127.0.0.2:1/' });
        res.end();
        return;
      }
      if (url.pathname === '/big') {
        // Declares its length, like most servers; longer than a tool's default cap.
        const big = 'x'.repeat(100 * 1024);
        res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': big.length });
        res.end(big);
        return;
      }
      if (url.pathname === '/words') {
        // A long tool output (about 350 tokens), for the memory-cap tests.
        res.writeHead(200, { 'Content-Type': 'text/plain' });
        res.end(Array.from({ length: 100 }, (_, i) => `item${i % 50}`).join(' '));
        return;
      }
      if (url.pathname === '/slow') {
        setTimeout(() => { res.writeHead(200); res.end('late'); }, 3000);
        return;
      }
      if (url.pathname === '/secret') {
        secrets.push(req.headers['x-token'] ?? null);
        res.writeHead(200, { 'Content-Type': 'text/plain' });
        res.end('secret received');
        return;
      }
      if (url.pathname === '/fail') {
        res.writeHead(503, { 'Content-Type': 'text/plain' });
        res.end('down');
        return;
      }
      if (!key) noKey.push(req.url);
      if (key && !traceparents.has(key)) traceparents.set(key, req.headers.traceparent ?? null);
      if (key && !firstAt.has(key)) firstAt.set(key, Date.now());
      if (key) arrivals.set(key, [...(arrivals.get(key) ?? []), Date.now()]);
      const delay = minDelayMs + Math.random() * (maxDelayMs - minDelayMs);
      const answer = () => setTimeout(() => {
        // Replies declare their length (Content-Length), as most servers do; /words, /gbk and
        // the others are sent chunked, so both ways of ending a body are exercised.
        const send = (text) => {
          res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
          res.end(text);
        };
        if (key && stored.has(key)) {
          replays.set(key, (replays.get(key) ?? 0) + 1);
          if (!replayAt.has(key)) replayAt.set(key, Date.now());
          send(stored.get(key));
          return;
        }
        const reply = JSON.stringify({ ok: true, tool: url.pathname.slice(1), echo: body.slice(0, 200), key });
        if (key) {
          effects.set(key, (effects.get(key) ?? 0) + 1);
          stored.set(key, reply);
        }
        send(reply);
      }, delay);
      if (gate) gate.then(answer); else answer();
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    effects, replays, noKey, secrets, firstAt, replayAt, arrivals, seen, traceparents,
    inFlight: () => inFlight,
    release: () => release(),
    close: () => new Promise((r) => server.close(r)),
  };
}

// A tool that answers the first call of each session (the session part of its Idempotency-Key)
// with a document of `words` words, and every later call with a short note. `onFirst`, when set,
// runs before the document goes out; `calls` counts the calls per session.
export async function startDocumentTool(words) {
  const t = { calls: new Map(), onFirst: null };
  const doc = Array.from({ length: words }, (_, i) => ['the', 'river', 'stone', 'light'][i % 4]).join(' ');
  t.server = http.createServer((req, res) => {
    req.resume();
    req.on('end', async () => {
      const session = (req.headers['idempotency-key'] ?? '').split(':')[0];
      const n = (t.calls.get(session) ?? 0) + 1;
      t.calls.set(session, n);
      if (n === 1 && t.onFirst) await t.onFirst();
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end(n === 1 ? doc : 'noted');
    });
  });
  await new Promise((r) => t.server.listen(0, '127.0.0.1', r));
  t.url = `http://127.0.0.1:${t.server.address().port}`;
  return t;
}
