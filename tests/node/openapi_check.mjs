// Every answer Armada gives a black-box test is checked against docs/openapi.json, so the
// document cannot drift from the code. This module installs `checkedFetch` as the global fetch
// (harness.mjs and cluster_helpers.mjs import it); tests that talk through node:http or
// node:https call `assertFits`. An answer that carries `Server: armada` (a node's or a gateway's,
// never a tool server's or llama-server's) must have:
// - a documented route and method, and a status listed for it (or one of the few any route
//   gives: a bad request, a missing key, a refusal, overload);
// - a documented media type;
// - a JSON body that fits the schema, with no field the schema does not name;
// - for an event stream, each event's data fitting the schema named for its event.
// A mismatch throws from fetch (or errors the stream), naming the route and what differs.
// ARMADA_OPENAPI_REPORT=FILE appends each mismatch to FILE as a JSON line instead, so that one
// run of the suite lists all of them.
import fs from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

export const documentPath = new URL('../../docs/openapi.json', import.meta.url);
const doc = JSON.parse(fs.readFileSync(documentPath, 'utf8'));
const reportFile = process.env.ARMADA_OPENAPI_REPORT;

// Statuses any route may answer with the error shape, before or besides its own work: the
// request could not be read, no key or a wrong one, a key without the right, a listener that
// does not serve the path (a node's metrics listener serves /metrics and the probes only), too
// many requests, the server not ready or overloaded.
const anyRoute = new Set([400, 401, 403, 404, 413, 414, 429, 431, 503]);
// And a path that is no route, or a method a route does not take.
const noRoute = new Set([400, 401, 403, 404, 405, 413, 414, 431]);

// Objects are closed for the check: a field the code sends that the document does not name is
// drift. (A schema that is part of an allOf stays open; the allOf itself is closed.)
function closeObjects(schema, inAllOf = false) {
  if (Array.isArray(schema)) { for (const s of schema) closeObjects(s); return; }
  if (!schema || typeof schema !== 'object') return;
  if (schema.allOf) {
    for (const s of schema.allOf) closeObjects(s, true);
  }
  for (const [k, v] of Object.entries(schema)) {
    if (k === 'allOf' || k === 'example' || k === 'examples' || k.startsWith('x-')) continue;
    if (k === 'properties') { for (const p of Object.values(v)) closeObjects(p); continue; }
    if (k === 'then' || k === 'if') continue;
    closeObjects(v);
  }
  const closable = (schema.properties || schema.allOf) && !inAllOf && schema.additionalProperties === undefined &&
    schema.unevaluatedProperties === undefined;
  if (closable) schema.unevaluatedProperties = false;
}
const allOfMembers = new Set();
(function collect(x) {
  if (Array.isArray(x)) return x.forEach(collect);
  if (!x || typeof x !== 'object') return;
  if (x.allOf) for (const m of x.allOf) if (m.$ref) allOfMembers.add(m.$ref.split('/').pop());
  Object.values(x).forEach(collect);
})(doc);
for (const [name, schema] of Object.entries(doc.components.schemas)) closeObjects(schema, allOfMembers.has(name));
for (const item of Object.values(doc.paths)) {
  for (const op of Object.values(item)) {
    for (const r of Object.values(op?.responses ?? {})) {
      for (const m of Object.values(r.content ?? {})) closeObjects(m.schema);
    }
  }
}

const ajv = new Ajv2020({ strict: false, allErrors: true, validateSchema: false });
addFormats(ajv);
// OpenAPI's own formats for numbers say how wide they are, nothing a value can fail.
for (const f of ['int32', 'int64', 'float', 'double']) ajv.addFormat(f, true);
ajv.addSchema(doc, 'openapi.json');

// Literal paths win over templated ones (/v1/sessions before /v1/sessions/{id}).
const routes = Object.keys(doc.paths)
  .map((template) => ({
    template,
    literal: !template.includes('{'),
    re: new RegExp('^' + template.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^}]+\\?\}/g, '[^/]+') + '$'),
  }))
  .sort((a, b) => Number(b.literal) - Number(a.literal));

