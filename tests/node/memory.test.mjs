// Black-box tests of session memory: KV accounting, parking and restore, shared prefixes,
// per-session caps with compaction, the node's watermark, and KV kept across a restart.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, rawPost } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { getJson, waitFor } from './session_helpers.mjs';

const tools = await startToolServer();
after(() => tools.close());

async function metric(base, name) {
  const text = await (await fetch(base + '/metrics')).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(name + ' ') || line.startsWith(name + '{')) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

function modelSteps(s) {
  return s.steps.filter((x) => x.kind === 'model_output').map((x) => x.data);
}

test('more sessions than sequences: KV is accounted, parked, restored and the prefix is shared', async () => {
  const dir = tempDir('armada-mem-');
  const agents = writeAgents(dir, agentYaml(tools.url));
  const srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow',
    '127.0.0.1', '-np', '2', '-c', '8192', '--park-grace-ms', '100']);
  try {
    const ids = [];
    for (let i = 0; i < 6; i++) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `Process record ${i}` });
      assert.equal(r.status, 200, r.text);
      ids.push(r.json.id);
    }
    const sources = [];
    for (const id of ids) {
      const s = await waitFor(srv.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
      assert.equal(s.state, 'completed', s.reason);
      // Memory: where the KV is, its size, and its growth step by step.
      assert.ok(['slot', 'ram', 'disk'].includes(s.memory.kv_location), JSON.stringify(s.memory));
      assert.ok(s.memory.kv_tokens > 0 && s.memory.kv_bytes > 0);
      assert.equal(s.memory.history.length, 4);
      const h = s.memory.history.map((p) => p.kv_tokens);
      for (let k = 1; k < h.length; k++) assert.ok(h[k] > h[k - 1], `KV grows: ${h}`);
      assert.ok(s.memory.history.every((p) => p.kv_bytes > p.kv_tokens));
      const steps = modelSteps(s);
      sources.push(...steps.map((d) => d.kv_source ?? 'none'));
      // Every session after the first starts from the agent's shared prefix: restored from the
      // prompt cache, or copied from a sequence holding it.
      if (ids.indexOf(id) > 0) {
        assert.ok(['prefix', 'copy'].includes(steps[0].kv_source), JSON.stringify(steps[0]));
        assert.ok(steps[0].cached_tokens > 64, JSON.stringify(steps[0]));
      }
      // After the first step, every step reuses the session's own KV (slot, RAM or disk).
      for (const d of steps.slice(1)) {
        assert.ok(['slot', 'ram', 'disk'].includes(d.kv_source), JSON.stringify(d));
        assert.ok(d.cached_tokens > 0);
      }
    }
    // Two sequences, six sessions waiting on tools: some had to be parked and restored, and
    // sessions after the first started from the agent's shared prefix.
    assert.ok(sources.includes('ram') || sources.includes('disk'), sources.join(','));
    assert.ok(await metric(srv.base, 'armada_kv_parks_total') > 0);
    assert.ok(await metric(srv.base, 'armada_kv_restores_total') > 0);
    assert.ok(await metric(srv.base, 'armada_kv_prefix_hits_total') > 0);
    assert.ok(await metric(srv.base, 'armada_kv_budget_bytes') > 0);
    assert.equal(await metric(srv.base, 'armada_kv_restore_failures_total'), 0);
  } finally {
    await srv.stop();
  }
});

function wordsAgent(id, limits) {
  return `agents:
  - id: ${id}
    instructions: Read the data, then answer.
    min_tool_steps: 3
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 3 }
    limits: { max_steps: 6, max_tokens_per_step: 96, ${limits} }
    tools:
      - name: read
        description: Read a page of data
        url: ${tools.url}/words
        parameters:
          type: object
          properties:
            page: { type: integer, enum: [1, 2, 3] }
          required: [page]
          additionalProperties: false
`;
}

