// Agent tools imported from the real MCP reference server (@modelcontextprotocol/server-everything)
// over Streamable HTTP.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { startServer, rawPost } from './harness.mjs';
import { tempDir, writeAgents } from './agents.mjs';
import { getJson, waitFor } from './session_helpers.mjs';
import { startRecordingProxy } from './mcp_peer.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';
import { waitFor as until } from './cluster_helpers.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const everything = path.join(here, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function startEverything(port) {
  const proc = spawn(process.execPath, [everything, 'streamableHttp'], {
    env: { ...process.env, PORT: String(port) }, stdio: ['ignore', 'ignore', 'pipe'],
  });
  await new Promise((resolve, reject) => {
    let err = '';
    const timer = setTimeout(() => reject(new Error('MCP server did not start: ' + err)), 20000);
    proc.stderr.on('data', (d) => {
      err += d;
      if (err.includes('listening on port')) { clearTimeout(timer); resolve(); }
    });
  });
  return proc;
}

test('MCP tools are imported, called, and survive a server restart', { timeout: 300000 }, async () => {
  const port = await freePort();
  let mcp = await startEverything(port);
  // The agent reaches the server through a proxy that records each request's trace context.
  const proxy = await startRecordingProxy(port, ['traceparent']);
  const otlp = await startOtlpReceiver();
  const dir = tempDir('armada-mcp-');
  const yaml = `agents:
  - id: mcpworker
    min_tool_steps: 2
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.5, seed: 5 }
    limits: { max_steps: 5, max_tokens_per_step: 96 }
    tools:
      - mcp:
          url: ${proxy.url}
          allowed_tools: [get-sum]
`;
  let srv;
  try {
    srv = await startServer(['--agents', writeAgents(dir, yaml), '--data-dir', path.join(dir, 'data'),
      '--tool-allow', '127.0.0.1', '-c', '8192'], { env: { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint } });
    const agents = await getJson(srv.base, '/v1/agents');
    assert.deepEqual(agents.json.data.find((a) => a.id === 'mcpworker').tools, ['get-sum']);

    const run = async (headers = {}) => {
      const r = await rawPost(srv.base, '/v1/agents/mcpworker/sessions', { input: 'add numbers' }, headers);
      assert.equal(r.status, 200, r.text);
      const s = await waitFor(srv.base, r.json.id, ['completed', 'failed']);
      assert.equal(s.state, 'completed', s.reason);
      const results = s.steps.filter((x) => x.kind === 'tool_result');
      assert.equal(results.length, 2);
      for (const res of results) {
        assert.equal(res.data.is_error, false, res.data.content);
        assert.match(res.data.content, /^The sum of -?[\d.e+-]+ and -?[\d.e+-]+ is -?[\d.e+-]+\.$/);
      }
    };
    // The client's trace goes on to the MCP server: each tools/call carries the context of the
    // call's own execute_tool span, a child in the client's trace.
    const trace = '5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d';
    const clientSpan = '0102030405060708';
    await run({ traceparent: `00-${trace}-${clientSpan}-01` });
    const sent = proxy.log.filter((e) => e.method === 'tools/call');
    assert.equal(sent.length, 2, JSON.stringify(proxy.log));
    for (const e of sent) assert.match(e.traceparent ?? '', new RegExp(`^00-${trace}-[0-9a-f]{16}-01$`));
    const spans = sent.map((e) => e.traceparent.split('-')[2]);
    assert.equal(new Set([...spans, clientSpan]).size, 3, 'one span per call, neither the client\'s own');
    // Those are the execute_tool spans the node exported, as MCP (`extension`) tools.
    const exported = (ids) =>
      until('the execute_tool spans', () => {
        const got = ids.map((id) => otlp.spans.find((x) => x.spanId === id));
        return got.every(Boolean) && got;
      }, 10000);
    for (const sp of await exported(spans)) {
      assert.equal(sp.name, 'execute_tool get-sum');
      assert.equal(sp.traceId, trace);
      assert.equal(sp.attributes['gen_ai.tool.type'], 'extension');
    }
    // A restarted server has forgotten the MCP session; the client initializes again.
    mcp.kill('SIGTERM');
    await new Promise((r) => mcp.on('exit', r));
    mcp = await startEverything(port);
    await run();

    // The Responses API runs {"type":"mcp"} tools on the server, with the official client.
    // Through the recording proxy, in a trace of the client's: each call is an execute_tool
    // span, a child of the client's span, and the MCP server gets its context.
    const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0 });
    const trace2 = '0f1e2d3c4b5a69788796a5b4c3d2e1f0';
    const before = proxy.log.length;
    const resp = await client.responses.create({
      model: 'x', input: 'Add two numbers', max_output_tokens: 96, parallel_tool_calls: false,
      tools: [{ type: 'mcp', server_label: 'everything', server_url: proxy.url,
        allowed_tools: ['get-sum'], require_approval: 'never' }],
      tool_choice: 'required',
    }, { headers: { traceparent: `00-${trace2}-${clientSpan}-01` } });
    assert.equal(resp.output[0].type, 'mcp_list_tools');
    assert.deepEqual(resp.output[0].tools.map((t) => t.name), ['get-sum']);
    const calls = resp.output.filter((o) => o.type === 'mcp_call');
    assert.ok(calls.length >= 1, JSON.stringify(resp.output).slice(0, 400));
    for (const c of calls) {
      assert.equal(c.server_label, 'everything');
      assert.equal(c.error, null);
      assert.match(c.output, /^The sum of /);
    }
    assert.ok(['message', 'mcp_call'].includes(resp.output.at(-1).type));
    const sent2 = proxy.log.slice(before).filter((e) => e.method === 'tools/call');
    assert.equal(sent2.length, calls.length, JSON.stringify(proxy.log.slice(before)));
    for (const e of sent2) assert.match(e.traceparent ?? '', new RegExp(`^00-${trace2}-[0-9a-f]{16}-01$`));
    for (const sp of await exported(sent2.map((e) => e.traceparent.split('-')[2]))) {
      assert.equal(sp.name, 'execute_tool get-sum');
      assert.equal(sp.traceId, trace2);
      assert.equal(sp.parentSpanId, clientSpan);
      assert.equal(sp.attributes['armada.mcp.server'], 'everything');
    }

    // Streamed, each item's output_index is its place in the final output (a message comes
    // after the MCP items; it was announced at index 0).
    const stream = await client.responses.create({
      model: 'x', input: 'Add two numbers', max_output_tokens: 96, parallel_tool_calls: false, stream: true,
      tools: [{ type: 'mcp', server_label: 'everything', server_url: proxy.url,
        allowed_tools: ['get-sum'], require_approval: 'never' }],
      tool_choice: 'required',
    });
    const announced = [];
    let final = null;
    for await (const ev of stream) {
      if (ev.type === 'response.output_item.added' || ev.type === 'response.output_item.done') announced.push([ev.output_index, ev.item.id, ev.type]);
      if (ev.type === 'response.content_part.added' || ev.type === 'response.output_text.delta') announced.push([ev.output_index, ev.item_id, ev.type]);
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
    }
    assert.ok(final, 'the stream did not end with the response');
    assert.ok(final.output.length >= 2, JSON.stringify(final.output).slice(0, 400));
    for (const [index, id, type] of announced) {
      assert.equal(final.output[index]?.id, id, `${type} of ${id} at output_index ${index}: ${JSON.stringify(final.output.map((o) => o.id))}`);
    }
    assert.ok(announced.length >= final.output.length);

    // Tools of an agent posted at run time are imported too; an unreachable server is a clear 400.
    const bad = await fetch(`${srv.base}/v1/agents`, {
      method: 'POST',
      body: `id: nomcp\ntools:\n  - mcp: { url: "http://127.0.0.1:1/mcp", timeout_ms: 2000 }\n`,
    });
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).error.message, /agent 'nomcp': MCP server http:\/\/127\.0\.0\.1:1\/mcp: tools\/list failed/);
  } finally {
    if (srv) await srv.stop();
    mcp.kill('SIGTERM');
    await proxy.close();
    await otlp.close();
  }
});
