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
    assert.match(srv.stdout() + srv.stderr(), new RegExp(`engine threads pinned to cpus ${pin}`));
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  const bad = await startServer(['--cpus', '4095']).then(() => null, (e) => e);
  assert.ok(bad, 'serve must refuse a cpu it cannot use');
  assert.match(String(bad), /cpu 4095 is not available/);
});
