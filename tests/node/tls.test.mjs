// TLS both ways, with certificates made by openssl in the test: the node serves HTTPS
// (--ssl-cert-file, --ssl-key-file) to the official openai client, and https tools and MCP
// servers are verified against the system store plus --tool-ca-file: a wrong host name, an
// expired certificate and an untrusted CA are each refused with a clear tool error.
import { test, before, after } from 'node:test';
import { assertFits } from './openapi_check.mjs';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer, httpsGet } from './harness.mjs';
import { tempDir, writeAgents } from './agents.mjs';
import { makeCerts } from './tls_certs.mjs';
import { freePort, startEverything } from './mcp_peer.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
let dir;
let certs;
const servers = [];

// An https tool endpoint presenting `cert`; answers every POST with a small JSON body.
async function httpsTool({ key, cert }) {
  const s = https.createServer({ key: fs.readFileSync(key), cert: fs.readFileSync(cert) }, (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end('{"ok":true,"over":"tls"}');
    });
  });
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  servers.push(s);
  return `https://localhost:${s.address().port}`;
}

// POSTs over https with `ca` trusted; resolves with { status, json }.
function httpsPost(url, ca, body, headers = {}) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = https.request(url, { method: 'POST', ca: fs.readFileSync(ca),
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), ...headers } }, (res) => {
      let text = '';
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        try { assertFits('POST', url, res.statusCode, res.headers, text); } catch (e) { return reject(e); }
        resolve({ status: res.statusCode, json: JSON.parse(text) });
      });
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function waitSession(base, ca, id) {
  for (let i = 0; i < 1200; i++) {
    const r = await httpsGet(`${base}/v1/sessions/${id}`, ca);
    const s = JSON.parse(r.text);
    if (['completed', 'failed'].includes(s.state)) return s;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`session ${id} did not end`);
}

before(() => {
  dir = tempDir('armada-tls-');
  certs = makeCerts(dir);
});

after(() => {
  for (const s of servers) s.close();
});

