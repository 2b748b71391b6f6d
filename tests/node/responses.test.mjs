// The Responses API with the official openai client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, viaGateway } from './harness.mjs';
import { tempDir } from './agents.mjs';

let srv;
let client;

const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'Weather for a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Lima'] } },
    required: ['city'],
    additionalProperties: false,
  },
};

before(async () => {
  const dir = tempDir('armada-responses-');
  fs.writeFileSync(path.join(dir, 'keys'), 'sk-r1\nsk-r2\nsk-radmin tenant=ops admin\n');
  srv = await startServer(['--data-dir', path.join(dir, 'data'), '--api-key-file', path.join(dir, 'keys'), '-c', '8192']);
  client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'sk-r1', maxRetries: 0 });
});

after(async () => {
  await srv.stop();
});

test('text input with instructions', async () => {
  const r = await client.responses.create({
    model: 'x', input: 'Say hi', instructions: 'Be brief.', max_output_tokens: 12,
  });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].role, 'assistant');
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.instructions, 'Be brief.');
});

test('previous_response_id continues stored state and reuses the KV', async () => {
  const first = await client.responses.create({ model: 'x', input: 'Remember the word apple.', max_output_tokens: 8 });
  const second = await client.responses.create({
    model: 'x', input: 'What was the word?', previous_response_id: first.id, max_output_tokens: 8,
  });
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.usage.input_tokens > first.usage.input_tokens);
  assert.ok(second.usage.input_tokens_details.cached_tokens > 0, 'the first turn came from the KV cache');
  await assert.rejects(
    client.responses.create({ model: 'x', input: 'x', previous_response_id: 'resp_nope' }),
    (e) => e.status === 404,
  );
});

// The continuation of a conversation whose sequence went to other requests meanwhile: its KV comes
// back from a prompt-cache entry, and only the new turn is computed. With --no-prefix-cache the
// same exchange computes the whole conversation again.
async function continuationAfterOthers(base) {
  const c = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-r1', maxRetries: 0 });
  const cache = async () => (await fetch(base + '/v1/cache', { headers: { Authorization: 'Bearer sk-radmin' } })).json();
  const facts = Array.from({ length: 40 }, (_, i) => `Fact ${i}: the crate numbered ${i * 3} holds pears.`).join(' ');
  const first = await c.responses.create({ model: 'x', input: `${facts} Remember the word pear.`, max_output_tokens: 4 });
  assert.ok(first.usage.input_tokens > 256, `a long first turn (${first.usage.input_tokens} tokens)`);
  // Unrelated requests, more than the server's 4 sequences. Each goes to the idle sequence that
  // shares the longest prefix with it (here the template's header, which the first turn's shares
  // too), ties to the one used longest ago; so the first turn's sequence is overwritten at the
  // latest by the fourth. The restore counted below shows it was.
  for (const w of ['Alpha', 'Bravo', 'Charlie', 'Delta', 'Echo']) {
    await c.responses.create({ model: 'x', input: `${w} ` + `${w.toLowerCase()} words `.repeat(60), max_output_tokens: 2 });
  }
  const before = await cache();
  const second = await c.responses.create({
    model: 'x', input: 'What was the word?', previous_response_id: first.id, max_output_tokens: 4,
  });
  return { first, second, before, after: await cache() };
}

test('a previous_response_id chain is one program for the scheduler, whatever its instructions', async () => {
  const programs = async () => {
    const t = await (await fetch(srv.metricsBase + '/metrics', { headers: { Authorization: 'Bearer sk-radmin' } })).text();
    const m = t.match(/^armada_engine_programs\{engine="0"\} (\S+)/m);
    assert.ok(m, 'armada_engine_programs is missing');
    return Number(m[1]);
  };
  const before = await programs();
  // New instructions change the prompt's start, so only the chain ties these three together.
  const a = await client.responses.create({ model: 'x', input: 'one', instructions: 'Be brief.', max_output_tokens: 2 });
  const b = await client.responses.create({
    model: 'x', input: 'two', instructions: 'Answer in French, please.', previous_response_id: a.id, max_output_tokens: 2,
  });
  await client.responses.create({
    model: 'x', input: 'three', instructions: 'Something else entirely.', previous_response_id: b.id, max_output_tokens: 2,
  });
  assert.equal(await programs(), before + 1);
  await client.responses.create({ model: 'x', input: 'a new chain', max_output_tokens: 2 });
  assert.equal(await programs(), before + 2);
});

