// The node's life under Kubernetes conventions: probes, a SIGTERM drain that finishes running
// work and exits 0, event ids that survive a crash, retention, and metrics that a restart does
// not reset.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { startServer, rawPost } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, richAgent, tempDir, writeAgents } from './agents.mjs';
import { getJson, waitFor, assertCompleteLog, assertNoFinishedCallRepeated } from './session_helpers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const exited = (proc) => new Promise((r) => {
  if (proc.exitCode !== null || proc.signalCode !== null) r({ code: proc.exitCode, signal: proc.signalCode });
  else proc.on('exit', (code, signal) => r({ code, signal }));
});

// Reads an SSE stream until `stop(event)` or the stream ends; returns the events.
async function sse(url, headers, stop = () => false) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), 120000);
  const events = [];
  let buf = '';
  try {
    const res = await fetch(url, { headers, signal: ctl.signal });
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = {};
        for (const line of buf.slice(0, at).split('\n')) {
          const i = line.indexOf(': ');
          ev[line.slice(0, i)] = line.slice(i + 2);
        }
        buf = buf.slice(at + 2);
        events.push(ev);
        if (stop(ev)) { ctl.abort(); return events; }
      }
    }
  } catch { /* aborted */ } finally { clearTimeout(timer); }
  return events;
}
const ended = (e) => e.event === 'state' && ['completed', 'failed', 'cancelled'].includes(JSON.parse(e.data).state);
const stored = new Set(['message', 'tool_call', 'tool_result', 'state']);

test('probes: /livez and /readyz answer without a key', async () => {
  const dir = tempDir('armada-probes-');
  const srv = await startServer(['--api-key', 'sk-x', '--data-dir', path.join(dir, 'data')]);
  try {
    for (const p of ['/livez', '/readyz', '/health']) {
      const r = await fetch(srv.base + p);
      assert.equal(r.status, 200, p);
    }
    assert.deepEqual(await (await fetch(srv.base + '/readyz')).json(), { status: 'ready' });
    assert.deepEqual(await (await fetch(srv.base + '/livez')).json(), { status: 'alive' });
    assert.equal((await fetch(srv.base + '/v1/models')).status, 401);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('POST /admin/drain drains a node at an admin key\'s word; with nothing running it stops at once, exit 0', async () => {
  const dir = tempDir('armada-http-drain-');
  const srv = await startServer(['--api-key', 'sk-x', '--data-dir', path.join(dir, 'data')]);
  try {
    assert.equal((await fetch(srv.base + '/admin/drain', { method: 'POST' })).status, 401);
    const exited = new Promise((res) => srv.proc.on('exit', (code) => res(code)));
    const r = await fetch(srv.base + '/admin/drain', { method: 'POST', headers: { Authorization: 'Bearer sk-x' } });
    assert.equal(r.status, 202);
    assert.deepEqual(await r.json(), { status: 'draining', already: false });
    assert.equal(await exited, 0);
    assert.match(srv.stdout(), /drained; stopping/);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('SIGTERM drains: streams finish, the node exits 0, every session completes after a restart with no tool call sent twice',
  { timeout: 600000 }, async () => {
    const tools = await startToolServer({ minDelayMs: 300, maxDelayMs: 900 });
    const dir = tempDir('armada-drain-');
    const args = ['--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-np', '8', '-c', '16384',
      '--drain-timeout', '120'];
    let srv = await startServer(args);
    try {
      const a = await fetch(`${srv.base}/v1/agents`, { method: 'POST', body: richAgent(tools.url).replace('min_tool_steps: 1', 'min_tool_steps: 3').replace('max_steps: 4', 'max_steps: 6') });
      assert.equal(a.status, 200, await a.text());
      const ids = [];
      for (let i = 0; i < 32; i++) {
        const r = await rawPost(srv.base, '/v1/agents/rich/sessions', { input: `task ${i}` });
        assert.equal(r.status, 200, r.text);
        ids.push(r.json.id);
      }
      // Eight streaming chats, each seen streaming before the signal.
      const chats = [];
      const started = [];
      for (let i = 0; i < 8; i++) {
        let first;
        started.push(new Promise((r) => { first = r; }));
        chats.push((async () => {
          const res = await fetch(srv.base + '/v1/chat/completions', {
            method: 'POST', headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ messages: [{ role: 'user', content: `story ${i}` }], max_tokens: 160, stream: true, temperature: 1 }),
          });
          const reader = res.body.getReader();
          const dec = new TextDecoder();
          let text = '';
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            text += dec.decode(value, { stream: true });
            if (text.includes('data: ')) first();
          }
          return { status: res.status, text };
        })());
      }
      await Promise.all(started);
      // Some sessions are between steps, some wait on their tools.
      for (let i = 0; i < 500 && tools.inFlight() === 0; i++) await sleep(10);
      const t0 = Date.now();
      srv.proc.kill('SIGTERM');
      const callsInFlight = tools.inFlight();
      assert.ok(callsInFlight > 0, 'tool calls were in flight at the signal');
      // Not ready at once; new work is refused with 503 and Retry-After while streams still run.
      let ready = 200;
      for (let i = 0; i < 100 && ready === 200; i++) {
        ready = (await fetch(srv.base + '/readyz').catch(() => ({ status: 0 }))).status;
        if (ready === 200) await sleep(10);
      }
      assert.equal(ready, 503, 'readiness turned 503');
      const refused = await rawPost(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }] });
      assert.equal(refused.status, 503, refused.text);
      assert.ok(Number(refused.headers.get('retry-after')) > 0);
      const newSession = await rawPost(srv.base, '/v1/agents/rich/sessions', { input: 'late' });
      assert.equal(newSession.status, 503);
      assert.equal((await fetch(srv.base + '/livez')).status, 200, 'alive while draining');
      // The streams finish whole.
      const done = await Promise.all(chats);
      for (const c of done) {
        assert.equal(c.status, 200);
        assert.match(c.text, /"finish_reason":"(stop|length)"/);
        assert.match(c.text, /data: \[DONE\]/);
      }
      const { code } = await exited(srv.proc);
      assert.equal(code, 0, srv.stderr().slice(-2000));
      assert.ok(Date.now() - t0 < 120000, 'before the deadline');
      assert.match(srv.stdout(), /drained; stopping/);

      srv = await startServer(args);
      for (const id of ids) {
        const s = await waitFor(srv.base, id, ['completed', 'failed'], { timeoutMs: 240000 });
        assert.equal(s.state, 'completed', `${id}: ${s.reason}`);
        assertCompleteLog(s, 3);
      }
      // Every call had one effect, and no finished call was sent again: nothing was in flight
      // when the drained node stopped.
      for (const [k, n] of tools.effects) assert.equal(n, 1, `key ${k} had ${n} effects`);
      assert.equal(tools.effects.size, 32 * 3);
      assert.deepEqual([...tools.replays.entries()], [], 'no tool call was sent again');
    } finally {
      await srv.stop();
      await tools.close();
    }
  });

