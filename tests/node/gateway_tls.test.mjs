// `armada cluster up --tls`: the gateway serves HTTPS with a certificate from the cluster's own
// CA, and an agent session runs its whole course through it (create, events, result), verified
// against that CA. Plain HTTP on the same port gets no answer. The nodes, PostgreSQL, etcd, NATS
// and Redis take TLS only, and every process of the cluster reaches them over it, checking the CA.
import { spawnSync } from 'node:child_process';
import { assertFits } from './openapi_check.mjs';
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { clusterUp, sanitizerReports, waitFor } from './cluster_helpers.mjs';

const KEY = 'sk-tls-tenant';
let dir, cluster, ca;

// One HTTPS request verified against the cluster's CA: { status, text }.
function request(url, { method = 'GET', body = null, headers = {}, trust = ca } = {}) {
  return new Promise((resolve, reject) => {
    // A connection of its own each time (agent: false): a kept one would skip the verification.
    const req = https.request(url, { method, ca: trust ?? undefined, agent: false, headers: { Authorization: `Bearer ${KEY}`, ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        try { assertFits(method, url, res.statusCode, res.headers, text); } catch (e) { return reject(e); }
        resolve({ status: res.statusCode, text });
      });
    });
    req.on('error', reject);
    if (body) req.end(JSON.stringify(body)); else req.end();
  });
}

before(async () => {
  dir = tempDir('armada-gw-tls-');
  fs.chmodSync(dir, 0o755);
  fs.writeFileSync(path.join(dir, 'keys'), `${KEY} tenant=acme\n`);
  fs.writeFileSync(path.join(dir, 'agents.yaml'), `agents:
  - id: talker
    instructions: Answer briefly.
    answer_without_tools: true
    limits: { max_steps: 2, max_tokens_per_step: 8 }
`);
  cluster = await clusterUp(['--tls', '--nodes', '1', '--brains', '1', '-m', tinyModel, '--port', '0',
    '--data-dir', path.join(dir, 'c'), '--api-key-file', path.join(dir, 'keys'), '--agents', path.join(dir, 'agents.yaml'),
    '--node-arg=-np', '--node-arg=4', '--node-arg=-c', '--node-arg=2048']);
  ca = fs.readFileSync(path.join(dir, 'c', 'tls', 'ca.crt'));
  await waitFor('a node in the cluster', async () => {
    const r = await request(cluster.gw + '/readyz').catch(() => null);
    return r?.status === 200 && JSON.parse(r.text).nodes >= 1;
  }, 120000);
});

after(async () => {
  if (cluster) await cluster.stop();
  // Under a sanitizer build, every process's report (a leak at exit included) fails the file.
  assert.deepEqual(sanitizerReports(path.join(dir, 'c', 'logs')), [], 'no process logged a sanitizer report');
});

test('cluster up --tls: the gateway speaks HTTPS with a certificate its CA signed, and keeps its key private', async () => {
  assert.match(cluster.gw, /^https:\/\/127\.0\.0\.1:\d+$/);
  assert.match(cluster.log(), /clients trust .*tls\/ca\.crt/);
  // Verified against the cluster's CA; refused by a client that trusts only the system's.
  assert.equal((await request(cluster.gw + '/health')).status, 200);
  await assert.rejects(request(cluster.gw + '/health', { trust: null }), /self.signed|unable to (get|verify)|certificate/i);
  const key = path.join(dir, 'c', 'tls', 'server.key');
  assert.equal(fs.statSync(key).mode & 0o777, 0o600);
  // Plain HTTP on the HTTPS port gets no HTTP answer.
  const { port } = new URL(cluster.gw);
  const plain = await greeting(Number(port), 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
  assert.doesNotMatch(plain, /^HTTP\/1\.1/);
});

test('an agent session runs its whole course through the HTTPS gateway', async () => {
  const created = await request(`${cluster.gw}/v1/agents/talker/sessions`, {
    method: 'POST', body: { input: 'Say hello.' }, headers: { 'Content-Type': 'application/json' },
  });
  assert.equal(created.status, 201, created.text);
  const id = JSON.parse(created.text).id;
  const done = await waitFor('the session to complete', async () => {
    const r = await request(`${cluster.gw}/v1/sessions/${id}`);
    const j = JSON.parse(r.text);
    return ['completed', 'failed'].includes(j.state) ? j : null;
  }, 120000);
  assert.equal(done.state, 'completed', JSON.stringify(done));
  // Its event stream, over the same TLS, from the start up to the state that says it completed
  // (a completed session may take another message, so the stream stays open: it is read until then).
  const text = await new Promise((resolve, reject) => {
    const req = https.get(`${cluster.gw}/v1/sessions/${id}/events`, { ca, agent: false, headers: { Authorization: `Bearer ${KEY}` } },
      (res) => {
        assert.equal(res.statusCode, 200);
        let got = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          got += d;
          if (/event: state\ndata: [^\n]*"completed"/.test(got)) {
            req.destroy();
            try { assertFits('GET', `${cluster.gw}/v1/sessions/${id}/events`, res.statusCode, res.headers, got); } catch (e) { return reject(e); }
            resolve(got);
          }
        });
        res.on('end', () => resolve(got));
      });
    req.on('error', (e) => { if (e.code !== 'ECONNRESET') reject(e); });
    setTimeout(() => { req.destroy(); reject(new Error('no completed state on the stream within 60 s')); }, 60000);
  });
  assert.match(text, /event: message/);
  assert.match(text, /event: state\ndata: [^\n]*"completed"/);
});

