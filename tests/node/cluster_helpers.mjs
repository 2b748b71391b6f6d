// Helpers shared by the tests that start a cluster with `armada cluster up`.
import './openapi_check.mjs';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';

// promtool, as scripts/setup.sh fetches it (or one on the PATH).
const cachedPromtool = path.join(process.env.ARMADA_CACHE ?? path.join(os.homedir(), '.cache', 'armada'), 'promtool', 'promtool');
const promtool = process.env.PROMTOOL ?? (fs.existsSync(cachedPromtool) ? cachedPromtool : 'promtool');

//! The sum of a family's samples in a /metrics text whose labels contain `labels` (all: '').
export function metricSum(text, name, labels = '') {
  let sum = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(\\{[^}]*\\})? (\\S+)$`, 'gm')))
    if ((m[1] ?? '').includes(labels)) sum += Number(m[2]);
  return sum;
}

//! Asserts that a /metrics text passes `promtool check metrics` (Prometheus' own lint: types,
//! names, help, suffixes), with its report in the message. `what` names the process.
export function assertLintedMetrics(text, what) {
  const r = spawnSync(promtool, ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.ok(!r.error, `promtool (${promtool}): ${r.error?.message}; scripts/setup.sh fetches it`);
  assert.equal(r.status, 0, `${what}: promtool check metrics says:\n${(r.stdout + r.stderr).trim()}`);
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Running, and not a zombie that `cluster up` has yet to reap.
export const alive = (pid) => {
  try {
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
};

// A sanitizer build reports to each process's stderr, which `cluster up` sends to its log, and
// the process's exit code reaches no test: its reports are looked for in the logs instead.
const SANITIZER_REPORT = /WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error: /;

export function sanitizerReports(logsDir) {
  if (!fs.existsSync(logsDir)) return [];
  return fs.readdirSync(logsDir).filter((f) => SANITIZER_REPORT.test(fs.readFileSync(`${logsDir}/${f}`, 'utf8')));
}

// The value of `key` in etcd, or null. `server` is cluster.json's servers.etcd ({ endpoint,
// user, password_file }; `cluster up` turns etcd's authentication on) or a bare host:port.
export async function etcdGet(server, key) {
  const kv = await etcdKv(server, key);
  return kv ? kv.value : null;
}

// The key as etcd's JSON gateway gives it: { value, lease } (lease 0: none), or null.
export async function etcdKv(server, key) {
  const kvs = await etcdRange(server, key);
  if (!kvs.length) return null;
  return { value: Buffer.from(kvs[0].value, 'base64').toString(), lease: Number(kvs[0].lease ?? 0) };
}

// The keys from `key` (every key under it when `prefix`), as etcd's JSON gateway gives them, read
// as the cluster's own etcd user when `server` names one.
export async function etcdRange(server, key, { prefix = false } = {}) {
  const b64 = (s) => Buffer.from(s).toString('base64');
  const endpoint = (typeof server === 'string' ? server : server.endpoint).replace(/^https?:\/\//, '');
  const headers = {};
  if (typeof server !== 'string' && server.user) {
    const password = fs.readFileSync(server.password_file, 'utf8').split('\n')[0];
    const auth = await fetch(`http://${endpoint}/v3/auth/authenticate`, {
      method: 'POST', body: JSON.stringify({ name: server.user, password }),
    }).then((x) => x.json());
    assert.ok(auth.token, `etcd gave ${server.user} no token: ${JSON.stringify(auth)}`);
    headers.Authorization = auth.token;
  }
  const body = { key: b64(key) };
  if (prefix) body.range_end = b64(key.slice(0, -1) + String.fromCharCode(key.charCodeAt(key.length - 1) + 1));
  const r = await fetch(`http://${endpoint}/v3/kv/range`, { method: 'POST', headers, body: JSON.stringify(body) })
    .then((x) => x.json());
  assert.ok(!r.error && !r.message, `etcd refused the read of ${key}: ${JSON.stringify(r)}`);
  return r.kvs ?? [];
}

// One command to Redis over its own protocol (RESP), as a test reads what the gateways keep
// there: an integer, a string (null when nil) or an array of strings. `server` is host:port, or
// cluster.json's servers.redis ({ url, user, password_file }): then the command is sent as that
// user (AUTH first), as `cluster up` gives Redis no default user.
export function redisCommand(server, ...args) {
  const addr = typeof server === 'string' ? server : server.url;
  const auth = typeof server === 'string' ? null
    : [server.user, fs.readFileSync(server.password_file, 'utf8').split('\n')[0]];
  const [host, port] = addr.split(':');
  const encode = (argv) => `*${argv.length}\r\n` + argv.map((a) => `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`).join('');
  return new Promise((resolve, reject) => {
    const sock = net.createConnection({ host, port: Number(port) });
    let buf = '';
    sock.setTimeout(5000, () => { sock.destroy(); reject(new Error('Redis did not answer')); });
    sock.on('error', reject);
    sock.on('data', (d) => {
      buf += d.toString('utf8');
      try {
        let parsed = parseResp(buf, 0);
        if (parsed && auth) parsed = parseResp(buf, parsed.end);  // AUTH's +OK, then the answer
        if (parsed) { sock.end(); resolve(parsed.value); }
      } catch (e) { sock.destroy(); reject(e); }
    });
    sock.write((auth ? encode(['AUTH', ...auth]) : '') + encode(args));
  });
}