test('a second SIGTERM, or the drain deadline, stops at once; the next start resumes the rest', { timeout: 300000 }, async () => {
  // Tool calls of 2 to 3 s hold the drain open longer than the 1 s deadline.
  const tools = await startToolServer({ minDelayMs: 2000, maxDelayMs: 3000 });
  const dir = tempDir('armada-stop-');
  // A call's own timeout (and its retry under the same key) stays well clear of the tools'
  // 2 to 3 s, so the only repeats are the calls the stop cut off.
  const agents = () => writeAgents(dir, agentYaml(tools.url, { toolTimeoutMs: 10000 }));
  try {
    for (const how of ['second signal', 'deadline']) {
      for (const m of [tools.effects, tools.replays, tools.firstAt]) m.clear();
      const args = ['--agents', agents(), '--data-dir', path.join(dir, how.replace(' ', '-')),
        '--tool-allow', '127.0.0.1', '-c', '8192', '--drain-timeout', how === 'deadline' ? '1' : '120'];
      let srv = await startServer(args);
      try {
        const ids = [];
        for (let i = 0; i < 4; i++) ids.push((await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `t${i}` })).json.id);
        for (let i = 0; i < 1000 && tools.inFlight() === 0; i++) await sleep(10);
        assert.ok(tools.inFlight() > 0, 'tool calls are running');
        const t0 = Date.now();
        srv.proc.kill('SIGTERM');
        if (how === 'second signal') {
          for (let i = 0; i < 200 && (await fetch(srv.base + '/readyz').then((r) => r.status).catch(() => 0)) === 200; i++) await sleep(10);
          srv.proc.kill('SIGTERM');
        }
        const { code } = await exited(srv.proc);
        const stoppedAt = Date.now();
        const took = stoppedAt - t0;
        assert.equal(code, 1, `${how}: the stop is not a finished drain`);
        assert.ok(took < (how === 'deadline' ? 10000 : 5000), `${how}: stopped after ${took} ms`);
        assert.match(srv.stdout(), how === 'deadline' ? /stopping before the drain finished \(deadline\)/ : /stopping before the drain finished \(second signal\)/);
        srv = await startServer(args);
        const done = [];
        for (const id of ids) {
          const s = await waitFor(srv.base, id, ['completed', 'failed'], { timeoutMs: 120000 });
          assert.equal(s.state, 'completed', `${how}: ${s.reason}`);
          assertCompleteLog(s, 3);
          done.push(s);
        }
        // Only the calls cut off by the stop went out again.
        assertNoFinishedCallRepeated(tools, done, [stoppedAt]);
      } finally {
        await srv.stop();
      }
    }
  } finally {
    await tools.close();  // a failure above must not leave the file waiting on the server
  }
});

