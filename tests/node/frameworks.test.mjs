// Agent frameworks, unmodified, against a node (or a gateway, with ARMADA_VIA_GATEWAY=1): the
// OpenAI Agents SDK over Responses, LangGraph.js over chat completions with a checkpointer, and
// the Vercel AI SDK. The model has random weights, so each test chooses the tool through the
// framework's own tool-choice setting, and checks what Armada must get right: the calls parse and
// fit their schemas, results go back, streams end with their usage, objects fit their schema.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { ChatOpenAI } from '@langchain/openai';
import { tool as lcTool } from '@langchain/core/tools';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';
import { MemorySaver } from '@langchain/langgraph';
import { createReactAgent } from '@langchain/langgraph/prebuilt';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateObject, generateText, stepCountIs, streamText, tool as aiTool } from 'ai';
import { startServer, viaGateway } from './harness.mjs';

const where = viaGateway ? 'a gateway' : 'a node';
let server;
let v1;
before(async () => {
  server = await startServer(['-c', '8192', '-np', '2']);
  v1 = server.base + '/v1';
});
after(async () => { if (server) assert.equal(await server.stop(), 0); });

// What the tools were called with, to check against their schemas.
function weatherTool(calls) {
  return { description: 'The weather in a city', schema: z.object({ city: z.string().max(16) }),
    run: async ({ city }) => { calls.push(['get_weather', { city }]); return `${city}: sunny`; } };
}
function addTool(calls) {
  return { description: 'Adds two numbers', schema: z.object({ a: z.number(), b: z.number() }),
    run: async ({ a, b }) => { calls.push(['add', { a, b }]); return String(a + b); } };
}

// ---- OpenAI Agents SDK (@openai/agents), over the Responses API ----
setTracingDisabled(true);  // nothing goes to api.openai.com

function agents(calls, toolChoice, toolUseBehavior = 'stop_on_first_tool') {
  const w = weatherTool(calls);
  const a = addTool(calls);
  const expert = new Agent({ name: 'Expert', instructions: 'Answer in one short sentence.', model: 'armada',
    modelSettings: { maxTokens: 12, temperature: 0 } });
  const triage = new Agent({
    name: 'Triage', instructions: 'Use the tools, or hand the question to the expert.', model: 'armada',
    tools: [agentTool({ name: 'get_weather', description: w.description, parameters: w.schema, execute: w.run }),
      agentTool({ name: 'add', description: a.description, parameters: a.schema, execute: a.run })],
    handoffs: [expert],
    // The tool the model must call first. With stop_on_first_tool the run ends with that tool's
    // result; with run_llm_again the result goes back to the model (its tool choice reset to
    // auto), which answers. A handoff runs on either way.
    modelSettings: { toolChoice, maxTokens: 64, temperature: 0 },
    toolUseBehavior,
  });
  const runner = new Runner({ modelProvider: new OpenAIProvider({ baseURL: v1, apiKey: 'sk-armada', useResponses: true }) });
  return { triage, runner };
}

for (const stream of [false, true]) {
  test(`Agents SDK on ${where}: two function tools and a handoff over Responses${stream ? ', streaming' : ''}`, async () => {
    const calls = [];
    // Each tool in turn, then the handoff.
    for (const [choice, check] of [
      ['get_weather', (out) => assert.match(out, /: sunny$/)],
      ['add', (out) => assert.ok(Number.isFinite(Number(out)), `add returned ${out}`)],
    ]) {
      const { triage, runner } = agents(calls, choice);
      const r = await runner.run(triage, 'What is the weather in Paris, and 2 + 3?', { stream });
      let deltas = 0;
      if (stream) {
        for await (const ev of r) if (ev.type === 'raw_model_stream_event') deltas++;
        await r.completed;
        assert.ok(deltas > 0, 'the stream had no events');
      }
      check(r.finalOutput);
      assert.equal(r.lastAgent.name, 'Triage');
      assert.ok(r.lastResponseId, 'no response id');
    }
    assert.deepEqual(calls.map((c) => c[0]), ['get_weather', 'add']);
    assert.equal(typeof calls[0][1].city, 'string');
    assert.equal(typeof calls[1][1].a, 'number');
    const { triage, runner } = agents(calls, 'transfer_to_Expert');
    const r = await runner.run(triage, 'A hard question for the expert.', { stream });
    if (stream) {
      for await (const ev of r) void ev;
      await r.completed;
    }
    assert.equal(r.lastAgent.name, 'Expert', 'the handoff did not happen');
    assert.equal(typeof r.finalOutput, 'string');
    assert.equal(calls.length, 2, 'a tool ran during the handoff');
    // The whole loop: the call, its result back to the model (function_call_output), an answer.
    const loop = agents(calls, 'get_weather', 'run_llm_again');
    const answered = await loop.runner.run(loop.triage, 'What is the weather in Paris?', { stream, maxTurns: 4 });
    if (stream) {
      for await (const ev of answered) void ev;
      await answered.completed;
    }
    assert.equal(calls.length, 3);
    const kinds = answered.newItems.map((i) => i.type);
    assert.deepEqual(kinds.slice(0, 2), ['tool_call_item', 'tool_call_output_item'], kinds.join(', '));
    assert.equal(kinds.at(-1), 'message_output_item', kinds.join(', '));
    assert.equal(typeof answered.finalOutput, 'string');
  });
}

