// Black-box tests of the OpenAI-compatible API with the official `openai` npm client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { tempDir } from './agents.mjs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, rawPost } from './harness.mjs';
import { assertLintedMetrics } from './cluster_helpers.mjs';

// Behind a gateway, /metrics is the gateway's own: the node's engine gauges are read from the
// node itself (`metricsBase`), while the requests go through the gateway.

let srv;
let client;
let model;

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', enum: ['Paris', 'Tokyo', 'Lima'] },
        unit: { type: 'string', enum: ['c', 'f'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const timeTool = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'Current time in a zone',
    parameters: {
      type: 'object',
      properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
      required: ['zone'],
      additionalProperties: false,
    },
  },
};

// Checks a value against the JSON Schema subset the tests use; returns a list of problems.
function schemaErrors(schema, v, where = '$') {
  const errs = [];
  if (schema.enum && !schema.enum.includes(v)) errs.push(`${where}: ${JSON.stringify(v)} not in enum`);
  if (schema.type === 'object') {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return [`${where}: not an object`];
    for (const r of schema.required ?? []) if (!(r in v)) errs.push(`${where}.${r}: missing`);
    for (const [k, val] of Object.entries(v)) {
      const ps = schema.properties?.[k];
      if (!ps) {
        if (schema.additionalProperties === false) errs.push(`${where}.${k}: not allowed`);
        continue;
      }
      errs.push(...schemaErrors(ps, val, `${where}.${k}`));
    }
  } else if (schema.type === 'string' && typeof v !== 'string') errs.push(`${where}: not a string`);
  else if (schema.type === 'boolean' && typeof v !== 'boolean') errs.push(`${where}: not a boolean`);
  else if (schema.type === 'integer' && !Number.isInteger(v)) errs.push(`${where}: not an integer`);
  return errs;
}