test('a session at its memory cap compacts old tool outputs, or fails with the reason', async () => {
  const dir = tempDir('armada-cap-');
  const agents = writeAgents(dir, wordsAgent('compacting', 'max_context_tokens: 800, keep_tool_outputs: 1') +
    wordsAgent('strict', 'max_context_tokens: 700').replace('agents:\n', ''));
  const srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow',
    '127.0.0.1', '-np', '2', '-c', '8192']);
  try {
    const a = await rawPost(srv.base, '/v1/agents/compacting/sessions', { input: 'go' });
    const s = await waitFor(srv.base, a.json.id, ['completed', 'failed'], { timeoutMs: 120000 });
    assert.equal(s.state, 'completed', s.reason);
    assert.ok(s.memory.compactions >= 1, JSON.stringify(s.memory));
    for (const p of s.memory.history) assert.ok(p.kv_tokens <= 800 + 96, JSON.stringify(s.memory.history));
    // The stored transcript keeps every tool output whole; only the prompt left them out.
    const outs = s.transcript.filter((m) => m.role === 'tool');
    assert.equal(outs.length, 3);
    assert.ok(outs.every((m) => m.content.includes('item49')));

    const b = await rawPost(srv.base, '/v1/agents/strict/sessions', { input: 'go' });
    const f = await waitFor(srv.base, b.json.id, ['completed', 'failed'], { timeoutMs: 120000 });
    assert.equal(f.state, 'failed');
    assert.match(f.reason, /session memory cap reached: the next step's prompt has \d+ tokens .* cap is 700 tokens/);
    assert.match(f.reason, /keep_tool_outputs/);
  } finally {
    await srv.stop();
  }
});

test('at the KV high watermark new sessions get 429 with Retry-After, and admission resumes', async () => {
  const dir = tempDir('armada-wm-');
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1 }));
  // The budget barely covers the context's own KV (4096 cells × 512 B = 2 MiB on the tiny
  // model) and the disk tier is 1 byte: the first parked session must be dropped. (With a
  // journal, a parked session only frees its RAM; and a prompt-cache entry, such as the agent's
  // shared prefix, is evicted without pressure.)
  const srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow',
    '127.0.0.1', '-np', '2', '-c', '4096', '--kv-budget', '2100k', '--kv-disk', '1', '--no-kv-journal']);
  try {
    const first = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'one' });
    assert.equal(first.status, 200, first.text);
    await waitFor(srv.base, first.json.id, ['completed']);
    let refused = null;
    const deadline = Date.now() + 10000;
    while (!refused && Date.now() < deadline) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'two' });
      if (r.status === 429) refused = r;
      else await new Promise((res) => setTimeout(res, 50));
    }
    assert.ok(refused, 'no 429 at the watermark');
    assert.ok(Number(refused.headers.get('retry-after')) > 0);
    assert.match(refused.json.error.message, /high watermark/);
    assert.equal(await metric(srv.base, 'armada_kv_pressure'), 1);
    assert.ok(await metric(srv.base, 'armada_kv_dropped_total') > 0);
    // Nothing more is dropped while new sessions wait; after the hold, they are admitted again.
    const until = Date.now() + 20000;
    let ok = null;
    while (!ok && Date.now() < until) {
      await new Promise((res) => setTimeout(res, 500));
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'three' });
      if (r.status === 200) ok = r;
    }
    assert.ok(ok, 'admission did not resume');
    assert.equal((await fetch(srv.base + '/health')).status, 200);
  } finally {
    await srv.stop();
  }
});

test('a session\'s KV survives a restart on disk; a changed fingerprint re-prefills instead', async () => {
  const dir = tempDir('armada-restart-kv-');
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1 }));
  const args = ['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '2',
    '-c', '4096'];
  let srv = await startServer(args);
  const ids = [];
  try {
    for (const input of ['first', 'second']) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input });
      ids.push(r.json.id);
      await waitFor(srv.base, r.json.id, ['completed']);
    }
  } finally {
    assert.equal(await srv.stop(), 0);
  }
  srv = await startServer(args);
  try {
    const r = await rawPost(srv.base, `/v1/sessions/${ids[0]}/messages`, { input: 'and once more' });
    assert.equal(r.status, 200, r.text);
    const s = await waitFor(srv.base, ids[0], ['completed']);
    const last = modelSteps(s).at(-1);
    // Written at the clean stop, or already in the session's journal.
    assert.ok(['disk', 'journal'].includes(last.kv_source), JSON.stringify(last));
    assert.ok(last.cached_tokens > 0);
  } finally {
    await srv.stop();
  }
  srv = await startServer(args, { env: { ARMADA_KV_FINGERPRINT_EXTRA: 'other-build' } });
  try {
    const r = await rawPost(srv.base, `/v1/sessions/${ids[1]}/messages`, { input: 'and again' });
    assert.equal(r.status, 200, r.text);
    const s = await waitFor(srv.base, ids[1], ['completed']);
    const last = modelSteps(s).at(-1);
    assert.equal(last.kv_source, undefined, JSON.stringify(last));
    // The session's journal, written under the old fingerprint, is not used.
    assert.equal(last.cached_tokens, 0, JSON.stringify(last));
  } finally {
    await srv.stop();
  }
});

