// Every answer Armada gives a black-box test is checked against docs/openapi.json, so the
// document cannot drift from the code. harness.mjs installs `checkedFetch` as the global fetch:
// a response that carries `Server: armada` (a node's or a gateway's, never a tool server's or
// llama-server's) must have a documented route, method and status, and a JSON body that fits the
// schema documented for it. A mismatch throws from fetch, naming the route and what differs.
import fs from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

export const documentPath = new URL('../../docs/openapi.json', import.meta.url);
const doc = JSON.parse(fs.readFileSync(documentPath, 'utf8'));

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

function deref(obj) {
  let o = obj;
  while (o && o.$ref) {
    const parts = o.$ref.replace(/^#\//, '').split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
    o = parts.reduce((x, k) => x?.[k], doc);
  }
  return o;
}

const compiled = new Map();
function validatorAt(ref) {
  if (!compiled.has(ref)) compiled.set(ref, ajv.compile({ $ref: 'openapi.json' + ref }));
  return compiled.get(ref);
}

// The documented answer for METHOD path and status: { where, media, schemaRef } or a reason it
// has none. `where` names the route in messages.
export function documented(method, pathname, status) {
  const route = routes.find((r) => r.re.test(pathname));
  if (!route) return { problem: `no route in docs/openapi.json matches ${pathname}` };
  const op = doc.paths[route.template][method.toLowerCase()];
  const where = `${method} ${route.template}`;
  if (!op) return { where, problem: `docs/openapi.json has no ${method} for ${route.template}` };
  const key = [String(status), `${String(status)[0]}XX`, 'default'].find((k) => op.responses?.[k]);
  if (!key) return { where, problem: `status ${status} is not documented for ${where}` };
  const response = deref(op.responses[key]);
  // The schema is reached through the operation, or through components.responses for a $ref.
  const base = op.responses[key].$ref
    ? op.responses[key].$ref.replace(/^#\//, '').split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'))
    : ['paths', route.template, method.toLowerCase(), 'responses', key];
  return { where, key, response, base };
}

// Checks one answer. `body` is its text (undefined for a stream that was not read). Returns a
// list of problems, empty when it fits.
export function problemsWith(method, pathname, status, contentType, body) {
  const d = documented(method, pathname, status);
  if (d.problem) {
    // An unknown route or method is fine when the answer is the documented error.
    if (status >= 400 && (!d.where || d.problem.includes('has no'))) {
      return problemsWithError(contentType, body, d.problem);
    }
    return [d.problem];
  }
  const content = d.response.content;
  if (!content) return body ? [`${d.where} answered ${status} with a body, documented as having none`] : [];
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  if (!content[media]) {
    return [`${d.where} answered ${status} as '${media}'; documented: ${Object.keys(content).join(', ')}`];
  }
  if (media !== 'application/json' || body === undefined) return [];
  let value;
  try { value = JSON.parse(body); } catch { return [`${d.where} answered ${status} with a body that is not JSON`]; }
  const validate = validatorAt(pointer([...d.base, 'content', media, 'schema']));
  if (validate(value)) return [];
  return validate.errors.map((e) => `${d.where} ${status}: ${e.instancePath || '(body)'} ${e.message}` +
    (e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : ''));
}

function problemsWithError(contentType, body, context) {
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  if (media !== 'application/json' || body === undefined) return [`${context}, and the answer is not a JSON error`];
  let value;
  try { value = JSON.parse(body); } catch { return [`${context}, and the answer is not JSON`]; }
  const validate = validatorAt('#/components/schemas/Error');
  return validate(value) ? [] : validate.errors.map((e) => `${context}: ${e.instancePath} ${e.message}`);
}

// Counts what was checked, so a run can say it checked something.
export const checkedCount = { responses: 0 };

export async function checkResponse(method, url, res) {
  if (res.headers.get('server') !== 'armada') return;
  const contentType = res.headers.get('content-type');
  const media = (contentType ?? '').split(';')[0].trim().toLowerCase();
  const body = media === 'application/json' && method !== 'HEAD' ? await res.clone().text() : undefined;
  const problems = problemsWith(method, url.pathname, res.status, contentType, body);
  checkedCount.responses++;
  if (problems.length) {
    throw new Error(`the answer to ${method} ${url.pathname} does not fit docs/openapi.json:\n  ` +
      problems.slice(0, 8).join('\n  ') + `\nbody: ${(body ?? '').slice(0, 600)}`);
  }
}

const realFetch = globalThis.fetch;
export async function checkedFetch(input, init) {
  const res = await realFetch(input, init);
  const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
  const method = (init?.method ?? (typeof input === 'object' && !(input instanceof URL) ? input.method : 'GET') ?? 'GET')
    .toUpperCase();
  await checkResponse(method, url, res);
  return res;
}

// Off with ARMADA_OPENAPI_CHECK=0 (to see a test's own failure first while changing the document).
if (process.env.ARMADA_OPENAPI_CHECK !== '0' && globalThis.fetch !== checkedFetch) globalThis.fetch = checkedFetch;
