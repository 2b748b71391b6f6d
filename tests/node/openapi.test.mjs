// The OpenAPI document: what a node or a gateway serves at /openapi.json is the repository's
// docs/openapi.json, and the checker every black-box test runs its answers through refuses what
// the document does not say. (redocly lints the document in ctest's openapi_lint.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, viaGateway } from './harness.mjs';
import { checkedCount, documentPath, problemsWith } from './openapi_check.mjs';

const json = 'application/json';
const error = (message) => JSON.stringify({ error: { message, type: 'invalid_request_error', param: null, code: null } });

test('the checker passes what the document says and refuses what it does not', () => {
  const models = JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model', created: 1, owned_by: 'armada' }] });
  assert.deepEqual(problemsWith('GET', '/v1/models', 200, json, models), []);
  // A body of the wrong shape, a status nobody documented, a route that does not exist.
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 200, json, JSON.stringify({ object: 'list', data: 5 })), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 200, json, JSON.stringify({ object: 'list', data: [{ object: 'model' }] })), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 201, json, models), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/unheard-of', 200, json, '{}'), []);
  // Errors: the one shape, on any route, even one the document does not have.
  assert.deepEqual(problemsWith('GET', '/v1/unheard-of', 404, json, error('no route')), []);
  assert.deepEqual(problemsWith('PUT', '/v1/models', 405, json, error('use GET')), []);
  assert.deepEqual(problemsWith('GET', '/v1/sessions/s1', 404, json, error('no session')), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions/s1', 404, json, JSON.stringify({ message: 'no session' })), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions/s1', 404, 'text/plain', 'no session'), []);
  // A field the document does not name (objects are closed for the check).
  const extra = JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model', created: 1, owned_by: 'armada', colour: 'red' }] });
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 200, json, extra), []);
  // An error status the route does not list, even in the error shape (only the few any route
  // may give pass through `default`).
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 500, json, error('boom')), []);
  assert.deepEqual(problemsWith('GET', '/v1/models', 401, json, error('no key')), []);
  // A media type the route does not have.
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 200, 'text/html', '<p>'), []);
  // Sessions: the state is one of the seven.
  const session = (state) => JSON.stringify({ object: 'list', data: [{ id: 's', object: 'session', agent: 'a', state, created_at: 1, updated_at: 1 }] });
  assert.deepEqual(problemsWith('GET', '/v1/sessions', 200, json, session('running')), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions', 200, json, session('sleeping')), []);
});

test('the checker reads an event stream event by event', () => {
  const chunk = (o) => 'data: ' + JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm', ...o }) + '\n\n';
  const good = chunk({ choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }) +
    chunk({ choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: 'stop' }] }) + 'data: [DONE]\n\n';
  assert.deepEqual(problemsWith('POST', '/v1/chat/completions', 200, 'text/event-stream', good), []);
  const wrong = chunk({ choices: [{ index: 0, delta: { content: 7 } }] });
  assert.notDeepEqual(problemsWith('POST', '/v1/chat/completions', 200, 'text/event-stream', wrong), []);
  // A session's events, by name.
  const state = 'id: 3\nevent: state\ndata: {"state":"completed"}\n\n';
  assert.deepEqual(problemsWith('GET', '/v1/sessions/s/events', 200, 'text/event-stream', state), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions/s/events', 200, 'text/event-stream', state.replace('completed', 'asleep')), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions/s/events', 200, 'text/event-stream', 'event: gossip\ndata: {}\n\n'), []);
});

let server;
before(async () => { server = await startServer(); });
after(async () => { if (server) assert.equal(await server.stop(), 0); });

test(`${viaGateway ? 'a gateway' : 'a node'} serves the repository's document at /openapi.json without a key`, async () => {
  const before = checkedCount.responses;
  const r = await fetch(server.base + '/openapi.json');
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^application\/json/);
  const served = await r.json();
  assert.deepEqual(served, JSON.parse(fs.readFileSync(documentPath, 'utf8')));
  assert.equal(served.openapi, '3.1.0');
  // The answer itself went through the checker, as every fetch of an Armada answer does.
  assert.equal(checkedCount.responses, before + 1);
  const post = await fetch(server.base + '/openapi.json', { method: 'POST' });
  assert.equal(post.status, 405);
});

test('a real stream is checked as it is read', async () => {
  const before = checkedCount.events;
  const r = await fetch(server.base + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, stream: true, stream_options: { include_usage: true } }) });
  assert.equal(r.status, 200);
  const text = await r.text();
  assert.match(text, /data: \[DONE\]/);
  assert.ok(checkedCount.events - before >= 3, `only ${checkedCount.events - before} events were checked`);
});

test('a real answer fits the document, and the same answer altered does not', async () => {
  const r = await fetch(server.base + '/v1/models');
  const body = await r.text();
  assert.deepEqual(problemsWith('GET', '/v1/models', r.status, r.headers.get('content-type'), body), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/models', r.status, r.headers.get('content-type'), body.replace('"list"', '7')), []);
});
