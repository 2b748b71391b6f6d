// Agent steps on a GPU pool, with real processes: `armada serve --pools` and a llama-server built
// from the project's llama.cpp as the pool (on the CPU here). The routing rules are the defaults:
// a step whose prompt passes 8192 tokens goes to the pool. The session's loop, tools and
// checkpoints stay on the node; the pool sees only a prompt, a token limit and sampling.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, tinyModel, rawPost } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { startDocumentTool } from './tool_server.mjs';
import { waitFor as waitSession } from './session_helpers.mjs';
import { startLlamaServer, waitFor } from './cluster_helpers.mjs';
import { startRecordingProxy } from './mcp_peer.mjs';
import { startOtlpReceiver } from './otlp_receiver.mjs';

const LLAMA_SERVER = process.env.LLAMA_SERVER;
let dir;
let srv;
let llama;
let tools;
let otlp;  // the node's spans
const WORDS = 9000;  // the first tool result: ~9K tokens, so the next step's prompt passes 8192

async function llamaMetric(name) {
  const text = await fetch(`http://127.0.0.1:${llama.port}/metrics`).then((r) => r.text());
  const m = text.match(new RegExp(`^llamacpp:${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : 0;
}

const session = async (node = srv, headers = {}) => {
  const r = await rawPost(node.base, '/v1/agents/reader/sessions', { input: 'Read the document, then answer.' }, headers);
  assert.equal(r.status, 200, r.text);
  return r.json.id;
};
const nodeLog = (node = srv) => (node.stdout() + node.stderr()).split('\n').filter((l) => /pool|warn|error/.test(l)).join('\n');
const outputs = (s) => s.steps.filter((x) => x.kind === 'model_output').map((x) => x.data);

before(async () => {
  assert.ok(LLAMA_SERVER && fs.existsSync(LLAMA_SERVER), `llama-server is built (LLAMA_SERVER=${LLAMA_SERVER})`);
  dir = tempDir('armada-pool-steps-');
  tools = await startDocumentTool(WORDS);
  // 12288 tokens a slot. The tiny model says it was trained on 4096, where llama-server caps a slot.
  llama = await startLlamaServer(tinyModel, ['-c', '24576', '-np', '2', '-t', '1',
    '--override-kv', 'qwen2.context_length=int:32768']);
  fs.writeFileSync(path.join(dir, 'pools.yaml'), `
pools:
  - name: gpu
    context: 12288
    timeout_ms: 60000
    upstreams:
      - {url: 'http://127.0.0.1:${llama.port}', model: tiny-on-gpu, max_in_flight: 2}
`);
  fs.writeFileSync(path.join(dir, 'agents.yaml'), `agents:
  - id: reader
    instructions: Read what the tool returns, then answer.
    min_tool_steps: 2
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 11 }
    limits: { max_steps: 4, max_tokens_per_step: 48, tool_timeout_ms: 30000 }
    tools:
      - name: read
        description: Read a part of the document
        url: ${tools.url}/read
        timeout_ms: 30000
        parameters:
          type: object
          properties:
            part: { type: string, enum: [intro, body, end] }
            page: { type: integer, enum: [1, 2, 3] }
          required: [part, page]
          additionalProperties: false
  # No tools, and room for 8,000 tokens a step: over the default 500, so its step goes to the pool.
  - id: writer
    instructions: Write at length.
    # Greedy: this random-weight model then repeats itself to the token limit (sampled, it may
    # stop within a few dozen tokens, and a cancel would have nothing left to stop).
    sampling: { temperature: 0 }
    limits: { max_steps: 1, max_tokens_per_step: 8000 }
`);
  // 12288 tokens a sequence: the long steps fit here too, so a failed pool step can fall back.
  srv = await startNode();
});

const nodeArgs = () => ['--agents', path.join(dir, 'agents.yaml'), '--data-dir', path.join(dir, 'data'),
  '--tool-allow', '127.0.0.1', '--pools', path.join(dir, 'pools.yaml'), '-c', '24576', '-np', '2', '-t', '1'];
async function startNode() {
  otlp ??= await startOtlpReceiver();
  const node = await startServer(nodeArgs(), { env: { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.endpoint } });
  // The node's pool checker says when the upstream answered /health and a warm-up request.
  await waitFor('the pool warmed', async () => /pool gpu: \S+ is up \(warmed\)/.test(node.stdout() + node.stderr()), 30000);
  return node;
}

const poolSteps = async () => {
  const text = await fetch(srv.base + '/metrics').then((r) => r.text());
  const m = text.match(/^armada_session_pool_steps_total\{pool="gpu"\} (\S+)$/m);
  return m ? Number(m[1]) : 0;
};

after(async () => {
  await srv?.stop();
  if (llama?.proc.exitCode === null) { llama.proc.kill('SIGCONT'); llama.proc.kill('SIGKILL'); }
  tools?.server.close();
  await otlp?.close();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('a step whose context passes 8K runs on the pool; its tool call is schema-valid; the log says where each ran', async () => {
  const before = await llamaMetric('prompt_tokens_total');
  const id = await session();
  const s = await waitSession(srv.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
  assert.equal(s.state, 'completed', s.reason);
  const out = outputs(s);
  assert.equal(out.length, 3, JSON.stringify(out));
  assert.equal(out[0].ran_on, 'cpu');
  assert.ok(out[0].prompt_tokens < 8192);
  // The tool's document put the next prompt past 8192 tokens: the pool ran that step.
  assert.ok(out[1].prompt_tokens > 8192, `${out[1].prompt_tokens}`);
  assert.equal(out[1].ran_on, 'gpu', JSON.stringify(out[1]) + '\n' + nodeLog().slice(-3000));
  assert.equal(out[1].upstream, 'tiny-on-gpu');
  assert.equal(out[1].tool_calls.length, 1);
  const call = out[1].tool_calls[0];
  assert.equal(call.name, 'read');
  const args = JSON.parse(call.arguments);
  assert.deepEqual(Object.keys(args).sort(), ['page', 'part']);
  assert.ok(['intro', 'body', 'end'].includes(args.part), call.arguments);
  assert.ok([1, 2, 3].includes(args.page), call.arguments);
  // The pool computed that prompt (llama-server's own count), and the call reached the tool.
  assert.ok(await llamaMetric('prompt_tokens_total') - before > 8192);
  assert.equal(tools.calls.get(id), 2);
  // The answer's prompt is long too.
  assert.equal(out[2].ran_on, 'gpu', JSON.stringify(out[2]));
  assert.equal(s.transcript.at(-1).role, 'assistant');
});

// The Responses API: the loop stays on the node, and a model step the rules send to the pool (the
// default: over 500 tokens to generate) runs there. X-Armada-Route says where.
test('a Responses request over 500 output tokens runs on the pool; a short one stays on the node', async () => {
  const predicted = await llamaMetric('tokens_predicted_total');
  const requests = await llamaMetric('prompt_tokens_total');
  const short = await rawPost(srv.base, '/v1/responses', { input: 'Say hello.', max_output_tokens: 16, temperature: 0 });
  assert.equal(short.status, 200, short.text);
  assert.equal(short.headers.get('x-armada-route'), 'cpu');
  assert.equal(await llamaMetric('prompt_tokens_total'), requests, 'the pool saw nothing of the short request');
  const long = await rawPost(srv.base, '/v1/responses', { input: 'Write at length.', max_output_tokens: 600, temperature: 0 });
  assert.equal(long.status, 200, long.text);
  assert.equal(long.headers.get('x-armada-route'), 'gpu', nodeLog().slice(-2000));
  assert.ok(['completed', 'incomplete'].includes(long.json.status), long.text);
  const generated = await llamaMetric('tokens_predicted_total') - predicted;
  assert.ok(generated > 0, 'the pool generated the long one');
  assert.equal(long.json.usage.output_tokens, generated, 'what the node reports is what the pool generated');
  assert.equal(long.json.output[0].type, 'message');
});

const WEATHER = { type: 'function', name: 'weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer', enum: [1, 2] } },
    required: ['city', 'days'], additionalProperties: false } };

test('a streamed Responses request on the pool: its forced function call is schema-valid', async () => {
  const r = await fetch(srv.base + '/v1/responses', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      input: 'Look up the weather.', stream: true, max_output_tokens: 600, temperature: 0.7,
      tools: [WEATHER],
      tool_choice: 'required',
    }),
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  const text = await r.text();
  const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
  assert.equal(events[0].type, 'response.created');
  const done = events.at(-1);
  assert.ok(['response.completed', 'response.incomplete'].includes(done.type), text.slice(-500));
  // A forced call streams no text, and the reply holds no message item.
  assert.equal(events.filter((e) => e.type === 'response.output_text.delta').length, 0, text.slice(0, 2000));
  assert.ok(done.response.output.every((o) => o.type === 'function_call'), JSON.stringify(done.response.output));
  const calls = done.response.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length >= 1, true, JSON.stringify(done.response.output));
  const args = JSON.parse(calls[0].arguments);
  assert.equal(calls[0].name, 'weather');
  assert.deepEqual(Object.keys(args).sort(), ['city', 'days']);
  assert.ok(['Paris', 'Oslo'].includes(args.city) && [1, 2].includes(args.days), calls[0].arguments);
});

test('SIGHUP reads the pools and rules again: with a higher threshold the long step stays on the node', async () => {
  const file = path.join(dir, 'pools.yaml');
  const original = fs.readFileSync(file, 'utf8');
  const reloads = () => (srv.stdout() + srv.stderr()).split('SIGHUP: pools reloaded').length - 1;
  const hup = async () => {
    const n = reloads();
    srv.proc.kill('SIGHUP');
    await waitFor('the pools reloaded', async () => reloads() > n, 30000);
  };
  try {
    fs.writeFileSync(file, original + 'routes:\n  - {when: {prompt_tokens_over: 100000}, to: gpu}\n');
    await hup();
    const s = await waitSession(srv.base, await session(), ['completed', 'failed'], { timeoutMs: 180000 });
    assert.equal(s.state, 'completed', s.reason);
    const out = outputs(s);
    assert.ok(out[1].prompt_tokens > 8192);
    assert.equal(out[1].ran_on, 'cpu', JSON.stringify(out[1]));
    assert.equal(out[1].pool_fallback, undefined);  // not a fallback: the rules kept it here
    // The upstreams are read again too: the same server under another model name is a new
    // upstream, warmed before it takes the next long step.
    const warmed = () => (srv.stdout() + srv.stderr()).split('is up (warmed)').length - 1;
    const w = warmed();
    fs.writeFileSync(file, original.replace('model: tiny-on-gpu', 'model: tiny-renamed'));
    await hup();
    await waitFor('the renamed upstream warmed', async () => warmed() > w, 30000);
    const t = await waitSession(srv.base, await session(), ['completed', 'failed'], { timeoutMs: 180000 });
    assert.equal(t.state, 'completed', t.reason);
    assert.equal(outputs(t)[1].ran_on, 'gpu', JSON.stringify(outputs(t)[1]));
    assert.equal(outputs(t)[1].upstream, 'tiny-renamed');
  } finally {
    fs.writeFileSync(file, original);
    await hup();
  }
});

test('a step on the pool carries the trace context of its chat span to the upstream', async () => {
  const file = path.join(dir, 'pools.yaml');
  const original = fs.readFileSync(file, 'utf8');
  const proxy = await startRecordingProxy(llama.port, ['traceparent']);
  // Each upstream (by URL) says when it has answered /health and a warm-up request.
  const warmed = (url) => (srv.stdout() + srv.stderr()).split(`pool gpu: ${url} is up (warmed)`).length - 1;
  const reloads = () => (srv.stdout() + srv.stderr()).split('SIGHUP: pools reloaded').length - 1;
  const hup = async () => {
    const n = reloads();
    srv.proc.kill('SIGHUP');
    await waitFor('the pools reloaded', async () => reloads() > n, 30000);
  };
  try {
    // The same llama-server behind a proxy that records each request's traceparent.
    const w = warmed(proxy.base);
    fs.writeFileSync(file, original.replace(`http://127.0.0.1:${llama.port}`, proxy.base));
    await hup();
    await waitFor('the proxied upstream warmed', async () => warmed(proxy.base) > w, 30000);
    const trace = '0af7651916cd43dd8448eb211c80319c';
    const clientSpan = 'b7ad6b7169203331';
    const s = await waitSession(srv.base, await session(srv, { traceparent: `00-${trace}-${clientSpan}-01` }),
      ['completed', 'failed'], { timeoutMs: 180000 });
    assert.equal(s.state, 'completed', s.reason);
    // The steps sent to the pool: those it ran, and those it failed that the node ran instead
    // (llama-server can refuse this random-weight model's output as unparseable).
    const sent = outputs(s).filter((o) => o.ran_on === 'gpu' || o.pool_fallback).length;
    assert.ok(outputs(s).some((o) => o.ran_on === 'gpu'), JSON.stringify(outputs(s)) + '\n' + nodeLog().slice(-3000));
    // One request per step sent carries the client's trace, each under a span of its own.
    const traced = proxy.log.filter((e) => (e.traceparent ?? '').includes(trace));
    assert.equal(traced.length, sent, JSON.stringify(proxy.log));
    for (const e of traced) assert.match(e.traceparent, new RegExp(`^00-${trace}-[0-9a-f]{16}-01$`));
    const spans = new Set(traced.map((e) => e.traceparent.split('-')[2]));
    assert.equal(spans.size, sent);
    assert.ok(!spans.has(clientSpan), 'a step\'s own span, not the client\'s');
    // Those are the node's `chat` spans, in the client's trace, saying where each step ran.
    const chats = await waitFor('the chat spans', () => {
      const got = [...spans].map((id) => otlp.spans.find((x) => x.spanId === id));
      return got.every(Boolean) && got;
    }, 10000);
    for (const c of chats) {
      assert.match(c.name, /^chat /);
      assert.equal(c.traceId, trace);
      assert.equal(c.attributes['gen_ai.operation.name'], 'chat');
    }
    assert.ok(chats.some((c) => c.attributes['armada.ran_on'] === 'gpu'), JSON.stringify(chats.map((c) => c.attributes)));
  } finally {
    // Back to llama-server itself, warmed again before the next test's long step.
    const w = warmed(`http://127.0.0.1:${llama.port}`);
    fs.writeFileSync(file, original);
    await hup();
    await waitFor('llama-server warmed again', async () => warmed(`http://127.0.0.1:${llama.port}`) > w, 30000);
    await proxy.close();
  }
});

