// The MCP reference server (@modelcontextprotocol/server-everything) over Streamable HTTP, and a
// recording proxy in front of it, for tests that must see which MCP session each request used.
import { spawn } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const everything = path.join(here, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js');

export async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export async function startEverything(port) {
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

// Forwards every request to `target` and records, per request, its JSON-RPC method, the
// session id it carried (or was given by initialize), and the headers named in `watch`.
export async function startRecordingProxy(targetPort, watch = ['authorization', 'x-tenant-token']) {
  const log = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      let method = null;
      try { method = JSON.parse(body).method ?? null; } catch { /* not JSON */ }
      const entry = { method, path: req.url, session: req.headers['mcp-session-id'] ?? null };
      for (const h of watch) entry[h] = req.headers[h] ?? null;
      log.push(entry);
      const up = http.request({ host: '127.0.0.1', port: targetPort, path: req.url, method: req.method, headers: req.headers },
        (r) => {
          if (method === 'initialize') entry.session = r.headers['mcp-session-id'] ?? null;
          res.writeHead(r.statusCode, r.headers);
          r.pipe(res);
        });
      up.on('error', () => { if (!res.headersSent) res.writeHead(502); res.end(); });
      // A client that goes away takes the upstream request with it.
      res.on('close', () => { if (!res.writableFinished) up.destroy(); });
      up.end(body);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${server.address().port}`;
  return { url: `${base}/mcp`, base, log, close: () => new Promise((r) => server.close(r)) };
}

// A server that accepts connections and never answers (a hung MCP server).
export async function startSilentServer() {
  const sockets = new Set();
  const server = net.createServer((s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/mcp`,
    accepted: () => sockets.size,
    close: () => { for (const s of sockets) s.destroy(); return new Promise((r) => server.close(r)); },
  };
}