function pointer(parts) {
  return '#/' + parts.map((p) => String(p).replace(/~/g, '~0').replace(/\//g, '~1')).join('/');
}
function unpointer(ref) {
  return ref.replace(/^#\//, '').split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
}
function deref(obj) {
  let o = obj;
  while (o && o.$ref) o = unpointer(o.$ref).reduce((x, k) => x?.[k], doc);
  return o;
}

const compiled = new Map();
function validatorAt(ref) {
  if (!compiled.has(ref)) compiled.set(ref, ajv.compile({ $ref: 'openapi.json' + ref }));
  return compiled.get(ref);
}
function schemaProblems(ref, value, where) {
  const validate = validatorAt(ref);
  if (validate(value)) return [];
  return validate.errors.map((e) => `${where}: ${e.instancePath || '(body)'} ${e.message}` +
    (e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : ''));
}

// The documented answer for METHOD path and status: { where, response, base } or a problem.
export function documented(method, pathname, status) {
  const route = routes.find((r) => r.re.test(pathname));
  if (!route) return { problem: `no route in docs/openapi.json matches ${pathname}`, noRoute: true };
  const op = doc.paths[route.template][method.toLowerCase()];
  const where = `${method} ${route.template}`;
  if (!op) return { where, problem: `docs/openapi.json has no ${method} for ${route.template}`, noRoute: true };
  let key = [String(status), `${String(status)[0]}XX`].find((k) => op.responses?.[k]);
  if (!key && anyRoute.has(status) && op.responses?.default) key = 'default';
  if (!key) return { where, problem: `status ${status} is not documented for ${where}` };
  const base = op.responses[key].$ref ? unpointer(op.responses[key].$ref)
    : ['paths', route.template, method.toLowerCase(), 'responses', key];
  return { where, key, response: deref(op.responses[key]), base };
}

// The events of an event stream's text: [{ event, data }].
export function parseEvents(text) {
  const out = [];
  for (const block of text.replace(/\r\n/g, '\n').split('\n\n')) {
    let event = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (data.length) out.push({ event, data: data.join('\n') });
  }
  return out;
}

function eventProblems(d, media, events) {
  const map = d.response.content[media]['x-armada-events'];
  if (!map) return [];
  const problems = [];
  for (const { event, data } of events) {
    if (data === '[DONE]') continue;
    const name = map[event] ? event : map['*'] ? '*' : null;
    if (!name) { problems.push(`${d.where}: an event named '${event}' is not documented`); continue; }
    let value;
    try { value = JSON.parse(data); } catch { problems.push(`${d.where}: event '${event}' has data that is not JSON`); continue; }
    problems.push(...schemaProblems(pointer([...d.base, 'content', media, 'x-armada-events', name]), value,
      `${d.where} event '${event}'`));
  }
  return problems;
}

// Checks one answer. `body` is its text (undefined when it was not read); `events`, for a
// stream, the events read so far. Returns a list of problems, empty when it fits.
export function problemsWith(method, pathname, status, contentType, body) {
  const d = documented(method, pathname, status);
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  if (d.problem) {
    if (d.noRoute && noRoute.has(status)) return errorProblems(media, body, d.problem);
    return [d.problem];
  }
  const content = d.response.content;
  if (!content) return body ? [`${d.where} answered ${status} with a body, documented as having none`] : [];
  if (!content[media]) {
    return [`${d.where} answered ${status} as '${media}'; documented: ${Object.keys(content).join(', ')}`];
  }
  if (body === undefined) return [];
  if (media === 'text/event-stream') return eventProblems(d, media, parseEvents(body));
  if (media !== 'application/json') return [];
  let value;
  try { value = JSON.parse(body); } catch { return [`${d.where} answered ${status} with a body that is not JSON`]; }
  return schemaProblems(pointer([...d.base, 'content', media, 'schema']), value, `${d.where} ${status}`);
}

function errorProblems(media, body, context) {
  if (media !== 'application/json' || body === undefined) return [`${context}, and the answer is not a JSON error`];
  let value;
  try { value = JSON.parse(body); } catch { return [`${context}, and the answer is not JSON`]; }
  return schemaProblems('#/components/schemas/Error', value, context);
}

// Counts what was checked, so a run can say it checked something.
export const checkedCount = { responses: 0, events: 0 };

function complain(method, pathname, problems, body) {
  if (!problems.length) return null;
  if (reportFile) {
    for (const p of problems) fs.appendFileSync(reportFile, JSON.stringify({ method, path: pathname, problem: p, body: (body ?? '').slice(0, 400) }) + '\n');
    return null;
  }
  return new Error(`the answer to ${method} ${pathname} does not fit docs/openapi.json:\n  ` +
    problems.slice(0, 8).join('\n  ') + `\nbody: ${(body ?? '').slice(0, 600)}`);
}

// An event stream passes through unchanged while its events are checked as they come; one that
// does not fit errors the stream at that event.
function checkedStream(method, pathname, res) {
  const d = documented(method, pathname, res.status);
  if (d.problem) return res;
  const decoder = new TextDecoder();
  let pending = '';
  const check = (text, controller) => {
    pending += text;
    const cut = pending.replace(/\r\n/g, '\n').lastIndexOf('\n\n');
    if (cut < 0) return;
    const whole = pending.replace(/\r\n/g, '\n');
    const events = parseEvents(whole.slice(0, cut + 2));
    pending = whole.slice(cut + 2);
    checkedCount.events += events.length;
    const err = complain(method, pathname, eventProblems(d, 'text/event-stream', events), whole.slice(0, cut + 2));
    if (err) controller.error(err);
  };
  const inspector = new TransformStream({
    transform(chunk, controller) {
      controller.enqueue(chunk);
      check(decoder.decode(chunk, { stream: true }), controller);
    },
    flush(controller) { check(decoder.decode() + '\n\n', controller); },
  });
  const wrapped = new Response(res.body.pipeThrough(inspector), { status: res.status, statusText: res.statusText, headers: res.headers });
  Object.defineProperty(wrapped, 'url', { value: res.url });
  return wrapped;
}

export async function checkResponse(method, url, res) {
  if (res.headers.get('server') !== 'armada') return res;
  const contentType = res.headers.get('content-type');
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  const body = media === 'application/json' && method !== 'HEAD' ? await res.clone().text() : undefined;
  checkedCount.responses++;
  const err = complain(method, url.pathname, problemsWith(method, url.pathname, res.status, contentType, body), body);
  if (err) throw err;
  return media === 'text/event-stream' && res.body ? checkedStream(method, url.pathname, res) : res;
}

// The same check for a test that talks through node:http or node:https (TLS with its own CA, a
// pool of its own sockets): `headers` as node gives them (lower-case names), `text` the whole
// body (an event stream's too, once it ended). Throws on a mismatch.
export function assertFits(method, url, status, headers, text) {
  if (headers?.server !== 'armada') return;
  const pathname = new URL(url).pathname;
  const contentType = headers['content-type'];
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  const body = media === 'application/json' || media === 'text/event-stream' ? text : undefined;
  checkedCount.responses++;
  const err = complain(method, pathname, problemsWith(method, pathname, status, contentType, body), text);
  if (err) throw err;
}

const realFetch = globalThis.fetch;
export async function checkedFetch(input, init) {
  const res = await realFetch(input, init);
  const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
  const method = (init?.method ?? (typeof input === 'object' && !(input instanceof URL) ? input.method : 'GET') ?? 'GET')
    .toUpperCase();
  return checkResponse(method, url, res);
}

// Off with ARMADA_OPENAPI_CHECK=0 (to see a test's own failure first while changing the document).
if (process.env.ARMADA_OPENAPI_CHECK !== '0' && globalThis.fetch !== checkedFetch) globalThis.fetch = checkedFetch;
