// Live migration against re-prefill, measured side by side in one run: a cell of two nodes
// (`armada cluster up`, the small model) runs sessions whose prompts hold about 512 to 4,096
// tokens. Each waits at its first tool call (the tool server holds it) while node 0 drains; then
// the calls return, and node 0's sessions move to node 1 between steps. ARMADA_KV_SEND_CUT=2
// breaks every other KV transfer off halfway, so half of them re-prefill from the transcript:
// sessions of the same sizes, moved at the same moment, to the same node.
//
//   ARMADA_BIN=build/armada ARMADA_MODEL_DIR=~/.cache/armada/models node bench/migration.mjs
//
// For each move: its KV (tokens, bytes), how long fetching and installing took, and the next
// model step on the new node (time to first token, tokens it computed).
import fs from 'node:fs';
import path from 'node:path';
import { startToolServer } from '../tests/node/tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from '../tests/node/agents.mjs';
import { clusterUp, sleep, waitFor } from '../tests/node/cluster_helpers.mjs';

const model = path.join(process.env.ARMADA_MODEL_DIR, process.env.MODEL ?? 'armada-small-q8_0.gguf');
const SIZES = (process.env.SIZES ?? '512,1024,2048,4096').split(',').map(Number);
const PER = Number(process.env.PER_SIZE ?? 4);
const tools = await startToolServer({ minDelayMs: 10, maxDelayMs: 20, hold: true });
const dir = tempDir('armada-migration-');
fs.chmodSync(dir, 0o755);
const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 1, maxSteps: 3, toolTimeoutMs: 600000 }));
const np = SIZES.length * PER;
const cluster = await clusterUp(['--nodes', '2', '--brains', '1', '-m', model, '--data-dir', path.join(dir, 'c'),
  '--port', '0', '--agents', agents, '--node-arg=--tool-allow', '--node-arg=127.0.0.1', `--node-arg=-np`,
  `--node-arg=${np}`, '--node-arg=-c', `--node-arg=${np * 5120}`, '--node-arg=--drain-timeout', '--node-arg=600'],
{ env: { ...process.env, ARMADA_KV_SEND_CUT: '2' }, timeoutMs: 300000 });
const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'c', 'cluster.json'), 'utf8'));
const get = async (route) => (await fetch(cluster.gw + route)).json();
try {
  await waitFor('two nodes', async () => (await fetch(cluster.gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes >= 2, 120000);
  // Words of the filler are about one token each with the Qwen2 tokenizer.
  const words = ['alpha', 'beta', 'gamma', 'delta', 'river', 'stone', 'cloud', 'green'];
  const ids = [];
  for (const n of SIZES) {
    for (let i = 0; i < PER; i++) {
      const input = `Record ${n}-${i}: ` + Array.from({ length: n }, (_, k) => words[(k * 7 + i) % words.length]).join(' ');
      const r = await fetch(`${cluster.gw}/v1/agents/worker/sessions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input }),
      });
      if (r.status !== 201) throw new Error(`create: ${r.status} ${await r.text()}`);
      ids.push({ id: (await r.json()).id, size: n });
    }
  }
  // Every session at its first tool call, held there.
  await waitFor('every first tool call', async () => {
    const n = ids.filter(({ id }) => [...tools.arrivals.keys()].some((k) => k.startsWith(`${id}:`))).length;
    return n === ids.length;
  }, 1800000);
  const node0 = status().processes.find((p) => p.role === 'node' && p.name.endsWith('node0'));
  process.kill(node0.pid, 'SIGTERM');
  await sleep(1000);
  tools.release();
  const done = new Map();
  await waitFor('every session', async () => {
    for (const { id } of ids) {
      if (done.has(id)) continue;
      const s = await get(`/v1/sessions/${id}`);
      if (['completed', 'failed', 'cancelled'].includes(s.state)) done.set(id, s);
    }
    return done.size === ids.length;
  }, 1800000);
  const rows = [];
  for (const { id, size } of ids) {
    const s = done.get(id);
    const m = (s.placement?.moves ?? [])[0];
    if (!m) continue;
    const at = s.steps.findIndex((x) => x.seq === m.seq);
    const prev = s.steps.slice(0, at).filter((x) => x.kind === 'model_output').at(-1);
    const next = s.steps.slice(at + 1).find((x) => x.kind === 'model_output');
    rows.push({ size, kv: m.kv_source, tokens: prev ? prev.data.prompt_tokens + prev.data.completion_tokens : 0,
      bytes: m.bytes, move_ms: m.ms, ttft_ms: next?.data.ttft_ms ?? NaN,
      computed: next ? next.data.prompt_tokens - next.data.cached_tokens : NaN, state: s.state });
  }
  console.log('| prompt words | KV tokens | how | journal MiB | fetch + install ms | next step: tokens computed | next step: time to first token ms |');
  console.log('|---|---|---|---|---|---|---|');
  rows.sort((a, b) => a.size - b.size || a.kv.localeCompare(b.kv));
  for (const r of rows)
    console.log(`| ${r.size} | ${r.tokens} | ${r.kv === 'transfer' ? 'KV moved' : 're-prefill'} | ` +
      `${r.kv === 'transfer' ? (r.bytes / 1048576).toFixed(1) : '-'} | ${r.move_ms} | ${r.computed} | ${Math.round(r.ttft_ms)} |`);
  const failed = [...done.values()].filter((s) => s.state !== 'completed').length;
  console.log(`${rows.length} sessions moved; ${failed} of ${ids.length} did not complete`);
} finally {
  await cluster.stop();
  await tools.close();
}
