// Starts the real `armada serve` on port 0 and waits until /health says ready.
import { assertFits } from './openapi_check.mjs';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import { tempDir } from './agents.mjs';
import path from 'node:path';
import { sanitizerReports } from './cluster_helpers.mjs';

export const modelDir = process.env.ARMADA_MODEL_DIR;
export const tinyModel = path.join(modelDir ?? '', 'armada-tiny-q8_0.gguf');

// GET over https, trusting `ca` (a PEM file); resolves with { status, text }.
export function httpsGet(url, ca, headers = {}) {
  return new Promise((resolve, reject) => {
    https.get(url, { ca: fs.readFileSync(ca), headers }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        try { assertFits('GET', url, res.statusCode, res.headers, text); } catch (e) { return reject(e); }
        resolve({ status: res.statusCode, text });
      });
    }).on('error', reject);
  });
}

// ARMADA_VIA_GATEWAY=1 runs a suite against a cluster's gateway instead of a node: each
// startServer is an `armada cluster up` of one node (its flags go to that node) and the suite
// talks to the gateway. The one difference a suite sees: the gateway answers 201 to a new session.
export const viaGateway = process.env.ARMADA_VIA_GATEWAY === '1';
export const createdStatus = viaGateway ? 201 : 200;

async function startCluster(args, { model, env }) {
  const bin = process.env.ARMADA_BIN;
  const dir = tempDir('armada-gw-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const nodeArgs = ['-c', '4096', '-np', '4', '-t', '2'];
  const upArgs = [];
  for (let i = 0; i < args.length; i++) {
    // Keys and agents go to the gateway too; --data-dir is the cluster's own.
    if (args[i] === '--api-key' || args[i] === '--api-key-file' || args[i] === '--agents') {
      upArgs.push(args[i], args[++i]);
    } else if (args[i] === '--data-dir') {
      i++;
    } else {
      nodeArgs.push(args[i]);
    }
  }
  const proc = spawn(bin, ['cluster', 'up', '--nodes', '1', '--brains', '1', '-m', model, '--port', '0',
    '--data-dir', path.join(dir, 'c'), ...upArgs, ...nodeArgs.map((a) => `--node-arg=${a}`)], {
    stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env },
  });
  let out = '';
  proc.stdout.on('data', (d) => { out += d; });
  proc.stderr.on('data', (d) => { out += d; });
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('cluster up printed no gateway\n' + out)), 120000);
    proc.stdout.on('data', () => {
      const m = out.match(/gateway at (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`cluster up exited with ${code}\n${out}`)); });
  });
  const deadline = Date.now() + 120000;
  for (;;) {
    const r = await fetch(base + '/readyz').then((x) => x.json()).catch(() => null);
    if (r?.nodes >= 1) break;
    if (Date.now() > deadline) throw new Error('the cluster never had a node\n' + out);
    await new Promise((res) => setTimeout(res, 100));
  }
  // An API key given to `cluster up` reaches its processes through their environment: it must
  // not show in any command line (`ps` shows those to every user of the machine).
  const key = upArgs[upArgs.indexOf('--api-key') + 1];
  if (upArgs.includes('--api-key')) {
    const status = JSON.parse(fs.readFileSync(path.join(dir, 'c', 'cluster.json'), 'utf8'));
    for (const p of status.processes) {
      const cmdline = fs.readFileSync(`/proc/${p.pid}/cmdline`, 'utf8');
      if (cmdline.includes(key)) throw new Error(`the API key is on the command line of ${p.name}`);
    }
  }
  const logs = () => {
    const d = path.join(dir, 'c', 'logs');
    return fs.existsSync(d) ? fs.readdirSync(d).map((f) => fs.readFileSync(path.join(d, f), 'utf8')).join('') : '';
  };
  const status = JSON.parse(fs.readFileSync(path.join(dir, 'c', 'cluster.json'), 'utf8'));
  return {
    base,
    // The node's own address: its engine and session metrics are there, not on the gateway.
    metricsBase: status.processes.find((p) => p.role === 'node').url,
    // Every process of the cluster (role, name, url, log) as `cluster up` lists them.
    processes: status.processes,
    proc,
    stderr: () => out + logs(),
    stdout: () => out + logs(),
    async stop() {
      const code = proc.exitCode !== null ? proc.exitCode : await new Promise((res) => {
        proc.on('exit', (c) => res(c));
        proc.kill('SIGINT');
      });
      // A sanitizer report in any process of the cluster fails the stop, as a node's exit code would.
      const reports = sanitizerReports(path.join(dir, 'c', 'logs'));
      if (reports.length) {
        console.log(`sanitizer reports in ${reports.join(', ')}:\n${logs().slice(-6000)}`);
        return 66;
      }
      return code;
    },
  };
}

export async function startServer(args = [], { model = tinyModel, env = {}, ca = null } = {}) {
  if (viaGateway) return startCluster(args, { model, env });
  const bin = process.env.ARMADA_BIN;
  if (!bin) throw new Error('ARMADA_BIN is not set');
  const proc = spawn(bin, ['serve', '-m', model, '--port', '0', '-c', '4096', '-np', '4', '-t', '2', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  let stderr = '';
  let stdout = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  proc.stdout.on('data', (d) => { stdout += d; });
  const base = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('armada did not print its address\n' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on (https?:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`armada exited with ${code}\n${stderr}`)); });
  });
  const deadline = Date.now() + 60000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`armada exited with ${proc.exitCode}\n${stderr}`);
    const r = await (ca ? httpsGet(base + '/health', ca) : fetch(base + '/health')).catch(() => null);
    if (r && r.status === 200) break;
    if (Date.now() > deadline) throw new Error('armada never became ready\n' + stderr);
    await new Promise((res) => setTimeout(res, 100));
  }
  return {
    base,
    metricsBase: base,
    proc,
    stderr: () => stderr,
    stdout: () => stdout,
    async stop() {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((res) => proc.on('exit', (code) => res(code)));
      proc.kill('SIGTERM');
      const code = await done;
      // A failed exit (a sanitizer report, a crash in shutdown) is explained in the test log.
      if (code !== 0) console.log(`armada exited with ${code}; the end of its stderr:\n${stderr.slice(-6000)}`);
      return code;
    },
  };
}

export async function rawPost(base, route, body, headers = {}) {
  const r = await fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}
