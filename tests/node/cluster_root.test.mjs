// `armada cluster up` run by root from a directory only root may enter (a clone under /root):
// PostgreSQL runs as its own user, which cannot reach the default data directory there, so its
// data goes where that user can reach it, and the cluster comes up. A --data-dir given there stays
// a clear error.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';
import { clusterUp, sanitizerReports, waitFor } from './cluster_helpers.mjs';

const ADMIN = { Authorization: 'Bearer sk-ops', 'Content-Type': 'application/json' };
const root = process.getuid?.() === 0;

test('as root, from a directory only root may enter, the default cluster comes up and PostgreSQL answers', {
  skip: !root && 'cluster up runs PostgreSQL as the postgres user only when started by root', timeout: 300000,
}, async () => {
  const closed = tempDir('armada-rootonly-');
  fs.chmodSync(closed, 0o700);  // as /root is
  let up;
  try {
    up = await clusterUp(['--nodes', '1', '--brains', '1', '-m', tinyModel, '--port', '0', '--api-key', 'sk-ops',
      '--node-arg=-np', '--node-arg=2', '--node-arg=-c', '--node-arg=1024'], { cwd: closed });
    const data = path.join(closed, 'armada-cluster');
    assert.match(up.log(), /is closed to the postgres user: PostgreSQL's data is in \/var\/lib\/armada\/postgres\/[0-9a-f]{16}/);
    const home = fs.readlinkSync(path.join(data, 'postgres'));
    assert.match(home, /^\/var\/lib\/armada\/postgres\/[0-9a-f]{16}$/);
    assert.ok(fs.existsSync(path.join(home, 'data', 'PG_VERSION')), 'the database lives there');
    await waitFor('a node in the cluster', async () =>
      (await fetch(up.gw + '/readyz').then((r) => r.json()).catch(() => null))?.nodes >= 1, 120000);
    // A tenant is a row in PostgreSQL: written, then read back through the gateway.
    const made = await fetch(up.gw + '/admin/tenants', { method: 'POST', headers: ADMIN, body: JSON.stringify({ name: 'acme' }) });
    assert.equal(made.status, 201, await made.text());
    const listed = await (await fetch(up.gw + '/admin/tenants', { headers: ADMIN })).json();
    assert.ok(JSON.stringify(listed).includes('"acme"'), JSON.stringify(listed));
    await up.stop();
    up = null;
    assert.deepEqual(sanitizerReports(path.join(data, 'logs')), [], 'no process logged a sanitizer report');

    // The same directory again: the same database, the tenant still there.
    up = await clusterUp(['--nodes', '1', '--brains', '1', '-m', tinyModel, '--port', '0', '--api-key', 'sk-ops',
      '--node-arg=-np', '--node-arg=2', '--node-arg=-c', '--node-arg=1024'], { cwd: closed });
    assert.equal(fs.readlinkSync(path.join(data, 'postgres')), home);
    const again = await (await fetch(up.gw + '/admin/tenants', { headers: ADMIN })).json();
    assert.ok(JSON.stringify(again).includes('"acme"'), JSON.stringify(again));
    await up.stop();
    up = null;
    fs.rmSync(home, { recursive: true, force: true });
  } finally {
    if (up) await up.stop();
    fs.chmodSync(closed, 0o755);
  }
});

test('as root, a --data-dir the postgres user cannot reach is refused, saying which directory and how to fix it', {
  skip: !root && 'needs root', timeout: 60000,
}, () => {
  const closed = tempDir('armada-rootonly-');
  fs.chmodSync(closed, 0o700);
  const r = spawnSync(process.env.ARMADA_BIN, ['cluster', 'up', '--nodes', '1', '-m', tinyModel, '--port', '0',
    '--data-dir', path.join(closed, 'c')], { encoding: 'utf8', timeout: 50000 });
  assert.equal(r.status, 1, r.stdout + r.stderr);
  assert.match(r.stderr, new RegExp(`the postgres user cannot reach .*: ${closed} does not let other users through \\(chmod o\\+x it, or choose another directory\\)`));
  fs.chmodSync(closed, 0o755);
});
