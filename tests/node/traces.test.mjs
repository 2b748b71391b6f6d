// Traces: an agent session's spans reach an OTLP/HTTP collector (a small one in this test) with
// the GenAI names, parents and attributes, and the W3C trace context flows from the client to the
// tools. With ARMADA_VIA_GATEWAY=1 the same session goes through a gateway and a cell brain, and
// their hops join the trace: client → gateway → place (brain) → invoke_agent (node).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, rawPost, createdStatus, viaGateway } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { waitFor } from './session_helpers.mjs';
import { assertLintedMetrics, metricSum } from './cluster_helpers.mjs';

let tools;
let otlp;
let srv;

const clientTrace = 'a1b2c3d4e5f60718293a4b5c6d7e8f90';

before(async () => {
  tools = await startToolServer();
  otlp = await startOtlpReceiver();
  const dir = tempDir('armada-traces-');
  const agents = writeAgents(dir, agentYaml(tools.url));
  srv = await startServer(['--agents', agents, '--data-dir', path.join(dir, 'data'), '--tool-allow', '127.0.0.1',
    '--log-level', 'debug'],
  { env: { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint, ARMADA_LOG_FORMAT: 'json' } });
});

after(async () => {
  if (srv) assert.equal(await srv.stop(), 0);
  if (tools) await tools.close();
  if (otlp) await otlp.close();
});

