// A small OTLP/HTTP collector for the trace tests: it takes JSON export requests on /v1/traces
// and keeps their spans, flattened. With `refuse` set it answers 503, as a collector that is
// down or overloaded would.
import http from 'node:http';

function attrValue(v) {
  if ('stringValue' in v) return v.stringValue;
  if ('intValue' in v) return Number(v.intValue);
  if ('doubleValue' in v) return v.doubleValue;
  if ('boolValue' in v) return v.boolValue;
  return undefined;
}

function attrs(list = []) {
  return Object.fromEntries(list.map((a) => [a.key, attrValue(a.value)]));
}

export async function startOtlpReceiver() {
  const spans = [];
  const state = { refuse: false, refused: 0, requests: 0, badBodies: 0 };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      state.requests++;
      if (req.method !== 'POST' || req.url !== '/v1/traces') {
        res.writeHead(404);
        res.end();
        return;
      }
      if (state.refuse) {
        state.refused++;
        res.writeHead(503);
        res.end();
        return;
      }
      let j;
      try {
        j = JSON.parse(body);
      } catch {
        state.badBodies++;
        res.writeHead(400);
        res.end();
        return;
      }
      for (const rs of j.resourceSpans ?? []) {
        const resource = attrs(rs.resource?.attributes);
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) {
            spans.push({ ...s, attributes: attrs(s.attributes), service: resource['service.name'], resource });
          }
        }
      }
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end('{}');
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    endpoint: `http://127.0.0.1:${server.address().port}`,
    spans,
    state,
    close: () => new Promise((r) => server.close(r)),
  };
}