test('a continuation restores its conversation from the prompt cache after its sequence was taken', { skip: viaGateway && 'the cache is per node' }, async () => {
  const { first, second, before, after } = await continuationAfterOthers(srv.base);
  assert.equal(after.enabled, true);
  assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 64,
    `reused ${second.usage.input_tokens_details.cached_tokens} of the first turn's ${first.usage.input_tokens} tokens`);
  assert.equal(after.restored_from_entries, before.restored_from_entries + 1, JSON.stringify({ before, after }));
  assert.ok(after.entries.ram >= 1 && after.bytes.ram > 0 && after.hit_rate > 0 && after.hit_rate <= 1, JSON.stringify(after));
  assert.equal(typeof after.evictions, 'number');
  const m = await (await fetch(srv.base + '/metrics', { headers: { Authorization: 'Bearer sk-radmin' } })).text();
  const metric = (name) => Number((m.match(new RegExp(`^${name} (\\S+)$`, 'm')) ?? [])[1]);
  assert.equal(metric('armada_prompt_cache_restores_total'), after.restored_from_entries);
  // Entries and bytes can grow meanwhile: the engine saves the last turn once it is idle.
  assert.ok(metric('armada_prompt_cache_entries\\{tier="ram"\\}') >= after.entries.ram);
  assert.ok(metric('armada_prompt_cache_bytes\\{tier="ram"\\}') > 0);
  assert.equal(metric('armada_prompt_cache_entries\\{tier="disk"\\}'), 0);
  assert.ok(metric('armada_prompt_cache_hit_ratio') > 0);
  assert.equal(metric('armada_prompt_cache_evictions_total'), after.evictions);
});

test('with --no-prefix-cache the same continuation computes the whole conversation', { skip: viaGateway && 'one node\'s flag' }, async () => {
  const dir = tempDir('armada-responses-nocache-');
  fs.writeFileSync(path.join(dir, 'keys'), 'sk-r1\nsk-radmin tenant=ops admin\n');
  const off = await startServer(['--data-dir', path.join(dir, 'data'), '--api-key-file', path.join(dir, 'keys'), '-c', '8192', '--no-prefix-cache']);
  try {
    const { first, second, after } = await continuationAfterOthers(off.base);
    assert.equal(after.enabled, false);
    assert.equal(after.restored_from_entries, 0);
    assert.ok(second.usage.input_tokens_details.cached_tokens < 64,
      `reused ${second.usage.input_tokens_details.cached_tokens} of the first turn's ${first.usage.input_tokens} tokens`);
  } finally {
    assert.equal(await off.stop(), 0, 'the server exits cleanly');
  }
});

test('function tools round-trip through function_call_output', async () => {
  const r = await client.responses.create({
    model: 'x', input: 'Weather in Paris?', tools: [weather], tool_choice: 'required',
    parallel_tool_calls: false, max_output_tokens: 256,
  });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  assert.ok(['Paris', 'Lima'].includes(JSON.parse(call.arguments).city));
  const send = (output) => client.responses.create({
    model: 'x', previous_response_id: r.id, tools: [weather], max_output_tokens: 16,
    input: [{ type: 'function_call_output', call_id: call.call_id, output }],
  });
  const next = await send('{"temp": 21}');
  assert.ok(['completed', 'incomplete'].includes(next.status));
  // The function's output is in the next prompt: a longer output makes it longer by its tokens.
  const longer = await send('{"temp": 21, "sky": "clear", "wind": "light breeze from the west", "rain": "none expected"}');
  const extra = (await client.completions.create({ model: 'x', prompt: ', "sky": "clear", "wind": "light breeze from the west", "rain": "none expected"', max_tokens: 1 })).usage.prompt_tokens;
  const grew = longer.usage.input_tokens - next.usage.input_tokens;
  assert.ok(Math.abs(grew - extra) <= 2, `input grew by ${grew} tokens for ${extra} tokens of output`);
});

test('streaming events carry sequence numbers in order', async () => {
  const stream = await client.responses.create({ model: 'x', input: 'Count', max_output_tokens: 10, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type));
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  const done = events.find((e) => e.type === 'response.output_text.done');
  assert.equal(deltas, done.text);
  assert.equal(events.at(-1).response.output[0].content[0].text, done.text);
});

test('stored responses can be retrieved and deleted, only by their key', async () => {
  const r = await client.responses.create({ model: 'x', input: 'keep me', max_output_tokens: 4 });
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  const other = await fetch(`${srv.base}/v1/responses/${r.id}`, { headers: { Authorization: 'Bearer sk-r2' } });
  assert.equal(other.status, 404, 'another key does not see it');
  const otherDel = await fetch(`${srv.base}/v1/responses/${r.id}`, { method: 'DELETE', headers: { Authorization: 'Bearer sk-r2' } });
  assert.equal(otherDel.status, 404);
  const nokey = await fetch(`${srv.base}/v1/responses/${r.id}`);
  assert.equal(nokey.status, 401);
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
  const unstored = await client.responses.create({ model: 'x', input: 'forget me', store: false, max_output_tokens: 4 });
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);
});
