// Crash test: 32 concurrent sessions of 3+ tool steps; the server is killed with SIGKILL at
// random moments at least 5 times and restarted on the same data dir. Every session must
// complete, each tool call must have had exactly one effect, and every log must be whole.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, rawPost } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { getJson, assertCompleteLog, waitFor } from './session_helpers.mjs';

const SESSIONS = 32;
const KILLS = 5;

test('32 sessions survive 5 SIGKILLs without losing or repeating a step', { timeout: 480000 }, async () => {
  const tools = await startToolServer({ minDelayMs: 50, maxDelayMs: 400 });
  const dir = tempDir('armada-crash-');
  const args = ['--agents', writeAgents(dir, agentYaml(tools.url)), '--data-dir', path.join(dir, 'data'),
    '--tool-allow', '127.0.0.1', '-np', '8', '-c', '16384'];
  let srv = await startServer(args);
  const ids = [];
  try {
    for (let i = 0; i < SESSIONS; i++) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `task ${i}` });
      assert.equal(r.status, 200, r.text);
      ids.push(r.json.id);
    }
    let kills = 0;
    let resumedTotal = 0;
    while (kills < KILLS) {
      await new Promise((r) => setTimeout(r, 200 + Math.random() * 1200));
      srv.proc.kill('SIGKILL');
      await new Promise((r) => srv.proc.on('exit', r));
      kills++;
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
      for (const st of s.steps.filter((x) => x.kind === 'tool_call')) keys.add(st.idempotency_key);
    }
    assert.equal(keys.size, SESSIONS * 3);
    for (const k of keys) assert.equal(tools.effects.get(k), 1, `effects for ${k}`);
    for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
    assert.deepEqual(tools.noKey, []);
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
      const dir = tempDir(`armada-boundary-${n}-`);
      const args = ['--agents', writeAgents(dir, agentYaml(tools.url, { toolSteps: 2 })), '--data-dir',
        path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '2'];
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