test('a pool that takes only response_format gets the required call as a JSON schema, and it comes back valid', async () => {
  // The "GPU" here is a second Armada; the node is told it speaks only OpenAI's response_format.
  const gpu = await startServer(['-c', '24576', '-np', '2', '-t', '1', '--data-dir', path.join(dir, 'gpu')]);
  fs.writeFileSync(path.join(dir, 'pools-schema.yaml'), `
pools:
  - name: gpu
    context: 12288
    upstreams:
      - {url: '${gpu.base}', model: armada-tiny-q8_0, max_in_flight: 2, grammar: json_schema}
`);
  const node = await startServer(['--agents', path.join(dir, 'agents.yaml'), '--data-dir', path.join(dir, 'data2'),
    '--tool-allow', '127.0.0.1', '--pools', path.join(dir, 'pools-schema.yaml'), '-c', '24576', '-np', '2', '-t', '1']);
  try {
    await waitFor('the pool warmed', async () => /pool gpu: \S+ is up \(warmed\)/.test(node.stdout() + node.stderr()), 30000);
    const id = await session(node);
    const s = await waitSession(node.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
    assert.equal(s.state, 'completed', s.reason);
    const out = outputs(s);
    assert.equal(out[1].ran_on, 'gpu', JSON.stringify(out[1]) + '\n' + nodeLog(node).slice(-3000));
    assert.equal(out[1].upstream, 'armada-tiny-q8_0');
    assert.equal(out[1].tool_calls.length, 1);
    const args = JSON.parse(out[1].tool_calls[0].arguments);
    assert.deepEqual(Object.keys(args).sort(), ['page', 'part']);
    assert.ok(['intro', 'body', 'end'].includes(args.part) && [1, 2, 3].includes(args.page), JSON.stringify(args));
    // The pool computed the long prompt: its own metrics count the tokens.
    const m = (await fetch(gpu.base + '/metrics').then((r) => r.text())).match(/^armada_prompt_tokens_total (\S+)$/m);
    assert.ok(m && Number(m[1]) > 8192, m?.[0]);
    // A streamed Responses request with a forced call, on that pool: the reply is bare JSON,
    // which reaches the client as a function_call item, never as text.
    const r = await fetch(node.base + '/v1/responses', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ input: 'Look up the weather.', stream: true, max_output_tokens: 600, tools: [WEATHER], tool_choice: 'required' }),
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-armada-route'), 'gpu');
    const text = await r.text();
    const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => JSON.parse(l.slice(6)));
    assert.equal(events.filter((e) => e.type === 'response.output_text.delta').length, 0, text.slice(0, 2000));
    const last = events.at(-1);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), text.slice(-500));
    assert.ok(last.response.output.length >= 1 && last.response.output.every((o) => o.type === 'function_call'),
      JSON.stringify(last.response.output));
    const a = JSON.parse(last.response.output[0].arguments);
    assert.ok(['Paris', 'Oslo'].includes(a.city) && [1, 2].includes(a.days), last.response.output[0].arguments);
  } finally {
    await node.stop();
    await gpu.stop();
  }
});

