// Placement on this machine: `armada topology` prints the topology and plan, and a real
// `armada serve` pins its engine threads where the plan says, read back from /proc.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { startServer, rawPost } from './harness.mjs';

const bin = process.env.ARMADA_BIN;

function threads(pid) {
  return fs.readdirSync(`/proc/${pid}/task`).map((tid) => {
    const status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
    return {
      tid: Number(tid),
      name: fs.readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim(),
      cpus: status.match(/Cpus_allowed_list:\s*(\S+)/)[1],
    };
  });
}

// The cpus this test process may use, as a list of numbers.
function allowedCpus() {
  const list = fs.readFileSync('/proc/self/status', 'utf8').match(/Cpus_allowed_list:\s*(\S+)/)[1];
  return list.split(',').flatMap((part) => {
    const [a, b] = part.split('-').map(Number);
    return Array.from({ length: (b ?? a) - a + 1 }, (_, i) => a + i);
  });
}

test('armada topology prints the machine and the plan; bad options fail clearly', () => {
  const r = spawnSync(bin, ['topology'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /^topology \(this machine\): \d+ packages?, \d+ NUMA nodes?, \d+ cores/);
  assert.match(r.stdout, /plan: \d+ engines?/);
  assert.match(r.stdout, /engine 0: node \d+, \d+ threads on cpus/);

  const s = spawnSync(bin, ['topology', '--synthetic', 'pack:2 numa:2 core:32 pu:1'], { encoding: 'utf8' });
  assert.equal(s.status, 0, s.stderr);
  assert.match(s.stdout, /2 packages, 4 NUMA nodes, 128 cores/);
  assert.match(s.stdout, /plan: 4 engines/);
  assert.match(s.stdout, /engine 2: node 2, 32 threads on cpus 64-95, memory node 2/);

  for (const [args, msg] of [
    [['--numa', 'sometimes'], /--numa must be auto or off/],
    [['--cpus', '0-'], /--cpus: '0-' is not a cpu list/],
    [['--cpus', '4095'], /cpu 4095 is not available/],
    [['--numa-nodes', '7'], /node 7 has no usable cpus/],
  ]) {
    const b = spawnSync(bin, ['topology', ...args], { encoding: 'utf8' });
    assert.equal(b.status, 2, args.join(' '));
    assert.match(b.stderr, msg);
  }
});

test('serve pins the engine threads to the planned cpus and leaves the others alone', async () => {
  const cpus = allowedCpus();
  const pin = cpus[cpus.length - 1];
  const srv = await startServer(['--cpus', String(pin), '-t', '0']);
  try {
    // A request makes the compute threads run.
    const r = await rawPost(srv.base, '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'hi' }], max_tokens: 4,
    });
    assert.equal(r.status, 200, r.text);
    const ts = threads(srv.proc.pid);
    const engine = ts.filter((t) => t.name === 'armada-engine');
    assert.equal(engine.length, 1, JSON.stringify(ts));
    assert.equal(engine[0].cpus, String(pin));
    // The main thread (and so the HTTP threads it starts) keeps the whole cpuset.
    const main = ts.find((t) => t.tid === srv.proc.pid);
    assert.notEqual(main.cpus, String(pin));
    assert.match(srv.stdout() + srv.stderr(), new RegExp(`engine 0 threads pinned to cpus ${pin}, memory node`));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  const bad = await startServer(['--cpus', '4095']).then(() => null, (e) => e);
  assert.ok(bad, 'serve must refuse a cpu it cannot use');
  assert.match(String(bad), /cpu 4095 is not available/);
});

test('two engines: each pinned to its own cpu, sessions spread over both and stay on theirs', async () => {
  const { startToolServer } = await import('./tool_server.mjs');
  const { agentYaml, tempDir, writeAgents } = await import('./agents.mjs');
  const { waitFor } = await import('./session_helpers.mjs');
  const path = await import('node:path');
  const tools = await startToolServer();
  const cpus = allowedCpus();
  const dir = tempDir('armada-engines-');
  const agents = writeAgents(dir, agentYaml(tools.url));
  // With one usable cpu the engines cannot each have their own, so they run unpinned.
  const pinArgs = cpus.length >= 2 ? ['--cpus', `${cpus[0]},${cpus[1]}`, '-t', '0'] : ['--no-pin'];
  const srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow',
    '127.0.0.1', '--engines', '2', '-np', '4', '-c', '8192', '--park-grace-ms', '100', ...pinArgs]);
  try {
    assert.match(srv.stdout(), /on 2 engines/);
    const ids = [];
    for (let i = 0; i < 6; i++) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `Process record ${i}` });
      assert.equal(r.status, 200, r.text);
      ids.push(r.json.id);
    }
    const engines = new Set();
    for (const id of ids) {
      const s = await waitFor(srv.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
      assert.equal(s.state, 'completed', s.reason);
      assert.ok([0, 1].includes(s.memory.kv_engine), JSON.stringify(s.memory));
      engines.add(s.memory.kv_engine);
      // Every step after the first found the session's own KV: the session never moved to the
      // other engine, whose slots and pool do not hold it.
      const steps = s.steps.filter((x) => x.kind === 'model_output').map((x) => x.data);
      for (const d of steps.slice(1)) assert.ok(['slot', 'ram', 'disk'].includes(d.kv_source), JSON.stringify(d));
    }
    assert.equal(engines.size, 2, 'sessions were spread over both engines');
    const text = await (await fetch(srv.base + '/metrics')).text();
    assert.match(text, /^armada_engines 2$/m);
    for (const e of [0, 1]) {
      const m = text.match(new RegExp(`^armada_engine_requests_total\\{engine="${e}"\\} (\\d+)$`, 'm'));
      assert.ok(m && Number(m[1]) > 0, `engine ${e} took requests`);
    }
    // Each engine's loop thread is on its own cpu, and prefers its memory node.
    const ts = threads(srv.proc.pid);
    const loops = ['armada-engine', 'armada-engine1'].map((n) => ts.find((t) => t.name === n));
    assert.ok(loops.every(Boolean), JSON.stringify(ts));
    if (cpus.length >= 2) {
      assert.deepEqual(loops.map((t) => t.cpus), [String(cpus[0]), String(cpus[1])]);
      const log = srv.stdout() + srv.stderr();
      assert.match(log, new RegExp(`engine 0 threads pinned to cpus ${cpus[0]}, memory node \\d+`));
      assert.match(log, new RegExp(`engine 1 threads pinned to cpus ${cpus[1]}, memory node \\d+`));
      if (!/memory follows first touch/.test(log)) {
        // The thread's policy shows on the mappings that have none of their own.
        const maps = fs.readFileSync(`/proc/${srv.proc.pid}/task/${loops[1].tid}/numa_maps`, 'utf8');
        assert.match(maps, / prefer:\d+ /);
      }
    }
  } finally {
    assert.equal(await srv.stop(), 0);
    await tools.close();
  }
});