test('after SIGKILL a session resumes from its KV journal, on the same node or on another one', async () => {
  const dir = tempDir('armada-kill-kv-');
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 2 }));
  const args = (data) => ['--agents', agents, '--data-dir', data, '--tool-allow', '127.0.0.1', '-np', '2',
    '-c', '4096'];
  const data = path.join(dir, 'data');
  let srv = await startServer(args(data));
  let id;
  try {
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'first' });
    id = r.json.id;
    const s = await waitFor(srv.base, id, ['completed']);
    const steps = modelSteps(s).length;
    // Every model step was journaled (the writer runs just after each step's answer).
    const deadline = Date.now() + 10000;
    while (await metric(srv.base, 'armada_kv_journal_records_total') < steps && Date.now() < deadline) {
      await new Promise((res) => setTimeout(res, 50));
    }
    assert.ok(await metric(srv.base, 'armada_kv_journal_records_total') >= steps);
    // Later steps appended their new cells only: less than the sum of whole states was written.
    const mem = (await getJson(srv.base, `/v1/sessions/${id}`)).json.memory;
    assert.ok(await metric(srv.base, 'armada_kv_journal_bytes_total') < steps * mem.kv_bytes, JSON.stringify(mem));
  } finally {
    srv.proc.kill('SIGKILL');
    await new Promise((res) => srv.proc.exitCode !== null || srv.proc.signalCode ? res() : srv.proc.on('exit', res));
  }
  // Another node gets a copy of the store and the KV, as shared storage would give it.
  const other = path.join(dir, 'other');
  fs.cpSync(data, other, { recursive: true });
  for (const d of [data, other]) {
    srv = await startServer(args(d));
    try {
      const before = (await getJson(srv.base, `/v1/sessions/${id}`)).json;
      assert.equal(before.memory.kv_location, 'disk', JSON.stringify(before.memory));
      const r = await rawPost(srv.base, `/v1/sessions/${id}/messages`, { input: 'and once more' });
      assert.equal(r.status, 200, r.text);
      const s = await waitFor(srv.base, id, ['completed']);
      const last = modelSteps(s).at(-1);
      assert.equal(last.kv_source, 'journal', JSON.stringify(last));
      assert.ok(last.cached_tokens > 0);
      assert.equal(await metric(srv.base, 'armada_kv_restore_failures_total'), 0);
    } finally {
      srv.proc.kill('SIGKILL');
      await new Promise((res) => srv.proc.exitCode !== null || srv.proc.signalCode ? res() : srv.proc.on('exit', res));
    }
  }
});

test('the shared prefix is never shared across API keys', async () => {
  const dir = tempDir('armada-prefix-keys-');
  fs.writeFileSync(path.join(dir, 'keys'), 'sk-alice\nsk-bob\n');
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1 }));
  const srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow',
    '127.0.0.1', '-np', '2', '-c', '4096', '--api-key-file', path.join(dir, 'keys')]);
  const firstStep = async (key, input) => {
    const headers = { Authorization: `Bearer ${key}` };
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input }, headers);
    assert.equal(r.status, 200, r.text);
    const s = await waitFor(srv.base, r.json.id, ['completed'], { headers });
    return modelSteps(s)[0];
  };
  try {
    const a1 = await firstStep('sk-alice', 'one');
    assert.equal(a1.kv_source, undefined, JSON.stringify(a1));
    const a2 = await firstStep('sk-alice', 'two');
    assert.equal(a2.kv_source, 'prefix', JSON.stringify(a2));
    // Bob's first session computes the prefix again: Alice's cells would leak through timing.
    const b1 = await firstStep('sk-bob', 'three');
    assert.equal(b1.kv_source, undefined, JSON.stringify(b1));
    assert.equal(b1.cached_tokens ?? 0, 0, JSON.stringify(b1));
    const b2 = await firstStep('sk-bob', 'four');
    assert.equal(b2.kv_source, 'prefix', JSON.stringify(b2));
  } finally {
    await srv.stop();
  }
});