test('the node serves HTTPS; the official openai client talks to it', { timeout: 120000 }, async () => {
  const srv = await startServer(['--ssl-cert-file', certs.good.cert, '--ssl-key-file', certs.good.key,
    '--data-dir', path.join(dir, 'data-serve')], { ca: certs.ca });
  try {
    assert.match(srv.base, /^https:\/\/127\.0\.0\.1:\d+$/);
    // The client runs in its own process, which trusts the test CA from its start.
    const script = `
      import OpenAI from 'openai';
      const c = new OpenAI({ baseURL: process.argv[1] + '/v1', apiKey: 'x', maxRetries: 0 });
      const r = await c.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
      console.log(JSON.stringify({ object: r.object, n: r.choices.length, tokens: r.usage.completion_tokens }));`;
    const out = await new Promise((resolve) => {
      const p = spawn(process.execPath, ['--input-type=module', '-e', script, srv.base],
        { cwd: here, env: { ...process.env, NODE_EXTRA_CA_CERTS: certs.ca }, stdio: ['ignore', 'pipe', 'pipe'] });
      let o = '';
      let e = '';
      p.stdout.on('data', (d) => { o += d; });
      p.stderr.on('data', (d) => { e += d; });
      p.on('exit', (code) => resolve({ code, o, e }));
    });
    assert.equal(out.code, 0, out.e);
    const r = JSON.parse(out.o);
    assert.equal(r.object, 'chat.completion');
    assert.ok(r.tokens >= 1);
    // Plain HTTP on the TLS port gets no answer it could read as HTTP.
    const plain = await fetch(srv.base.replace('https', 'http') + '/health').then((x) => x.status).catch(() => 'refused');
    assert.equal(plain, 'refused');
    // A client that does not trust the CA refuses the server.
    await assert.rejects(new Promise((resolve, reject) => https.get(srv.base + '/health', resolve).on('error', reject)),
      /self-signed|unable to verify|certificate/);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('https tools are verified: a good certificate works, a wrong host, an expired one and an untrusted CA are refused',
  { timeout: 300000 }, async (t) => {
    const urls = {
      good: await httpsTool(certs.good),
      wrong: await httpsTool(certs.wrongHost),
      expired: await httpsTool(certs.expired),
      untrusted: await httpsTool(certs.untrusted),
    };
    const port = await freePort();
    const mcp = await startEverything(port);
    // However the test ends, the MCP server goes with it (a live child would keep node waiting).
    t.after(() => mcp.kill('SIGKILL'));
    // An https front for the MCP server, with the good certificate.
    const front = https.createServer({ key: fs.readFileSync(certs.good.key), cert: fs.readFileSync(certs.good.cert) },
      (req, res) => {
        const up = http.request({ host: '127.0.0.1', port, path: req.url, method: req.method, headers: req.headers }, (r) => {
          res.writeHead(r.statusCode, r.headers);
          r.pipe(res);
        });
        req.pipe(up);
      });
    await new Promise((r) => front.listen(0, '127.0.0.1', r));
    servers.push(front);
    const agent = (id, url) => `  - id: ${id}
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 64 }
    tools:
      - name: t
        url: ${url}/call
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
    const yaml = 'agents:\n' + Object.entries(urls).map(([k, u]) => agent(k, u)).join('') + `  - id: mcps
    min_tool_steps: 1
    answer_without_tools: true
    parallel_tool_calls: false
    limits: { max_steps: 3, max_tokens_per_step: 96 }
    tools:
      - mcp: { url: "https://localhost:${front.address().port}/mcp", allowed_tools: [get-sum] }
`;
    const plainYaml = 'agents:\n' + agent('good', urls.good);
    const args = (extra, text = yaml) => ['--agents', writeAgents(dir, text), '--tool-allow', '127.0.0.1', '--tool-allow', '::1',
      '-c', '8192', '--ssl-cert-file', certs.good.cert, '--ssl-key-file', certs.good.key, ...extra];
    const srv = await startServer(args(['--tool-ca-file', certs.ca, '--data-dir', path.join(dir, 'data-tools')]),
      { ca: certs.ca });
    try {
      const run = async (id) => {
        const r = await httpsPost(`${srv.base}/v1/agents/${id}/sessions`, certs.ca, { input: 'x' });
        assert.equal(r.status, 200, JSON.stringify(r.json));
        const s = await waitSession(srv.base, certs.ca, r.json.id);
        assert.equal(s.state, 'completed', s.reason);
        return s.steps.find((x) => x.kind === 'tool_result').data;
      };
      const good = await run('good');
      assert.equal(good.is_error, false, good.content);
      assert.equal(good.content, '{"ok":true,"over":"tls"}');
      const wrong = await run('wrong');
      assert.equal(wrong.is_error, true);
      assert.match(wrong.content, /the TLS certificate does not name localhost/);
      const expired = await run('expired');
      assert.equal(expired.is_error, true);
      assert.match(expired.content, /the TLS certificate of localhost has expired/);
      const untrusted = await run('untrusted');
      assert.equal(untrusted.is_error, true);
      assert.match(untrusted.content, /is not signed by a trusted CA/);
      // MCP over https, through the same verification.
      const sum = await run('mcps');
      assert.equal(sum.is_error, false, sum.content);
      assert.match(sum.content, /^The sum of /);
    } finally {
      await srv.stop();
    }
    // Without --tool-ca-file the test CA is not trusted: the good server is refused too ...
    const bare = await startServer(args(['--data-dir', path.join(dir, 'data-bare')], plainYaml), { ca: certs.ca });
    try {
      const r = await httpsPost(`${bare.base}/v1/agents/good/sessions`, certs.ca, { input: 'x' });
      const s = await waitSession(bare.base, certs.ca, r.json.id);
      const res = s.steps.find((x) => x.kind === 'tool_result').data;
      assert.equal(res.is_error, true);
      assert.match(res.content, /is not signed by a trusted CA/);
    } finally {
      await bare.stop();
    }
    // ... and an agent whose MCP server cannot be verified does not start.
    const noCa = await startServer(args(['--data-dir', path.join(dir, 'data-noca')]), { ca: certs.ca }).catch((e) => e);
    assert.ok(noCa instanceof Error, 'the MCP agent could not import its tools');
    assert.match(String(noCa.message), /not signed by a trusted CA/);
    mcp.kill('SIGTERM');
  });
