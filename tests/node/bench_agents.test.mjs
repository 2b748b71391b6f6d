// Smoke runs of `armada bench agents` against the real server: both modes, the fault pre-test
// (SIGKILL partway, restart, sessions resume), the plot and the capacity plan.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { startServer, tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';

const bin = process.env.ARMADA_BIN;
const dir = tempDir('armada-bench-');
const cleanup = [];
after(() => { for (const f of cleanup) f(); });

async function freePortBelowEphemeral() {
  for (;;) {
    const p = 20000 + Math.floor(Math.random() * 10000);
    const ok = await new Promise((res) => {
      const s = net.createServer();
      s.once('error', () => res(false));
      s.listen(p, '127.0.0.1', () => s.close(() => res(true)));
    });
    if (ok) return p;
  }
}

function bench(args) {
  const r = spawnSync(bin, ['bench', 'agents', '--no-progress', '--sessions', '6', '--concurrency', '3',
    '--steps', '2', '--instruction-tokens', '120', '--tool-latency', 'uniform:0.05,0.2', ...args],
  { encoding: 'utf8', timeout: 300000 });
  return r;
}

test('sessions mode and chat mode complete every session and write their reports', async () => {
  const srv = await startServer(['--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '4',
    '-c', '8192']);
  try {
    for (const mode of ['sessions', 'chat']) {
      const out = path.join(dir, `${mode}-c3`);
      const r = bench(['--target', srv.base, '--mode', mode, '--label', `armada-${mode}`, '--server-pid',
        String(srv.proc.pid), '--output', out]);
      assert.equal(r.status, 0, r.stdout + r.stderr);
      const j = JSON.parse(fs.readFileSync(out + '.json', 'utf8'));
      assert.equal(j.results.completed, 6);
      assert.equal(j.results.chain_survival, 1);
      assert.ok(j.results.sessions_per_min > 0);
      assert.ok(j.results.completion_s.p95 >= j.results.completion_s.p50);
      assert.ok(j.results.step_s.p50 > 0 && j.results.ttft_s.p50 > 0);
      assert.ok(j.results.generated_tokens_per_s > 0 && j.results.prompt_tokens_per_s > 0);
      assert.ok(j.results.server_rss_peak_mb > 10);
      assert.equal(j.results.tool_calls_served, 12);
      // The tool server declares Content-Length; every reply must reach the model.
      assert.equal(j.results.errors.tool_error ?? 0, 0, JSON.stringify(j.results));
      assert.match(fs.readFileSync(out + '.md', 'utf8'), /\| armada-/);
    }
    // The engine's time split and the grammar's slow path, which the simulator's calibration reads.
    const metrics = await (await fetch(srv.base + '/metrics')).text();
    const value = (name) => Number((metrics.match(new RegExp(`^${name} (\\S+)$`, 'm')) ?? [])[1]);
    assert.ok(value('armada_engine_decode_seconds_count') > 0, metrics);
    assert.ok(value('armada_engine_decode_seconds_sum') > 0);
    assert.equal(value('armada_engine_sample_seconds_count'), value('armada_engine_decode_seconds_count'));
    assert.equal(value('armada_engine_decode_seconds_count'), value('armada_batch_tokens_count'));
    // Random weights seldom pick a token the tool-call grammar allows first.
    assert.ok(value('armada_grammar_fallback_tokens_total') > 0, metrics);
    assert.ok(value('armada_grammar_fallback_tokens_total') <= value('armada_generated_tokens_total'));
    const plot = spawnSync(bin, ['bench', 'plot', path.join(dir, 'sessions-c3.json'), path.join(dir, 'chat-c3.json'),
      '-o', path.join(dir, 'plot')], { encoding: 'utf8' });
    assert.equal(plot.status, 0, plot.stderr);
    assert.match(fs.readFileSync(path.join(dir, 'plot.svg'), 'utf8'), /<svg/);
    const plan = spawnSync(bin, ['bench', 'plan', path.join(dir, 'sessions-c3.json'), '--water-level', '0.5',
      '--target-sessions', '100'], { encoding: 'utf8' });
    assert.equal(plan.status, 0, plan.stderr);
    assert.match(plan.stdout, /plan at water level 0.50: 1 sessions per node/);
    assert.match(plan.stdout, /for 100 concurrent sessions: 100 nodes/);
  } finally {
    await srv.stop();
  }
});

test('bench engine --depth times a later step: tokens appended to ones each sequence holds', () => {
  const run = (args) => spawnSync(bin, ['bench', 'engine', '-m', tinyModel, '-t', '1', '--rounds', '1', ...args],
    { encoding: 'utf8', timeout: 120000 });
  const r = run(['--streams', '1,2', '-d', '96', '-p', '16', '-n', '8']);
  assert.equal(r.status, 0, r.stdout + r.stderr);
  for (const s of [1, 2]) {
    const m = r.stdout.match(new RegExp(`^median streams=${s}\\s+armada ([\\d.]+) tok/s.*armada prompt ([\\d.]+) tok/s`, 'm'));
    assert.ok(m && Number(m[1]) > 0 && Number(m[2]) > 0, r.stdout);
    // Each timed request found its sequence's 96 tokens there and computed only its 16 new ones.
    const reused = r.stdout.match(new RegExp(`^round 0 armada\\s+streams=${s}\\s.*reused (\\d+) of (\\d+) prompt tokens`, 'm'));
    assert.ok(reused, r.stdout);
    assert.equal(Number(reused[2]), s * (96 + 16));
    assert.equal(Number(reused[1]), s * 96);
  }
  const peer = run(['--streams', '1', '-d', '96', '--batched-bench', '/bin/true']);
  assert.equal(peer.status, 2);
  assert.match(peer.stderr, /--depth has no llama-batched-bench equivalent/);
  const bad = run(['--streams', '1', '--grammar', 'root ::= [a-z']);
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /--grammar:/);
  const g = run(['--streams', '1', '-p', '16', '-n', '8', '--grammar', 'root ::= [a-z ]+']);
  assert.equal(g.status, 0, g.stdout + g.stderr);
  assert.match(g.stdout, /^median streams=1\s+armada [\d.]+ tok\/s/m);
});