// A whole RESP reply at `at` in `s`, or null while more is to come.
function parseResp(s, at) {
  const nl = s.indexOf('\r\n', at);
  if (nl < 0) return null;
  const type = s[at];
  const head = s.slice(at + 1, nl);
  if (type === '+') return { value: head, end: nl + 2 };
  if (type === '-') throw new Error(`Redis: ${head}`);
  if (type === ':') return { value: Number(head), end: nl + 2 };
  if (type === '$') {
    const n = Number(head);
    if (n < 0) return { value: null, end: nl + 2 };
    if (s.length < nl + 2 + n + 2) return null;
    return { value: s.slice(nl + 2, nl + 2 + n), end: nl + 2 + n + 2 };
  }
  if (type === '*') {
    const out = [];
    let pos = nl + 2;
    for (let i = 0; i < Number(head); i++) {
      const item = parseResp(s, pos);
      if (!item) return null;
      out.push(item.value);
      pos = item.end;
    }
    return { value: out, end: pos };
  }
  throw new Error(`Redis: unreadable reply ${JSON.stringify(s.slice(at, at + 40))}`);
}

// Chat completions each node of `nodes` has answered with 200, from its /metrics.
async function chatsServed(nodes) {
  return Promise.all(nodes.map(async (p) => {
    const text = await fetch(`${p.url}/metrics`).then((r) => r.text());
    return [...text.matchAll(/^armada_requests_total\{([^}]*)\} (\S+)$/gm)]
      .filter((m) => m[1].includes('route="/v1/chat/completions"') && m[1].includes('code="200"'))
      .reduce((n, m) => n + Number(m[2]), 0);
  }));
}

// One chat turn sent alone through gateway `gw`: which of `nodes` answered it, and the reply.
export async function chatTurn(gw, nodes, messages) {
  const before = await chatsServed(nodes);
  const r = await fetch(`${gw}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: 4 }) });
  const body = await r.json();
  assert.equal(r.status, 200, JSON.stringify(body));
  const after = await chatsServed(nodes);
  const took = nodes.filter((p, i) => after[i] === before[i] + 1);
  assert.equal(took.length, 1, `one node answered: ${before} → ${after}`);
  return { node: took[0].name, reply: body.choices[0].message.content };
}

// Starts `armada cluster up ARGS` and waits for it to print its gateway's URL. Returns
// { proc, gw, log(), stop() }; stop() sends SIGINT and waits for everything to stop.
export async function clusterUp(args, { env = process.env, timeoutMs = 120000, cwd = undefined } = {}) {
  const proc = spawn(process.env.ARMADA_BIN, ['cluster', 'up', ...args], { stdio: ['ignore', 'pipe', 'pipe'], env, cwd });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  const gw = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('cluster up printed no gateway\n' + log)), timeoutMs);
    proc.stdout.on('data', () => {
      const m = log.match(/gateway at (https?:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`cluster up exited with ${code}\n${log}`)); });
  });
  return {
    proc,
    gw,
    log: () => log,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const done = new Promise((r) => proc.on('exit', r));
      proc.kill('SIGINT');
      await done;
    },
  };
}

// Polls `check` every 100 ms until it returns something truthy, and returns that; throws after
// `timeoutMs` (four times as long when ARMADA_TIMING=0, as under the sanitizers).
export async function waitFor(what, check, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs * (process.env.ARMADA_TIMING === '0' ? 4 : 1);
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const freePort = () => new Promise((resolve) => {
  const s = net.createServer();
  s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
});

// A llama-server built from the project's llama.cpp, on a free port, once its /health answers:
// { proc, port, log }. `args` go after the model, address and metrics flags; `port` (when given)
// is the one to listen on again after a restart.
export async function startLlamaServer(model, args, port = null) {
  port ??= await freePort();
  const proc = spawn(process.env.LLAMA_SERVER, ['-m', model, '--host', '127.0.0.1', '--port', String(port),
    '--metrics', '--no-webui', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const l = { proc, port, log: '' };
  proc.stdout.on('data', (d) => { l.log += d; });
  proc.stderr.on('data', (d) => { l.log += d; });
  await waitFor('llama-server /health', async () =>
    (await fetch(`http://127.0.0.1:${port}/health`).catch(() => null))?.status === 200);
  return l;
}