test('a session mid-run at a crash: its stream resumes by id and goes on to the end', { timeout: 300000 }, async () => {
  const tools = await startToolServer({ minDelayMs: 400, maxDelayMs: 800 });
  const dir = tempDir('armada-midrun-');
  const args = ['--agents', writeAgents(dir, agentYaml(tools.url)), '--data-dir', path.join(dir, 'data'),
    '--tool-allow', '127.0.0.1', '-c', '8192'];
  let srv = await startServer(args);
  try {
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'go' });
    // Follow it until its first tool result, then crash the node.
    const before = await sse(`${srv.base}/v1/sessions/${r.json.id}/events`, {}, (e) => e.event === 'tool_result');
    srv.proc.kill('SIGKILL');
    await exited(srv.proc);
    srv = await startServer(args);
    const storedBefore = before.filter((e) => stored.has(e.event));
    const last = storedBefore.at(-1).id;
    // From the last event seen: nothing seen is sent again, and the rest arrives to the end.
    const rest = await sse(`${srv.base}/v1/sessions/${r.json.id}/events`, { 'Last-Event-ID': last }, ended);
    const restStored = rest.filter((e) => stored.has(e.event));
    assert.ok(restStored.every((e) => Number(e.id) > Number(last)), JSON.stringify(restStored.map((e) => e.id)));
    assert.equal(JSON.parse(restStored.at(-1).data).state, 'completed');
    // And the whole stream now: what was seen before the crash, with the same ids, then the rest.
    const all = (await sse(`${srv.base}/v1/sessions/${r.json.id}/events`, {}, ended)).filter((e) => stored.has(e.event));
    assert.deepEqual(all.slice(0, storedBefore.length).map((e) => [e.id, e.event, e.data]),
      storedBefore.map((e) => [e.id, e.event, e.data]));
    assert.deepEqual(all.slice(storedBefore.length).map((e) => e.id), restStored.map((e) => e.id));
  } finally {
    await srv.stop();
    await tools.close();
  }
});

test('event ids come from the step log: after a crash every stored event returns with its id', { timeout: 300000 }, async () => {
  const tools = await startToolServer();
  const dir = tempDir('armada-events-');
  const args = ['--agents', writeAgents(dir, agentYaml(tools.url)), '--data-dir', path.join(dir, 'data'),
    '--tool-allow', '127.0.0.1', '-c', '8192'];
  let srv = await startServer(args);
  try {
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'go' });
    const url = `${srv.base}/v1/sessions/${r.json.id}/events`;
    const live = await sse(url, {}, ended);
    const before = live.filter((e) => stored.has(e.event)).map((e) => [e.id, e.event, e.data]);
    assert.ok(before.length >= 10, JSON.stringify(before).slice(0, 300));
    srv.proc.kill('SIGKILL');
    await exited(srv.proc);
    srv = await startServer(args);
    const url2 = `${srv.base}/v1/sessions/${r.json.id}/events`;
    const all = await sse(url2, {}, ended);
    assert.deepEqual(all.map((e) => [e.id, e.event, e.data]), before);
    const mid = before[4][0];
    const rest = await sse(url2, { 'Last-Event-ID': mid }, ended);
    assert.deepEqual(rest.map((e) => [e.id, e.event, e.data]), before.slice(5));
  } finally {
    await srv.stop();
    await tools.close();
  }
});