test('cancelling a session whose step is on the pool cancels the request upstream', async () => {
  const sent = await poolSteps();
  const predicted = await llamaMetric('tokens_predicted_total');
  const r = await rawPost(srv.base, '/v1/agents/writer/sessions', { input: 'Write a long story.' });
  assert.equal(r.status, 200, r.text);
  const id = r.json.id;
  await waitFor('the step sent to the pool', async () => (await poolSteps()) > sent, 60000);
  // The pool is generating it: llama-server has decoded some of its tokens.
  const decoded = await llamaMetric('n_decode_total');
  await waitFor('the pool generating', async () => (await llamaMetric('n_decode_total')) >= decoded + 20, 30000);
  assert.equal(await llamaMetric('requests_processing'), 1);
  const c = await rawPost(srv.base, `/v1/sessions/${id}/cancel`, {});
  assert.equal(c.status, 200, c.text);
  // Left alone, 8,000 tokens would keep llama-server busy far longer than this.
  await waitFor('llama-server to stop the request', async () => (await llamaMetric('requests_processing')) === 0, 3000);
  const s = await waitSession(srv.base, id, ['completed', 'failed', 'cancelled'], { timeoutMs: 30000 });
  assert.equal(s.state, 'cancelled', s.reason);
  // llama-server counts a stopped request's tokens when it frees the slot: far fewer than asked.
  const made = (await llamaMetric('tokens_predicted_total')) - predicted;
  assert.ok(made > 0 && made < 4000, `llama-server generated ${made} tokens for the cancelled step`);
  assert.equal(outputs(s).length, 0, 'no output was written for the cancelled step');
});