// What a server sends on a plain connection to `port` (after `send`), within 3 s. The port must
// take the connection: a closed one would send nothing either.
async function greeting(port, send = '') {
  const { connected, got } = await new Promise((resolve) => {
    let ok = false;
    const s = net.createConnection({ host: '127.0.0.1', port }, () => { ok = true; if (send) s.write(send); });
    let text = '';
    const done = () => resolve({ connected: ok, got: text });
    s.on('data', (d) => { text += d.toString('latin1'); });
    s.on('close', done);
    s.on('error', done);
    setTimeout(() => { s.destroy(); done(); }, 3000);
  });
  assert.ok(connected, `port ${port} takes connections`);
  return got;
}

test('cluster up --tls: PostgreSQL, etcd, NATS and Redis take TLS only, and the cluster file has each client check the CA', async () => {
  const st = JSON.parse(fs.readFileSync(path.join(dir, 'c', 'cluster.json'), 'utf8'));
  const yaml = fs.readFileSync(st.config, 'utf8');
  const caFile = path.join(dir, 'c', 'tls', 'ca.crt');
  for (const s of ['etcd', 'nats', 'redis'])
    assert.ok(yaml.includes(`ca_file: ${JSON.stringify(caFile)}`) && new RegExp(`^  ${s}: \\{.*ca_file`, 'm').test(yaml), yaml);
  // PostgreSQL: over TLS, checked against the CA, it answers; without TLS it refuses.
  const pg = st.servers.postgres.url;
  assert.match(pg, /sslmode=verify-full&sslrootcert=/);
  const ok = spawnSync('psql', [pg, '-Atc', 'select ssl from pg_stat_ssl where pid = pg_backend_pid()'], { encoding: 'utf8' });
  assert.equal(ok.status, 0, ok.stderr);
  assert.equal(ok.stdout.trim(), 't');
  const plainPg = spawnSync('psql', [pg.replace('sslmode=verify-full', 'sslmode=disable'), '-Atc', 'select 1'], { encoding: 'utf8' });
  assert.notEqual(plainPg.status, 0);
  assert.match(plainPg.stderr, /no pg_hba\.conf entry|no encryption/, plainPg.stderr);
  // etcd: HTTPS with the CA answers; plain HTTP gets no HTTP answer.
  const { port: etcdPort } = new URL(`http://${st.servers.etcd.endpoint}`);
  assert.equal((await request(`https://${st.servers.etcd.endpoint}/health`)).status, 200);
  assert.doesNotMatch(await greeting(Number(etcdPort), 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n'), /^HTTP\/1\.1 200/);
  // NATS: its greeting demands TLS before anything else.
  const natsPort = Number(st.servers.nats.url.split(':').at(-1));
  assert.match(await greeting(natsPort), /^INFO .*"tls_required":true/);
  // Nodes: HTTPS with the cluster's certificate (the gateway reaches them over it), no plain HTTP.
  const node = st.processes.find((p) => p.role === 'node');
  assert.match(node.url, /^https:\/\/127\.0\.0\.1:\d+$/);
  assert.equal((await request(node.url + '/health')).status, 200);
  assert.doesNotMatch(await greeting(Number(new URL(node.url).port), 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n'), /^HTTP\/1\.1 200/);
  assert.match(yaml, /^  nodes: \{ca_file: /m);
  // Redis: its one port speaks TLS; a plain PING gets no answer in Redis' protocol at all (not
  // even -NOAUTH, which a plain Redis with no default user would send).
  const redisPort = Number(st.servers.redis.url.split(':').at(-1));
  assert.doesNotMatch(await greeting(redisPort, 'PING\r\n'), /^[-+:$*]/);
});