// Spans are exported in batches about once a second: wait until `pick` finds what it needs.
async function spansWhere(pick, what) {
  const deadline = Date.now() + 20000;
  for (;;) {
    const found = pick(otlp.spans);
    if (found) return found;
    if (Date.now() > deadline) {
      throw new Error(`no ${what} among ${otlp.spans.length} spans: ` +
        JSON.stringify(otlp.spans.map((s) => [s.name, s.service, s.attributes['gen_ai.conversation.id']])));
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

const conv = (s, id) => s.attributes['gen_ai.conversation.id'] === id;

test('a session turn is an invoke_agent span with a chat span per step and an execute_tool span per call', async () => {
  const parentSpan = '1122334455667788';
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'Process record alpha' },
    { traceparent: `00-${clientTrace}-${parentSpan}-01` });
  assert.equal(r.status, createdStatus, r.text);
  const id = r.json.id;
  const s = await waitFor(srv.base, id, ['completed', 'failed']);
  assert.equal(s.state, 'completed', s.reason);
  const outputs = s.steps.filter((x) => x.kind === 'model_output');
  const calls = s.steps.filter((x) => x.kind === 'tool_call');

  const turn = await spansWhere((all) => all.find((x) => x.name.startsWith('invoke_agent') && conv(x, id)),
    'invoke_agent span');
  assert.equal(turn.name, 'invoke_agent worker');
  assert.equal(turn.service, 'armada-node');
  assert.equal(turn.traceId, clientTrace);
  assert.equal(turn.attributes['gen_ai.operation.name'], 'invoke_agent');
  assert.equal(turn.attributes['gen_ai.agent.id'], 'worker');
  assert.equal(turn.attributes['gen_ai.usage.input_tokens'], s.usage.prompt_tokens);
  assert.equal(turn.attributes['gen_ai.usage.output_tokens'], s.usage.completion_tokens);
  assert.equal(turn.status?.code ?? 0, 0);
  assert.ok(BigInt(turn.endTimeUnixNano) > BigInt(turn.startTimeUnixNano));

  // The hops before the node: the client's span is the root of everything Armada did.
  if (viaGateway) {
    // Each process exports on its own timer: wait for the brain's and the gateway's batches.
    const place = await spansWhere((all) => all.find((x) => x.spanId === turn.parentSpanId), 'the turn\'s parent');
    assert.equal(place.name, 'place');
    assert.equal(place.service, 'armada-cell');
    assert.equal(place.attributes['armada.session.id'], id);
    assert.equal(place.traceId, clientTrace);
    const hop = await spansWhere((all) => all.find((x) => x.spanId === place.parentSpanId), 'the place span\'s parent');
    assert.equal(hop.service, 'armada-gateway');
    assert.equal(hop.name, 'POST /v1/agents/{id}/sessions');
    assert.equal(hop.kind, 2);  // server
    assert.equal(hop.parentSpanId, parentSpan);
    assert.equal(hop.attributes['http.response.status_code'], 201);
    assert.equal(hop.status?.code ?? 0, 0);
  } else {
    assert.equal(turn.parentSpanId, parentSpan);
  }

  const chats = await spansWhere((all) => {
    const c = all.filter((x) => x.name.startsWith('chat') && conv(x, id));
    return c.length >= outputs.length ? c : null;
  }, `${outputs.length} chat spans`);
  assert.equal(chats.length, outputs.length);
  for (const c of chats) {
    assert.equal(c.traceId, clientTrace);
    assert.equal(c.parentSpanId, turn.spanId);
    assert.equal(c.attributes['gen_ai.operation.name'], 'chat');
    assert.ok(c.attributes['gen_ai.request.model'], 'the model is named');
    assert.equal(c.name, `chat ${c.attributes['gen_ai.request.model']}`);
  }
  // Each step's tokens, as the session's log has them.
  const byStep = (list) => list.map((x) => x).sort((a, b) => a - b);
  assert.deepEqual(byStep(chats.map((c) => c.attributes['gen_ai.usage.input_tokens'])),
    byStep(outputs.map((o) => o.data.prompt_tokens)));
  assert.deepEqual(byStep(chats.map((c) => c.attributes['gen_ai.usage.output_tokens'])),
    byStep(outputs.map((o) => o.data.completion_tokens)));

  const toolSpans = await spansWhere((all) => {
    const t = all.filter((x) => x.name.startsWith('execute_tool') && conv(x, id));
    return t.length >= calls.length ? t : null;
  }, `${calls.length} execute_tool spans`);
  assert.equal(toolSpans.length, calls.length);
  for (const call of calls) {
    const sp = toolSpans.find((x) => x.attributes['gen_ai.tool.call.id'] === call.data.id);
    assert.ok(sp, `a span for call ${call.data.id}`);
    assert.equal(sp.name, `execute_tool ${call.data.name}`);
    assert.equal(sp.attributes['gen_ai.tool.name'], call.data.name);
    assert.equal(sp.parentSpanId, turn.spanId);
    assert.equal(sp.kind, 3);  // client
    // The tool received the call's own span as its parent.
    assert.equal(tools.traceparents.get(call.idempotency_key), `00-${clientTrace}-${sp.spanId}-01`);
  }

  // Log lines are JSON objects; those about this session name it and its trace.
  const raw = (srv.stdout() + '\n' + srv.stderr()).split('\n').filter((l) => l.trim() !== '');
  const lines = raw.map((l) => {
    try { return JSON.parse(l); } catch { return null; }
  }).filter((j) => j && j.msg !== undefined);
  // Every line the node wrote is one (through a gateway, `cluster up`'s own output is mixed in).
  const notJson = (l) => { try { JSON.parse(l); return false; } catch { return true; } };
  if (!viaGateway) assert.deepEqual(raw.filter(notJson), []);
  // Through a gateway, every line each process of the cluster (gateway, brains, node) wrote.
  if (viaGateway) {
    assert.ok(srv.processes.length >= 3, JSON.stringify(srv.processes.map((p) => p.name)));
    for (const p of srv.processes) {
      const own = fs.readFileSync(p.log, 'utf8').split('\n').filter((l) => l.trim() !== '');
      assert.ok(own.length > 0, `${p.name} logged`);
      assert.deepEqual(own.filter(notJson), [], `every line of ${p.name}'s log is JSON`);
    }
  }
  assert.ok(lines.length > 0, 'armada logs JSON lines');
  for (const j of lines) assert.match(j.ts, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  const about = lines.filter((j) => j.session_id === id);
  assert.ok(about.length > 0, 'a log line names the session');
  // The node's lines about the session's work carry the client's trace. (Through a gateway,
  // the gateway's lines about the test's own status polls carry those requests' traces.)
  assert.ok(about.some((j) => j.trace_id === clientTrace), JSON.stringify(about.slice(0, 5)));
  if (!viaGateway) for (const j of about) assert.equal(j.trace_id, clientTrace, JSON.stringify(j));
});

test('a later turn is a new invoke_agent span under the request that brought its message', async () => {
  const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'Process record beta' });
  assert.equal(r.status, createdStatus, r.text);
  const id = r.json.id;
  assert.equal((await waitFor(srv.base, id, ['completed', 'failed'])).state, 'completed');
  const first = await spansWhere((all) => all.find((x) => x.name.startsWith('invoke_agent') && conv(x, id)),
    'first turn');
  // No traceparent from the client: the trace starts at Armada.
  assert.notEqual(first.traceId, clientTrace);
  if (!viaGateway) assert.equal(first.parentSpanId ?? '', '');

  const trace2 = '0f0e0d0c0b0a09080706050403020100';
  const m = await rawPost(srv.base, `/v1/sessions/${id}/messages`, { input: 'Now summarise.' },
    { traceparent: `00-${trace2}-8877665544332211-01` });
  assert.equal(m.status, 200, m.text);
  await waitFor(srv.base, id, ['completed', 'failed']);
  const second = await spansWhere((all) => all.find((x) => x.name.startsWith('invoke_agent') && conv(x, id) &&
    x.traceId === trace2), 'second turn');
  assert.notEqual(second.spanId, first.spanId);
  if (viaGateway) {
    const hop = await spansWhere((all) => all.find((x) => x.spanId === second.parentSpanId), 'the gateway hop');
    assert.equal(hop.name, 'POST /v1/sessions/{id}/messages');
    assert.equal(hop.attributes['http.response.status_code'], 200);
    assert.equal(hop.parentSpanId, '8877665544332211');
  } else {
    assert.equal(second.parentSpanId, '8877665544332211');
  }
});