// ---- LangGraph.js (@langchain/langgraph with @langchain/openai), over chat completions ----
test(`LangGraph.js on ${where}: a ReAct agent with tools and a checkpointer, across two turns`, async () => {
  const calls = [];
  const w = weatherTool(calls);
  const a = addTool(calls);
  const tools = [lcTool(w.run, { name: 'get_weather', description: w.description, schema: w.schema }),
    lcTool(a.run, { name: 'add', description: a.description, schema: a.schema })];
  const llm = new ChatOpenAI({ model: 'armada', apiKey: 'sk-armada', temperature: 0, maxTokens: 64,
    useResponsesApi: false, configuration: { baseURL: v1 } });
  // The agent's model, chosen per call: after the user speaks a tool must be called, after a
  // tool's result the model answers.
  const model = (state) => {
    const last = state.messages.at(-1);
    return llm.bindTools(tools, { tool_choice: last instanceof HumanMessage ? 'required' : 'none', parallel_tool_calls: false });
  };
  const agent = createReactAgent({ llm: model, tools, checkpointSaver: new MemorySaver() });
  const thread = { configurable: { thread_id: 'conversation-1' } };
  const first = await agent.invoke({ messages: [{ role: 'user', content: 'What is the weather in Paris?' }] }, thread);
  const toolResults = first.messages.filter((m) => m instanceof ToolMessage);
  assert.equal(toolResults.length, 1, 'the first turn ran no tool');
  assert.equal(calls.length, 1);
  assert.equal(first.messages.at(-1).tool_calls?.length ?? 0, 0, 'the turn did not end with an answer');
  assert.ok(first.messages.at(-1).usage_metadata?.total_tokens > 0, 'no usage');
  // The second turn goes on from the checkpoint: the whole first turn is sent again with it.
  const second = await agent.invoke({ messages: [{ role: 'user', content: 'And what is 2 + 3?' }] }, thread);
  assert.equal(second.messages.length, first.messages.length + 4);
  assert.equal(second.messages.filter((m) => m instanceof ToolMessage).length, 2);
  assert.equal(calls.length, 2);
  for (const [name, args] of calls) {
    assert.ok(['get_weather', 'add'].includes(name));
    (name === 'add' ? a : w).schema.parse(args);
  }
  // Streamed (messages mode): the answer comes in pieces from the same checkpointed thread.
  let pieces = 0;
  for await (const [chunk, meta] of await agent.stream({ messages: [{ role: 'user', content: 'Once more?' }] },
    { ...thread, streamMode: 'messages' })) {
    if (meta.langgraph_node === 'agent' && chunk) pieces++;
  }
  assert.ok(pieces > 1, `the stream came in ${pieces} piece(s)`);
  assert.equal(calls.length, 3);
});

// ---- Vercel AI SDK (ai with @ai-sdk/openai-compatible), over chat completions ----
function aiSdk(calls) {
  const provider = createOpenAICompatible({ name: 'armada', baseURL: v1, apiKey: 'sk-armada', includeUsage: true,
    supportsStructuredOutputs: true });
  const w = weatherTool(calls);
  const a = addTool(calls);
  const tools = {
    get_weather: aiTool({ description: w.description, inputSchema: w.schema, execute: w.run }),
    add: aiTool({ description: a.description, inputSchema: a.schema, execute: a.run }),
  };
  // Step 1 must call a tool; step 2 answers with its result.
  const prepareStep = ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' });
  return { model: provider.chatModel('armada'), tools, prepareStep };
}

test(`Vercel AI SDK on ${where}: generateText with tools and steps`, async () => {
  const calls = [];
  const { model, tools, prepareStep } = aiSdk(calls);
  const r = await generateText({ model, tools, prepareStep, stopWhen: stepCountIs(4), maxOutputTokens: 64,
    temperature: 0, prompt: 'What is the weather in Paris?' });
  assert.equal(r.steps.length, 2);
  assert.equal(r.steps[0].toolCalls.length >= 1, true);
  assert.equal(r.steps[0].toolResults.length, r.steps[0].toolCalls.length);
  assert.equal(calls.length, r.steps[0].toolCalls.length);
  assert.equal(r.steps[1].toolCalls.length, 0);
  assert.ok(r.totalUsage.inputTokens > 0 && r.totalUsage.outputTokens > 0);
});

test(`Vercel AI SDK on ${where}: streamText with tools reports its usage`, async () => {
  const calls = [];
  const { model, tools, prepareStep } = aiSdk(calls);
  const s = streamText({ model, tools, prepareStep, stopWhen: stepCountIs(4), maxOutputTokens: 64, temperature: 0,
    prompt: 'What is the weather in Paris?' });
  let text = '';
  for await (const d of s.textStream) text += d;
  const usage = await s.totalUsage;
  assert.ok(usage.inputTokens > 0 && usage.outputTokens > 0, `usage: ${JSON.stringify(usage)}`);
  assert.ok(['stop', 'length'].includes(await s.finishReason));
  assert.equal((await s.steps).length, 2);
  assert.ok(calls.length >= 1);
  assert.equal(typeof text, 'string');
});

test(`Vercel AI SDK on ${where}: generateObject fits its schema`, async () => {
  const { model } = aiSdk([]);
  // Bounded, so that a random model's string or list ends within the tokens allowed.
  const schema = z.object({ name: z.string().max(16), age: z.number().int(), languages: z.array(z.enum(['en', 'fr', 'de'])).max(3) });
  const r = await generateObject({ model, schema, schemaName: 'person', maxOutputTokens: 96, temperature: 0,
    prompt: 'Ada Lovelace, 36, spoke English and French.' });
  schema.parse(r.object);
  assert.ok(r.usage.inputTokens > 0);
});
