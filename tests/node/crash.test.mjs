// Crash test: 32 concurrent sessions of an agent declared through the API (numeric schema
// keywords, so its reload is exact) run 3 tool steps each; the server is killed with SIGKILL at
// random moments at least 5 times and restarted on the same data dir. Every session must
// complete, each tool call must have had exactly one effect, no call that had finished was sent
// again, and every log must be whole.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, rawPost } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { richAgent, tempDir } from './agents.mjs';
import { getJson, assertCompleteLog, assertNoFinishedCallRepeated, waitFor } from './session_helpers.mjs';

const SESSIONS = 32;
const KILLS = 5;
const agent = (url, steps) => richAgent(url, 'worker').replace('min_tool_steps: 1', `min_tool_steps: ${steps}`)
  .replace('max_steps: 4', `max_steps: ${steps + 3}`);

test('32 sessions survive 5 SIGKILLs without losing or repeating a step', { timeout: 480000 }, async () => {
  const tools = await startToolServer({ minDelayMs: 50, maxDelayMs: 400 });
  const dir = tempDir('armada-crash-');
  const args = ['--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '8', '-c', '16384'];
  let srv = await startServer(args);
  const ids = [];
  const kills = [];
  try {
    const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: agent(tools.url, 3) });
    assert.equal(a.status, 200, await a.text());
    for (let i = 0; i < SESSIONS; i++) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `task ${i}` });
      assert.equal(r.status, 200, r.text);
      ids.push(r.json.id);
    }
    let resumedTotal = 0;
    while (kills.length < KILLS) {
      await new Promise((r) => setTimeout(r, 200 + Math.random() * 1200));
      srv.proc.kill('SIGKILL');
      await new Promise((r) => srv.proc.on('exit', r));
      kills.push(Date.now());
      srv = await startServer(args);
      const m = srv.stdout().match(/resumed (\d+) sessions/);
      resumedTotal += m ? Number(m[1]) : 0;
    }
    assert.ok(resumedTotal > 0, 'some sessions were resumed after a kill');

    const deadline = Date.now() + 300000;
    const done = new Map();
    while (done.size < ids.length) {
      for (const id of ids) {
        if (done.has(id)) continue;
        const r = await getJson(srv.base, `/v1/sessions/${id}`);
        assert.equal(r.status, 200, `session ${id} lost`);
        if (['completed', 'failed', 'cancelled'].includes(r.json.state)) done.set(id, r.json);
      }
      if (Date.now() > deadline) throw new Error(`only ${done.size} of ${ids.length} sessions ended`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const keys = new Set();
    for (const s of done.values()) {
      assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
      assertCompleteLog(s, 3);
      for (const st of s.steps.filter((x) => x.kind === 'tool_call')) {
        keys.add(st.idempotency_key);
        const args = JSON.parse(st.data.arguments);
        assert.ok([1, 2, 3].includes(args.count), st.data.arguments);
      }
    }
    assert.equal(keys.size, SESSIONS * 3);
    for (const k of keys) assert.equal(tools.effects.get(k), 1, `effects for ${k}`);
    for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
    assert.deepEqual(tools.noKey, []);
    assertNoFinishedCallRepeated(tools, done.values(), kills);
    console.log(`replays of calls outstanding at a kill: ${[...tools.replays.values()].reduce((a, b) => a + b, 0)}`);
  } finally {
    await srv.stop();
    await tools.close();
  }
});

test('a crash right after each checkpoint boundary, in turn, loses no acknowledged step', { timeout: 600000 }, async () => {
  const tools = await startToolServer();
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  let boundaries = 0;
  try {
    for (let n = 1; n < 60; n++) {
      tools.effects.clear();
      tools.replays.clear();
      tools.firstAt.clear();
      const dir = tempDir(`armada-boundary-${n}-`);
      const args = ['--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '2'];
      // The agent is declared through the API first, on a node without the crash hook.
      const setup = await startServer(args);
      const a = await fetch(`${setup.base}/v1/agents`, { method: 'POST', body: agent(tools.url, 2) });
      assert.equal(a.status, 200, await a.text());
      await setup.stop();
      let srv = await startServer(args, { env: { ARMADA_CRASH_AFTER_COMMITS: String(n) } });
      // The create may be the commit that crashes: then its answer never comes.
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'go' }).catch(() => null);
      let id = r && r.status === 200 ? r.json.id : null;
      let ended = false;
      for (let i = 0; i < 1200 && srv.proc.exitCode === null && srv.proc.signalCode === null; i++) {
        if (id) {
          const s = await getJson(srv.base, `/v1/sessions/${id}`).catch(() => null);
          if (s && s.json && ['completed', 'failed'].includes(s.json.state)) { ended = true; break; }
        }
        await sleep(50);
      }
      if (ended) {  // n is past the session's last commit: every boundary has been crashed at
        await srv.stop();
        break;
      }
      assert.match(srv.stderr(), /crashing after a commit/);
      const killedAt = Date.now();
      boundaries++;
      srv = await startServer(args);
      try {
        if (!id) {
          // The crash came before the create was acknowledged; the session was durable anyway and
          // resumes. Its id is the prefix of its tool calls' idempotency keys.
          for (let i = 0; i < 600 && tools.effects.size === 0; i++) await sleep(50);
          id = [...tools.effects.keys()][0]?.split(':')[0];
          if (!id) {
            assert.ok(n === 1, `no session after a crash at commit ${n}`);
            continue;
          }
        }
        const s = await waitFor(srv.base, id, ['completed', 'failed'], { timeoutMs: 120000 });
        assert.equal(s.state, 'completed', `crash at commit ${n}: ${s.reason}`);
        assertCompleteLog(s, 2);
        for (const [k, c] of tools.effects) assert.equal(c, 1, `crash at commit ${n}: key ${k} had ${c} effects`);
        assertNoFinishedCallRepeated(tools, [s], [killedAt]);
      } finally {
        await srv.stop();
      }
    }
    console.log(`crashed at each of ${boundaries} checkpoint boundaries`);
    assert.ok(boundaries >= 4, `only ${boundaries} boundaries crashed at`);
  } finally {
    await tools.close();
  }
});