function assertValidCall(call, tools) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /\S+/);
  const tool = tools.find((t) => t.function.name === call.function.name);
  assert.ok(tool, `unknown tool ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  assert.deepEqual(schemaErrors(tool.function.parameters, args), []);
}

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0 });
  const list = await client.models.list();
  model = list.data[0].id;
});

after(async () => {
  const code = await srv.stop();
  assert.equal(code, 0, 'armada should exit cleanly on SIGTERM');
});

test('GET /v1/models lists the loaded model', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].object, 'model');
  assert.match(list.data[0].id, /tiny/);
});

test('non-streaming chat completion', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 8, temperature: 0,
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 5);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('same seed gives the same text; n gives several choices', async () => {
  const req = { model, messages: [{ role: 'user', content: 'Tell me' }], max_tokens: 12, seed: 11, temperature: 1 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const n = await client.chat.completions.create({ ...req, n: 3 });
  assert.equal(n.choices.length, 3);
  assert.deepEqual(n.choices.map((c) => c.index), [0, 1, 2]);
});

test('streaming chat completion has OpenAI chunk shape and usage', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Count' }], max_tokens: 10, stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.ok(chunks.length >= 3);
  const ids = new Set(chunks.map((c) => c.id));
  const created = new Set(chunks.map((c) => c.created));
  assert.equal(ids.size, 1);
  assert.equal(created.size, 1);
  assert.equal(chunks[0].object, 'chat.completion.chunk');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.ok(usage.usage.completion_tokens >= 1);
  const fin = chunks.at(-2);
  assert.ok(['stop', 'length'].includes(fin.choices[0].finish_reason));
});

test('tool_choice required always yields schema-valid tool calls', async () => {
  const tools = [weatherTool, timeTool];
  for (let seed = 1; seed <= 6; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'What is the weather?' }], tools, tool_choice: 'required',
      parallel_tool_calls: false, max_tokens: 256, seed, temperature: 1,
    });
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'tool_calls', `seed ${seed}: ${JSON.stringify(ch)}`);
    assert.equal(ch.message.tool_calls.length, 1);
    for (const call of ch.message.tool_calls) assertValidCall(call, tools);
  }
});

test('a streamed call cut off by max_tokens ends its stream, and the node serves on', async () => {
  // The final parse drops a call whose arguments were cut off; its start was already streamed.
  // llama.cpp's diff refused fewer calls with an exception that took the node down (found by
  // LangGraph.js streaming a ReAct agent with a small max_tokens).
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] } } }];
  let cut = 0;
  for (let max = 8; max <= 20; max++) {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Weather?' }], tools, tool_choice: 'required', max_tokens: max,
      temperature: 0, stream: true,
    });
    const args = {};
    let finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        for (const tc of c.delta?.tool_calls ?? []) args[tc.index] = (args[tc.index] ?? '') + (tc.function?.arguments ?? '');
        finish = c.finish_reason ?? finish;
      }
    }
    assert.ok(finish, `max_tokens ${max}: the stream ended without a finish_reason`);
    cut += Object.values(args).filter((a) => { try { JSON.parse(a); return false; } catch { return true; } }).length;
  }
  assert.ok(cut > 0, 'no stream cut a call: the case this test is for did not come up');
  const health = await fetch(srv.base + '/health');
  assert.equal(health.status, 200);
});

test('named tool_choice calls that tool', async () => {
  const tools = [weatherTool, timeTool];
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'time?' }], tools,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, max_tokens: 256, seed: 3,
    parallel_tool_calls: false,
  });
  const calls = r.choices[0].message.tool_calls;
  assert.ok(calls.length >= 1);
  for (const c of calls) {
    assert.equal(c.function.name, 'get_time');
    assertValidCall(c, tools);
  }
});

test('tool_choice auto never errors', async () => {
  const tools = [weatherTool];
  for (let seed = 1; seed <= 3; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Hi' }], tools, tool_choice: 'auto', max_tokens: 48, seed,
    });
    const ch = r.choices[0];
    assert.ok(['stop', 'length', 'tool_calls'].includes(ch.finish_reason));
    if (ch.finish_reason === 'tool_calls') for (const c of ch.message.tool_calls) assertValidCall(c, tools);
  }
});

test('streamed tool call deltas carry index, id, type and name', async () => {
  const tools = [weatherTool];
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'weather' }], tools, tool_choice: 'required', max_tokens: 256,
    parallel_tool_calls: false, stream: true, seed: 5,
  });
  const calls = [];
  let finish = null;
  let first = true;
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    if (first) { assert.equal(ch.delta.role, 'assistant'); first = false; }
    for (const d of ch.delta.tool_calls ?? []) {
      assert.equal(typeof d.index, 'number');
      if (!calls[d.index]) {
        assert.ok(d.id, 'first delta of a call has its id');
        assert.equal(d.type, 'function');
        assert.ok(d.function.name);
        calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } };
      }
      calls[d.index].function.arguments += d.function?.arguments ?? '';
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(calls.length >= 1);
  for (const c of calls) assertValidCall(c, tools);
});

test('a tool result continues the conversation, and its output reaches the prompt', async () => {
  const withTool = (content) => client.chat.completions.create({
    model,
    messages: [
      { role: 'user', content: 'weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content },
    ],
    tools: [weatherTool], max_tokens: 8,
  });
  const short = await withTool('21 C');
  const long = await withTool('21 C and sunny, a light breeze from the west, no rain expected before the evening');
  assert.equal(short.choices[0].message.role, 'assistant');
  // The longer output makes a longer prompt by its own tokens: the tool's text is in the prompt.
  const extra = (await client.completions.create({ model, prompt: ' and sunny, a light breeze from the west, no rain expected before the evening', max_tokens: 1 })).usage.prompt_tokens;
  const grew = long.usage.prompt_tokens - short.usage.prompt_tokens;
  assert.ok(Math.abs(grew - extra) <= 2, `prompt grew by ${grew} tokens for ${extra} tokens of tool output`);
});

test('logprobs and top_logprobs on chat, streamed and not, in OpenAI\'s shape', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, temperature: 0,
    logprobs: true, top_logprobs: 3,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  const bytes = [];
  for (const e of content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
    assert.equal(e.top_logprobs.length, 3);
    const tops = e.top_logprobs.map((t) => t.logprob);
    assert.deepEqual(tops, [...tops].sort((a, b) => b - a), 'alternatives best first');
    assert.ok(tops.reduce((a, x) => a + Math.exp(x), 0) <= 1 + 1e-4, 'probabilities of a distribution');
    // Greedy (temperature 0) takes the most likely token: it is the first alternative.
    assert.deepEqual(e.top_logprobs[0].bytes, e.bytes);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5);
    bytes.push(...e.bytes);
  }
  // The tokens are the answer, byte for byte.
  assert.equal(Buffer.from(bytes).toString('utf8'), r.choices[0].message.content);
  // Without logprobs there are none.
  const plain = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
  assert.equal(plain.choices[0].logprobs, null);

  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, temperature: 0,
    logprobs: true, top_logprobs: 1, stream: true, stream_options: { include_usage: true },
  });
  const streamed = [];
  let usage;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const e of c.choices[0]?.logprobs?.content ?? []) streamed.push(e);
  }
  assert.equal(streamed.length, usage.completion_tokens);
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token), 'the same greedy tokens');
});

test('logprobs on text completions, the legacy shape', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 6, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  const n = r.usage.completion_tokens;
  for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) assert.equal(lp[k].length, n, k);
  assert.ok(lp.token_logprobs.every((x) => x <= 0));
  assert.ok(lp.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2));
  assert.deepEqual(lp.text_offset, [...lp.text_offset].sort((a, b) => a - b));
  assert.equal(lp.text_offset[0], 0);
});

test('response_format json_schema yields matching JSON', async () => {
  const schema = {
    type: 'object',
    properties: { ok: { type: 'boolean' }, color: { type: 'string', enum: ['red', 'blue'] } },
    required: ['ok', 'color'],
    additionalProperties: false,
  };
  for (let seed = 1; seed <= 3; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'json please' }], max_tokens: 128, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    });
    const v = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(schemaErrors(schema, v), []);
  }
});

test('text completions with a string and with token ids', async () => {
  const a = await client.completions.create({ model, prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(typeof a.choices[0].text, 'string');
  const b = await client.completions.create({ model, prompt: [100, 200, 300], max_tokens: 5 });
  assert.ok(b.usage.prompt_tokens === 3);
  const s = await client.completions.create({ model, prompt: 'x', max_tokens: 4, stream: true });
  let n = 0;
  for await (const c of s) { if (c.choices[0]) n++; }
  assert.ok(n >= 1);
});

test('bad requests get OpenAI-shaped 4xx errors and the server keeps serving', async () => {
  const cases = [
    [{ model, messages: [] }, 400],
    [{ model, messages: [{ role: 'wizard', content: 'x' }] }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], logit_bias: { 99999999: 5 } }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], logit_bias: { abc: 5 } }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], max_tokens: -1 }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], n: 100000 }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], tools: [weatherTool, weatherTool] }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_schema' } }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], grammar: 'root ::= root "a" | "b"' }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], grammar: 'root ::= ((' }, 400],
    [{ model, prompt: [-1] }, 400, '/v1/completions'],
    [{ model, prompt: [10 ** 9] }, 400, '/v1/completions'],
    [{ model, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: -1 }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 10 ** 7 }, 400],
    [{ model, prompt: 'x', logprobs: -2 }, 400, '/v1/completions'],
    [{ model, prompt: 'x', logprobs: 10 ** 7 }, 400, '/v1/completions'],
    [{ model, prompt: 'x', n_probs: -1 }, 400, '/v1/completions'],
    [{ model, prompt: 'x', n_probs: 10 ** 7 }, 400, '/v1/completions'],
    [{ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 10 ** 12 }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }], stop: Array.from({ length: 10000 }, (_, i) => `s${i}`) }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }, { role: 'tool', tool_call_id: 'nope', content: 'r' }] }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: 5 } } }] }, 400],
    [{ model, messages: [{ role: 'user', content: 'x' }],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'nonsense' } } }] }, 400],
  ];
  for (const [body, status, route = '/v1/chat/completions'] of cases) {
    const r = await rawPost(srv.base, route, body);
    assert.equal(r.status, status, `${JSON.stringify(body).slice(0, 120)} -> ${r.text}`);
    assert.equal(typeof r.json.error.message, 'string');
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
  // The client raises its typed error.
  await assert.rejects(client.chat.completions.create({ model, messages: [] }), (e) => e.status === 400);

  assert.equal((await rawPost(srv.base, '/v1/chat/completions', '{"messages": [')).status, 400);
  // Invalid UTF-8 inside a string, and a body in GBK: refused as not UTF-8 JSON.
  const badUtf8 = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]),
    Buffer.from('"}]}')]);
  const r8 = await rawPost(srv.base, '/v1/chat/completions', new Uint8Array(badUtf8));
  assert.equal(r8.status, 400, r8.text);
  const gbk = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xc4, 0xe3, 0xba, 0xc3]),
    Buffer.from('"}]}')]);
  const rg = await rawPost(srv.base, '/v1/chat/completions', new Uint8Array(gbk), { 'Content-Type': 'application/json; charset=gbk' });
  assert.ok([400, 415].includes(rg.status), rg.text);
  assert.equal(typeof rg.json.error.message, 'string');
  assert.equal((await rawPost(srv.base, '/v1/chat/completions', '{"a":' + '['.repeat(100000))).status, 400);
  assert.equal((await rawPost(srv.base, '/v1/chat/completions', 'x'.repeat(3 * 1024 * 1024))).status, 413);
  assert.equal((await rawPost(srv.base, '/v1/chat/completions', '{}', { 'Content-Type': 'text/plain' })).status, 415);
  assert.equal((await fetch(srv.base + '/v1/nothing')).status, 404);

  const long = 'word '.repeat(3000);
  const tooLong = await rawPost(srv.base, '/v1/chat/completions', { messages: [{ role: 'user', content: long }] });
  assert.equal(tooLong.status, 400);
  assert.equal(tooLong.json.error.code, 'context_length_exceeded');
  assert.match(tooLong.json.error.message, /\d+ tokens/);

  assert.equal((await fetch(srv.base + '/health')).status, 200);
  const ok = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('hostile grammars and schemas are refused or served, never a crash', async () => {
  const deep = 'root ::= ' + '('.repeat(60000) + '"a"' + ')'.repeat(60000);
  const r1 = await rawPost(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 2, grammar: deep });
  assert.equal(r1.status, 400, r1.text);
  let chain = 'root ::= r0\n';
  for (let i = 0; i < 5000; i++) chain += `r${i} ::= r${i + 1}\n`;
  chain += 'r5000 ::= "a"\n';
  const r2 = await rawPost(srv.base, '/v1/completions', { prompt: 'x', max_tokens: 2, grammar: chain });
  assert.ok([200, 400].includes(r2.status), r2.text.slice(0, 200));
  const schema = { $ref: '#/definitions/a', definitions: { a: { type: 'object', properties: { n: { $ref: '#/definitions/a' } } } } };
  const r3 = await rawPost(srv.base, '/v1/chat/completions', {
    messages: [{ role: 'user', content: 'x' }], max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'r', schema } },
  });
  assert.ok([200, 400].includes(r3.status), r3.text.slice(0, 200));
  assert.equal((await fetch(srv.base + '/health')).status, 200);
});

test('max_tokens cut inside a multi-byte character still gives valid UTF-8 and JSON', async () => {
  const strict = new TextDecoder('utf-8', { fatal: true });
  for (let n = 1; n <= 6; n++) {
    for (const stream of [false, true]) {
      const res = await fetch(srv.base + '/v1/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: '你好，世界', max_tokens: n, seed: n, temperature: 1.5, stream }),
      });
      assert.equal(res.status, 200);
      // The raw bytes: a decoder that replaces bad bytes (r.text()) would hide them.
      const bytes = new Uint8Array(await res.arrayBuffer());
      const text = strict.decode(bytes);
      if (!stream) JSON.parse(text);
      else for (const line of text.split('\n').filter((l) => l.startsWith('data: {'))) JSON.parse(line.slice(6));
    }
  }
});

test('client going away cancels its request', async () => {
  const ctl = new AbortController();
  const p = fetch(srv.base + '/v1/completions', {
    method: 'POST', signal: ctl.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'a', max_tokens: 1000, stream: true }),
  });
  const res = await p;
  const reader = res.body.getReader();
  await reader.read();
  ctl.abort();
  // The engine slot frees: a normal request completes promptly afterwards.
  const t0 = Date.now();
  for (let i = 0; i < 4; i++) {
    await client.completions.create({ model, prompt: 'b', max_tokens: 4 });
  }
  assert.ok(Date.now() - t0 < 30000);
  // The engine thread counts a sequence free just after it sent the answer: allow it a moment.
  let active = -1;
  for (let i = 0; i < 50 && active !== 0; i++) {
    const m = await (await fetch(srv.metricsBase + '/metrics')).text();
    active = Number(m.match(/^armada_sequences_active (\S+)/m)[1]);
    if (active !== 0) await new Promise((res) => setTimeout(res, 20));
  }
  assert.equal(active, 0);
});

test('/metrics exposes the armada_ families', async () => {
  const r = await fetch(srv.metricsBase + '/metrics');
  assert.equal(r.status, 200);
  const t = await r.text();
  for (const name of [
    'armada_requests_total{route="/v1/chat/completions",code="200"}',
    'armada_prompt_tokens_total', 'armada_generated_tokens_total',
    'armada_time_to_first_token_seconds_bucket', 'armada_inter_token_seconds_bucket',
    'armada_batch_tokens_bucket', 'armada_sequences_active', 'armada_sequences_queued',
    'armada_kv_bytes_used', 'armada_kv_bytes_capacity',
  ]) assert.ok(t.includes(name), `missing ${name}`);
  assertLintedMetrics(t, srv.metricsBase);
  if (srv.metricsBase !== srv.base) {
    // Through a gateway: its own families pass the same lint.
    const g = await fetch(srv.base + '/metrics');
    assert.equal(g.status, 200);
    assertLintedMetrics(await g.text(), `the gateway ${srv.base}`);
  }
  for (const line of t.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const name = line.split(/[{ ]/)[0];
    assert.ok(name.startsWith('armada_') && !name.includes(':'), line);
  }
});

test('a conversation is one program by its prompt_cache_key, user or X-Armada-Session, or by the chain it extends', async () => {
  const programs = async () => {
    const t = await (await fetch(srv.metricsBase + '/metrics')).text();
    const m = t.match(/^armada_engine_programs\{engine="0"\} (\S+)/m);
    assert.ok(m, 'armada_engine_programs is missing');
    return Number(m[1]);
  };
  const chat = async (text, extra = {}, headers = {}) => {
    const r = await rawPost(srv.base, '/v1/chat/completions',
      { messages: [{ role: 'user', content: text }], max_tokens: 2, ...extra }, headers);
    assert.equal(r.status, 200, r.text);
  };
  const before = await programs();
  // Two unrelated prompts under one name are one program; each name is its own.
  await chat('alpha one two three', { prompt_cache_key: 'conv-k' });
  await chat('nothing like the first at all', { prompt_cache_key: 'conv-k' });
  await chat('gamma four five six', { user: 'conv-u' });
  await chat('again nothing shared with it', { user: 'conv-u' });
  await chat('delta seven eight', {}, { 'X-Armada-Session': 'conv-h' });
  await chat('still unrelated words here', {}, { 'X-Armada-Session': 'conv-h' });
  assert.equal(await programs(), before + 3);
  // Unnamed and unrelated: two programs.
  await chat('epsilon nine ten eleven twelve');
  await chat('zeta thirteen fourteen fifteen');
  assert.equal(await programs(), before + 5);
});

test('API key is required on every route but /health', async () => {
  const s = await startServer(['--api-key', 'sk-test-1']);
  try {
    assert.equal((await fetch(s.base + '/health')).status, 200);
    assert.equal((await fetch(s.base + '/v1/models')).status, 401);
    assert.equal((await fetch(s.base + '/metrics')).status, 401);
    const bad = await rawPost(s.base, '/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }] },
      { Authorization: 'Bearer nope' });
    assert.equal(bad.status, 401);
    assert.equal(bad.json.error.type, 'authentication_error');
    const c = new OpenAI({ baseURL: s.base + '/v1', apiKey: 'sk-test-1', maxRetries: 0 });
    const r = await c.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 2 });
    assert.equal(r.choices.length, 1);
  } finally {
    await s.stop();
  }
});

test('a key\'s requests-per-minute limit counts requests that start work, not reads', async () => {
  const dir = tempDir('armada-rpm-');
  const keys = path.join(dir, 'keys');
  fs.writeFileSync(keys, 'sk-few rpm=3\n');
  const s = await startServer(['--api-key-file', keys]);
  const as = { Authorization: 'Bearer sk-few' };
  try {
    // A client polling what it reads is not throttled for it (on a node, and through a gateway).
    for (let i = 0; i < 10; i++) assert.equal((await fetch(s.base + '/v1/models', { headers: as })).status, 200);
    const body = { messages: [{ role: 'user', content: 'x' }], max_tokens: 2 };
    for (let i = 0; i < 3; i++) assert.equal((await rawPost(s.base, '/v1/chat/completions', body, as)).status, 200);
    const r = await rawPost(s.base, '/v1/chat/completions', body, as);
    assert.equal(r.status, 429, r.text);
    assert.ok(Number(r.headers.get('retry-after')) >= 1);
  } finally {
    await s.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a full queue answers 429 with Retry-After', async () => {
  const s = await startServer(['-np', '1', '--queue', '1']);
  try {
    const long = () => rawPost(s.base, '/v1/completions', { prompt: 'a', max_tokens: 400 });
    const inflight = [long(), long()];
    // Wait until one request holds the sequence and the other waits in the queue.
    const gauge = async (name) => Number((await (await fetch(s.metricsBase + '/metrics')).text()).match(new RegExp(`^${name} (\\S+)`, 'm'))[1]);
    for (let i = 0; i < 500 && !((await gauge('armada_sequences_active')) === 1 && (await gauge('armada_sequences_queued')) === 1); i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(await gauge('armada_sequences_active'), 1);
    assert.equal(await gauge('armada_sequences_queued'), 1);
    const refused = await long();
    assert.equal(refused.status, 429, refused.text);
    assert.ok(refused.headers.get('retry-after'));
    assert.equal(refused.json.error.type, 'rate_limit_error');
    const done = await Promise.all(inflight);
    for (const d of done) assert.equal(d.status, 200);
  } finally {
    await s.stop();
  }
});