test('ended sessions and stored responses expire after --session-ttl; open ones stay', { timeout: 120000 }, async () => {
  const tools = await startToolServer();
  const dir = tempDir('armada-ttl-');
  const srv = await startServer(['--agents', writeAgents(dir, agentYaml(tools.url, { toolSteps: 1 })), '--data-dir',
    path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-c', '8192', '--session-ttl', '3s']);
  try {
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'go' });
    await waitFor(srv.base, r.json.id, ['completed']);
    const waiting = await rawPost(srv.base, '/v1/agents/worker/sessions', {});
    const resp = await rawPost(srv.base, '/v1/responses', { input: 'x', max_output_tokens: 2 });
    assert.equal(resp.status, 200);
    const gone = async (route) => {
      for (let i = 0; i < 150; i++) {
        if ((await getJson(srv.base, route)).status === 404) return true;
        await sleep(100);
      }
      return false;
    };
    assert.ok(await gone(`/v1/sessions/${r.json.id}`), 'the ended session was deleted');
    assert.ok(await gone(`/v1/responses/${resp.json.id}`), 'the stored response was deleted');
    const w = await getJson(srv.base, `/v1/sessions/${waiting.json.id}`);
    assert.equal(w.status, 200, 'an open session is never expired');
    assert.equal(w.json.state, 'waiting_input');
    const m = await (await fetch(srv.base + '/metrics')).text();
    assert.match(m, /^armada_sessions_expired_total [2-9]/m);
  } finally {
    await srv.stop();
    await tools.close();
  }
});

test('live sessions by state, and chain survival without client cancels, over a window a restart keeps', { timeout: 300000 }, async () => {
  const tools = await startToolServer();
  const dir = tempDir('armada-survival-');
  const extra = `  - id: slowpoke
    min_tool_steps: 1
    answer_without_tools: true
    limits: { max_steps: 3, max_tokens_per_step: 64 }
    tools:
      - name: wait
        url: ${tools.url}/slow
        timeout_ms: 10000
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
  - id: short
    min_tool_steps: 3
    limits: { max_steps: 1, max_tokens_per_step: 64 }
    tools:
      - name: lookup
        url: ${tools.url}/lookup
        parameters: { type: object, properties: { q: { type: boolean } }, required: [q] }
`;
  const args = ['--agents', writeAgents(dir, agentYaml(tools.url, { toolSteps: 1, extra })), '--data-dir',
    path.join(dir, 'data'), '--tool-allow', '127.0.0.1', '-c', '8192'];
  let srv = await startServer(args);
  const metric = async (name) => {
    const t = await (await fetch(srv.base + '/metrics')).text();
    const m = t.match(new RegExp(`^${name.replace(/[{}"]/g, (c) => '\\' + c)} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : undefined;
  };
  try {
    for (let i = 0; i < 2; i++) {
      const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: `ok ${i}` });
      assert.equal((await waitFor(srv.base, r.json.id, ['completed', 'failed'])).state, 'completed');
    }
    const f = await rawPost(srv.base, '/v1/agents/short/sessions', { input: 'x' });
    assert.equal((await waitFor(srv.base, f.json.id, ['completed', 'failed'])).state, 'failed');
    const c = await rawPost(srv.base, '/v1/agents/slowpoke/sessions', { input: 'x' });
    await waitFor(srv.base, c.json.id, ['waiting_tool']);
    assert.equal(await metric('armada_sessions_live{state="waiting_tool"}'), 1);
    assert.equal((await rawPost(srv.base, `/v1/sessions/${c.json.id}/cancel`, {})).status, 200);
    await waitFor(srv.base, c.json.id, ['cancelled']);
    const idle = await rawPost(srv.base, '/v1/agents/worker/sessions', {});
    assert.equal(idle.status, 200);
    assert.equal(await metric('armada_sessions_live{state="waiting_input"}'), 1);
    assert.equal(await metric('armada_sessions_live{state="waiting_tool"}'), 0);
    const check = async () => {
      assert.equal(await metric('armada_sessions_ended_window{outcome="completed"}'), 2);
      assert.equal(await metric('armada_sessions_ended_window{outcome="failed"}'), 1);
      assert.equal(await metric('armada_sessions_ended_window{outcome="cancelled"}'), 1);
      // 2 completed of 3 that the node decided: the client's cancel is on neither side.
      const ratio = await metric('armada_chain_survival_ratio');
      assert.ok(Math.abs(ratio - 2 / 3) < 1e-6, `ratio ${ratio}`);
    };
    await check();
    await srv.stop();
    srv = await startServer(args);
    await check();
    // Only the open session is in memory after the restart, not the four that ended.
    assert.equal(await metric('armada_sessions_in_memory'), 1);
    assert.equal(await metric('armada_sessions_live{state="waiting_input"}'), 1);
    // An ended session is still there when asked for.
    assert.equal((await getJson(srv.base, `/v1/sessions/${f.json.id}`)).json.state, 'failed');
  } finally {
    await srv.stop();
    await tools.close();
  }
});