test('bad workload flags are refused with a reason', () => {
  const r = spawnSync(bin, ['bench', 'agents', '--target', 'http://127.0.0.1:9', '--tool-latency', 'gauss:1'],
    { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /constant:S, uniform:LO,HI or lognormal:MEAN,SIGMA/);
});

test('fault pre-test: the server is killed partway, restarted, and every session still completes', async () => {
  // A port below the ephemeral range: while the server is down, the bench's reconnects to a
  // port inside that range can be given the same port as their source and connect to
  // themselves (TCP self-connect), which would then hold the port the restart needs.
  const port = await freePortBelowEphemeral();
  const data = path.join(dir, 'fault-data');
  const args = ['serve', '-m', tinyModel, '--port', String(port), '-np', '4', '-c', '8192', '-t', '2', '--data-dir',
    data, '--tool-allow', '127.0.0.1'];
  const first = spawn(bin, args, { stdio: 'ignore' });
  cleanup.push(() => { try { first.kill('SIGKILL'); } catch { /* gone */ } });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    const r = await fetch(base + '/health').catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  const log = path.join(dir, 'restart.log');
  const pidFile = path.join(dir, 'restart.pid');
  const serverPidFile = path.join(dir, 'restarted-server.pid');
  // The restart tries again while the port is still held by the dying process (exit code 1).
  // The loop and each server it starts write their PIDs, so cleanup kills exactly those.
  const restart = `(for i in $(seq 1 40); do ${bin} ${args.join(' ')} >>${log} 2>&1 & echo $! >${serverPidFile}; wait $!; [ $? -ne 1 ] && break; sleep 0.25; done) & echo $! >${pidFile}`;
  cleanup.push(() => {
    for (const f of [pidFile, serverPidFile]) {
      try { process.kill(Number(fs.readFileSync(f, 'utf8')), 'SIGKILL'); } catch { /* not started, or gone */ }
    }
  });
  const out = path.join(dir, 'fault');
  const r = await new Promise((res) => {
    const p = spawn(bin, ['bench', 'agents', '--no-progress', '--target', base, '--mode', 'sessions', '--sessions', '8',
      '--concurrency', '4', '--steps', '2', '--instruction-tokens', '120', '--tool-latency', 'constant:0.5',
      '--server-pid', String(first.pid), '--kill-after', '2', '--restart-cmd', restart, '--retry', '60',
      '--output', out], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    p.on('exit', (code) => res({ code, err }));
  });
  assert.equal(r.code, 0, r.err);
  assert.match(r.err, /fault: SIGKILL/);
  const j = JSON.parse(fs.readFileSync(out + '.json', 'utf8'));
  assert.equal(j.results.completed, 8, JSON.stringify(j.results));
  assert.ok(j.results.retries > 0, 'the bench had to wait for the restarted server');
  assert.ok(j.results.completions_per_second.length > 2);
});

test('the plan takes the tighter of two limits: the concurrency measured and the memory sessions need', () => {
  const file = path.join(dir, 'plan-input.json');
  fs.writeFileSync(file, JSON.stringify({
    label: 'hand-made', date: '2026-12-01', workload: { concurrency: 100 },
    results: { chain_survival: 1, sessions_per_min: 60, completion_s: { p95: 9 }, kv_bytes_per_session: 64 * 2 ** 20,
      server_rss_idle_mb: 1000, server_rss_peak_mb: 11000 },
  }));
  const plan = (mem) => spawnSync(bin, ['bench', 'plan', file, '--water-level', '0.5', '--node-memory', mem,
    '--target-sessions', '1000'], { encoding: 'utf8' });
  // 100 MiB per session (the RSS grew 10,000 MiB for 100 sessions; more than the 64 MiB of KV).
  const roomy = plan('16G');  // (8192 - 1000) / 100 = 71 by memory, 50 by concurrency
  assert.equal(roomy.status, 0, roomy.stderr);
  assert.match(roomy.stdout, /memory per session: 100\.0 MiB \(KV 64\.0 MiB, RSS growth 100\.0 MiB per session\)/);
  assert.match(roomy.stdout, /concurrency allows 50 sessions, memory \(16\.0 GiB\) allows 71/);
  assert.match(roomy.stdout, /binding limit: concurrency/);
  assert.match(roomy.stdout, /plan at water level 0.50: 50 sessions per node/);
  assert.match(roomy.stdout, /for 1000 concurrent sessions: 20 nodes/);
  const tight = plan('8G');  // (4096 - 1000) / 100 = 30 by memory
  assert.match(tight.stdout, /memory \(8\.0 GiB\) allows 30/);
  assert.match(tight.stdout, /binding limit: memory/);
  assert.match(tight.stdout, /plan at water level 0.50: 30 sessions per node/);
  assert.match(tight.stdout, /for 1000 concurrent sessions: 34 nodes/);
});