test('--engines that cannot be placed is refused before the model loads', async () => {
  for (const [args, msg] of [
    [['--engines', '4096'], /--engines must be between 1 and 1024/],
    [['--engines', '3', '-np', '2', '--no-pin'], /3 engines need at least 3 parallel sequences/],
    [['--engines', '64', '-np', '64'], /cannot give each engine a thread|does not divide/],
  ]) {
    const bad = await startServer(args).then(() => null, (e) => e);
    assert.ok(bad, args.join(' '));
    assert.match(String(bad), msg);
  }
  const r = spawnSync(bin, ['topology', '--synthetic', 'pack:2 numa:2 core:32 pu:1', '--engines', '8'],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /plan: 8 engines/);
  assert.match(r.stdout, /engine 3: node 1, 16 threads on cpus 48-63, memory node 1/);
  const b = spawnSync(bin, ['topology', '--synthetic', 'pack:2 numa:2 core:32 pu:1', '--engines', '6'],
    { encoding: 'utf8' });
  assert.equal(b.status, 2);
  assert.match(b.stderr, /--engines 6 does not divide over 4 NUMA nodes; use a multiple of 4 or --numa off/);
});

test('--numa-weights copy reads the weights into private memory instead of mapping the file', async () => {
  const { tinyModel } = await import('./harness.mjs');
  const mapped = (pid) => fs.readFileSync(`/proc/${pid}/maps`, 'utf8').includes(tinyModel);
  for (const [mode, expectMapped] of [['shared', true], ['copy', false]]) {
    const srv = await startServer(['--engines', '2', '--numa-weights', mode, '--no-pin']);
    try {
      const r = await rawPost(srv.base, '/v1/chat/completions', {
        messages: [{ role: 'user', content: 'hi' }], max_tokens: 4,
      });
      assert.equal(r.status, 200, r.text);
      assert.equal(mapped(srv.proc.pid), expectMapped, `${mode}: model file mapped`);
      if (mode === 'copy') assert.match(srv.stderr() + srv.stdout(), /weights: 1 private copy \(node any\)/);
    } finally {
      assert.equal(await srv.stop(), 0);
    }
  }
  const bad = await startServer(['--numa-weights', 'twice']).then(() => null, (e) => e);
  assert.match(String(bad), /--numa-weights must be shared or copy, not 'twice'/);
});
