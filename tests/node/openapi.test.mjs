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
  // A media type the route does not have.
  assert.notDeepEqual(problemsWith('GET', '/v1/models', 200, 'text/html', '<p>'), []);
  // Sessions: the state is one of the seven.
  const session = (state) => JSON.stringify({ object: 'list', data: [{ id: 's', object: 'session', agent: 'a', state, created_at: 1, updated_at: 1 }] });
  assert.deepEqual(problemsWith('GET', '/v1/sessions', 200, json, session('running')), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/sessions', 200, json, session('sleeping')), []);
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

test('a real answer fits the document, and the same answer altered does not', async () => {
  const r = await fetch(server.base + '/v1/models');
  const body = await r.text();
  assert.deepEqual(problemsWith('GET', '/v1/models', r.status, r.headers.get('content-type'), body), []);
  assert.notDeepEqual(problemsWith('GET', '/v1/models', r.status, r.headers.get('content-type'), body.replace('"list"', '7')), []);
});
