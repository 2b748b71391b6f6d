// Live migration of sessions with a large KV (the small model, about 4K tokens each), one of them
// with its transfer cut halfway. A cell of two nodes: two sessions on node0 each take a turn with
// a prompt of about 4,000 words and stop at their first tool call, which the tool server holds.
// node0 gets SIGTERM (it drains); the calls are released; each session checkpoints its result
// and moves to node1 between steps. ARMADA_KV_SEND_CUT=2 breaks node0's second transfer off
// halfway: that session re-prefills from its transcript; the other resumes from its moved KV.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog } from './session_helpers.mjs';
import { clusterUp, waitFor } from './cluster_helpers.mjs';

const SLOW = process.env.ARMADA_TIMING === '0' ? 4 : 1;
const WORDS = 4000;
const smallModel = path.join(process.env.ARMADA_MODEL_DIR ?? '', 'armada-small-q8_0.gguf');
let tools;
let dir;
let cluster;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const node = (suffix) => status().processes.find((p) => p.role === 'node' && p.name.endsWith(suffix));
const session = async (id) => (await fetch(`${cluster.gw}/v1/sessions/${id}`)).json();

before(async () => {
  tools = await startToolServer({ minDelayMs: 10, maxDelayMs: 20, hold: true });
  const root = tempDir('armada-migration-');
  fs.chmodSync(root, 0o755);
  dir = path.join(root, 'c');
  const agents = writeAgents(root, agentYaml(tools.url, { toolSteps: 1, maxSteps: 3, toolTimeoutMs: Math.min(600000, 300000 * SLOW) }));
  cluster = await clusterUp(['--nodes', '2', '--brains', '1', '-m', smallModel, '--data-dir', dir, '--port', '0',
    '--agents', agents, '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np', '--node-arg=4',
    '--node-arg=-c', '--node-arg=20480', '--node-arg=--drain-timeout', `--node-arg=${300 * SLOW}`],
  { env: { ...process.env, ARMADA_KV_SEND_CUT: '2' }, timeoutMs: 180000 * SLOW });
  await waitFor('two nodes', async () => (await fetch(cluster.gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes >= 2,
    120000 * SLOW);
});

after(async () => {
  if (cluster) await cluster.stop();
  if (tools) await tools.close();
});

test('sessions with 4K tokens of KV move with it; a transfer cut halfway re-prefills; both complete', { timeout: 500000 * SLOW }, async () => {
  // Idle sessions until two are on node0 (the brain spreads them by room).
  const n0 = node('node0').name;
  const mine = [];
  for (let i = 0; i < 8 && mine.length < 2; i++) {
    const r = await fetch(`${cluster.gw}/v1/agents/worker/sessions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}',
    });
    const text = await r.text();
    assert.equal(r.status, 201, text);
    const { id } = JSON.parse(text);
    const s = await waitFor(`session ${id} placed`, async () => {
      const x = await session(id);
      return x.state === 'waiting_input' && x.placement?.node && x;
    }, 60000 * SLOW);
    if (s.placement.node === n0) mine.push(id);
  }
  assert.equal(mine.length, 2, 'two sessions on node0');
  // Each takes a turn with a long prompt (the filler's words are about a token each).
  const words = ['alpha', 'beta', 'gamma', 'delta', 'river', 'stone', 'cloud', 'green'];
  for (const [i, id] of mine.entries()) {
    const content = `Record ${i}: ` + Array.from({ length: WORDS }, (_, k) => words[(k * 7 + i) % words.length]).join(' ');
    const r = await fetch(`${cluster.gw}/v1/sessions/${id}/messages`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ content }),
    });
    assert.equal(r.status, 200, await r.text());
  }
  await waitFor('both first tool calls, held', async () =>
    mine.every((id) => [...tools.arrivals.keys()].some((k) => k.startsWith(`${id}:`))), 600000 * SLOW);
  // node0 drains: unready at once; then the calls return, and each session moves between steps.
  const victim = node('node0');
  process.kill(victim.pid, 'SIGTERM');
  await waitFor('node0 to say it drains', async () =>
    (await fetch(`${victim.url}/readyz`).then((r) => r.status).catch(() => 0)) === 503, 30000 * SLOW);
  tools.release();
  const done = new Map();
  await waitFor('both sessions to end', async () => {
    for (const id of mine) {
      if (done.has(id)) continue;
      const s = await session(id);
      if (['completed', 'failed', 'cancelled'].includes(s.state)) done.set(id, s);
    }
    return done.size === mine.length;
  }, 600000 * SLOW);
  const how = {};
  for (const [id, s] of done) {
    assert.equal(s.state, 'completed', `${id}: ${s.reason}`);
    assertCompleteLog(s, 1);
    assert.notEqual(s.placement.node, n0, id);
    const moves = s.placement.moves.filter((m) => m.from === n0);
    assert.equal(moves.length, 1, `${id} moved once: ${JSON.stringify(s.placement.moves)}`);
    const m = moves[0];
    const at = s.steps.findIndex((x) => x.seq === m.seq);
    assert.equal(s.steps[at].kind, 'moved', id);
    const before = s.steps.slice(0, at).filter((x) => x.kind === 'model_output').at(-1);
    const next = s.steps.slice(at + 1).find((x) => x.kind === 'model_output');
    const kvTokens = before.data.prompt_tokens + before.data.completion_tokens;
    assert.ok(kvTokens > WORDS, `${id}: its KV held ${kvTokens} tokens`);
    const computed = next.data.prompt_tokens - next.data.cached_tokens;
    if (m.kv_source === 'transfer') {
      // The journal came whole (about 6 KiB a token for this model) and the next step computed
      // only what came after it: the tool result and the template around it.
      assert.ok(m.bytes > 16 << 20, `${id}: ${m.bytes} bytes moved`);
      // (The KV ends where the re-rendered transcript first differs from what was generated, a
      // little before the previous step's last token.)
      assert.ok(m.tokens > WORDS, `${id}: ${m.tokens} of ${kvTokens} tokens installed`);
      assert.ok(next.data.cached_tokens > WORDS && computed < 300,
        `${id}: next step cached ${next.data.cached_tokens}, computed ${computed}`);
    } else {
      // Cut halfway: the new node noticed, and the session re-prefilled from its transcript.
      assert.equal(m.kv_source, 'none', JSON.stringify(m));
      // (The sender closes the connection halfway: the body breaks off, or ends short.)
      assert.match(m.error, /^fetching it from \S+: (the transfer broke off after \d+ bytes|the transfer ended early|\d+ of \d+ bytes came)/,
        JSON.stringify(m));
      assert.ok(computed > WORDS / 2, `${id}: re-prefill computed ${computed} tokens`);
    }
    how[m.kv_source] = (how[m.kv_source] ?? 0) + 1;
  }
  assert.deepEqual(how, { transfer: 1, none: 1 }, 'one moved with its KV, one cut halfway');
  // Each tool call had one effect and none was sent twice: the calls ended before the moves.
  for (const id of mine) {
    const keys = [...tools.effects.keys()].filter((k) => k.startsWith(`${id}:`));
    assert.ok(keys.length >= 1, id);
    for (const k of keys) assert.equal(tools.effects.get(k), 1, k);
    for (const k of keys) assert.ok(!tools.replays.has(k), `${k} was sent again`);
  }
});