test('a client that leaves a Responses stream whose step is on the pool cancels the request upstream', async () => {
  const predicted = await llamaMetric('tokens_predicted_total');
  const ac = new AbortController();
  const r = await fetch(srv.base + '/v1/responses', {
    method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ input: 'Write a long story.', stream: true, max_output_tokens: 8000, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-armada-route'), 'gpu');
  const decoded = await llamaMetric('n_decode_total');
  await waitFor('the pool generating', async () => (await llamaMetric('n_decode_total')) >= decoded + 20, 30000);
  assert.equal(await llamaMetric('requests_processing'), 1);
  ac.abort();
  await waitFor('llama-server to stop the request', async () => (await llamaMetric('requests_processing')) === 0, 3000);
  const made = (await llamaMetric('tokens_predicted_total')) - predicted;
  assert.ok(made > 0 && made < 4000, `llama-server generated ${made} tokens for the abandoned response`);
});

test('the node killed while its step is on the pool: the step is sent again when the session resumes', async () => {
  // The pool holds the step (SIGSTOP) while the node dies.
  tools.onFirst = async () => { llama.proc.kill('SIGSTOP'); };
  const sent = await poolSteps();
  const id = await session();
  await waitFor('the step sent to the pool', async () => (await poolSteps()) > sent, 60000);
  tools.onFirst = null;
  const exited = new Promise((r) => srv.proc.on('exit', r));
  srv.proc.kill('SIGKILL');
  await exited;
  llama.proc.kill('SIGCONT');
  // The pool may still compute the orphaned request: count only what comes after it.
  await waitFor('the pool idle', async () => (await llamaMetric('requests_processing')) === 0, 60000);
  const before = await llamaMetric('tokens_predicted_total');
  srv = await startNode();
  const s = await waitSession(srv.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
  assert.equal(s.state, 'completed', s.reason);
  const out = outputs(s);
  assert.equal(out.length, 3, JSON.stringify(out));
  assert.equal(out[1].ran_on, 'gpu', JSON.stringify(out[1]) + '\n' + nodeLog().slice(-3000));
  assert.ok(out[1].prompt_tokens > 8192);
  // The old process died before it could write that step: the new one sent it again, and the
  // pool generated it after the restart (its prompt may come from the pool's cache). The tool
  // call before the kill was not repeated.
  assert.ok(await llamaMetric('tokens_predicted_total') > before);
  assert.equal(tools.calls.get(id), 2);
});

test('the pool killed during a delegated step: the node runs the step itself and the session completes', async () => {
  // The pool stops (SIGSTOP) just before the long document reaches the session, so the step
  // that reads it is sent to a pool that takes the connection and never answers.
  tools.onFirst = async () => { llama.proc.kill('SIGSTOP'); };
  const sent = await poolSteps();
  const id = await session();
  await waitFor('the step sent to the pool', async () => (await poolSteps()) > sent, 60000);
  llama.proc.kill('SIGKILL');
  const s = await waitSession(srv.base, id, ['completed', 'failed'], { timeoutMs: 180000 });
  tools.onFirst = null;
  assert.equal(s.state, 'completed', s.reason);
  const out = outputs(s);
  assert.equal(out.length, 3, JSON.stringify(out));
  assert.equal(out[1].ran_on, 'cpu', JSON.stringify(out[1]));
  assert.equal(out[1].pool_fallback, 'gpu-unavailable');
  // The node had sent the step to the pool, and the pool's death cut it off.
  assert.match(nodeLog(), /upstream tiny-on-gpu failed a step/);
  assert.equal(out[1].tool_calls.length, 1);
  assert.ok(out[1].prompt_tokens > 8192);
  const metrics = await fetch(srv.base + '/metrics').then((r) => r.text());
  assert.match(metrics, /^armada_session_pool_fallbacks_total\{pool="gpu",to="cpu"\} [1-9]/m);
});

test('a Responses request for the pool while it is down runs on the node and says so', async () => {
  assert.ok(llama.proc.exitCode !== null || llama.proc.signalCode !== null, 'the pool was killed above');
  const r = await rawPost(srv.base, '/v1/responses', { input: 'Write at length.', max_output_tokens: 600, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.headers.get('x-armada-route'), 'cpu; degraded=gpu-unavailable');
  assert.ok(['completed', 'incomplete'].includes(r.json.status), r.text);
  assert.ok(r.json.usage.output_tokens > 0);
});