test('spans the collector refuses are dropped and counted; sessions go on', async () => {
  const metrics = async () => (await fetch(srv.metricsBase + '/metrics')).text();
  const before = metricSum(await metrics(), 'armada_trace_spans_dropped_total');
  // Through a gateway, its hop and the brain's are dropped and counted in their processes too.
  const others = viaGateway
    ? [['gateway', srv.base], ['cell brain', srv.processes.find((p) => p.role === 'cell').url]] : [];
  const dropped = async (base) => metricSum(await fetch(`${base}/metrics`).then((x) => x.text()),
    'armada_trace_spans_dropped_total');
  const othersBefore = await Promise.all(others.map(([, base]) => dropped(base)));
  otlp.state.refuse = true;
  try {
    const r = await rawPost(srv.base, '/v1/agents/worker/sessions', { input: 'Process record gamma' });
    assert.equal(r.status, createdStatus, r.text);
    assert.equal((await waitFor(srv.base, r.json.id, ['completed', 'failed'])).state, 'completed');
    const deadline = Date.now() + 20000;
    let text = await metrics();
    while (metricSum(text, 'armada_trace_spans_dropped_total') <= before && Date.now() < deadline) {
      await new Promise((res) => setTimeout(res, 200));
      text = await metrics();
    }
    assert.ok(otlp.state.refused > 0, 'the node tried to export');
    assert.ok(metricSum(text, 'armada_trace_spans_dropped_total') > before, 'dropped spans are counted');
    assert.ok(metricSum(text, 'armada_trace_spans_exported_total') > 0);
    await assertLintedMetrics(text, 'node /metrics with trace counters');
    for (const [i, [what, base]] of others.entries()) {
      const deadline2 = Date.now() + 20000;
      let n = await dropped(base);
      while (n <= othersBefore[i] && Date.now() < deadline2) {
        await new Promise((res) => setTimeout(res, 200));
        n = await dropped(base);
      }
      assert.ok(n > othersBefore[i], `the ${what} counts the spans it dropped (${othersBefore[i]} -> ${n})`);
    }
  } finally {
    otlp.state.refuse = false;
  }
  assert.equal(otlp.state.badBodies, 0, 'every export was valid JSON');
});

// A collector that is not there at all, and one that takes the connection and never answers: the
// node serves as before, counts the spans it could not send, and still stops promptly.
for (const how of ['refuses connections', 'never answers']) {
  test(`a collector that ${how}: sessions go on, spans are dropped and counted, the node stops promptly`, { skip: viaGateway }, async () => {
    const net = await import('node:net');
    const held = [];
    const sink = net.createServer((c) => { held.push(c); });  // accepts, reads nothing, says nothing
    await new Promise((r) => sink.listen(0, '127.0.0.1', r));
    const port = sink.address().port;
    if (how === 'refuses connections') await new Promise((r) => sink.close(r));
    const dir = tempDir('armada-traces-down-');
    const node = await startServer(['--agents', writeAgents(dir, agentYaml(tools.url)), '--data-dir', path.join(dir, 'data'),
      '--tool-allow', '127.0.0.1'], { env: { OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}` } });
    try {
      const r = await rawPost(node.base, '/v1/agents/worker/sessions', { input: 'Process record alpha' });
      assert.equal(r.status, createdStatus, r.text);
      assert.equal((await waitFor(node.base, r.json.id, ['completed', 'failed'])).state, 'completed');
      const dropped = async () => metricSum(await fetch(node.metricsBase + '/metrics').then((x) => x.text()),
        'armada_trace_spans_dropped_total');
      const deadline = Date.now() + 20000;
      while (await dropped() === 0 && Date.now() < deadline) await new Promise((res) => setTimeout(res, 200));
      assert.ok(await dropped() > 0, 'the spans that could not be sent are counted');
      if (how === 'never answers') assert.ok(held.length > 0, 'the node did connect to the collector');
    } finally {
      const t0 = Date.now();
      assert.equal(await node.stop(), 0);
      // At most one export in flight is waited for (2 s), however many spans are queued.
      assert.ok(Date.now() - t0 < 15000, `stopped after ${Date.now() - t0} ms`);
      for (const c of held) c.destroy();
      if (how === 'never answers') await new Promise((r) => sink.close(r));
    }
  });
}
