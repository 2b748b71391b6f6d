// A nemesis on the real cluster: `armada cluster up` with 2 cells of 3 nodes, 2 brains per cell,
// 2 global brains and 2 gateways, every server behind a proxy that can hang (`--fault-proxies`).
// For ARMADA_CHAOS_S seconds (180 in `make test`, 600 in `make chaos`) a seeded nemesis kills
// (-9), stops and continues nodes, brains and gateways, restarts each dependency and hangs it,
// while sessions of 3 tool steps come in through both gateways. Then every session must complete,
// no finished tool call may have been sent again, no session may have run on two nodes in one
// epoch (from the nodes' logs), and no transcript may have forked. It prints the faults and the
// outcome per cell, and writes a report (ARMADA_CHAOS_REPORT, or chaos-report.json in the data
// directory).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { tinyModel } from './harness.mjs';
import { startToolServer } from './tool_server.mjs';
import { agentYaml, tempDir, writeAgents } from './agents.mjs';
import { assertCompleteLog, assertNoFinishedCallRepeated, sessionsRunTwiceInAnEpoch } from './session_helpers.mjs';
import { alive, clusterUp, sleep } from './cluster_helpers.mjs';

const timing = process.env.ARMADA_TIMING !== '0';
const SLOW = timing ? 1 : 4;
const TTL_S = timing ? 3 : 8;
const CHAOS_S = Number(process.env.ARMADA_CHAOS_S ?? 180);
const SESSIONS = Number(process.env.ARMADA_CHAOS_SESSIONS ?? (CHAOS_S >= 600 ? 300 : 90));
const SEED = Number(process.env.ARMADA_CHAOS_SEED ?? (Date.now() % 1000000));
const ENDED = ['completed', 'failed', 'cancelled'];
// Sessions of eight tenants (an admin acting as each), so that both cells take some: a tenant's
// new sessions follow its home cell.
const ADMIN = 'admin-key-for-chaos';
const TENANTS = ['chaos0', 'chaos1', 'chaos2', 'chaos3', 'chaos4', 'chaos5', 'chaos6', 'chaos7'];
const as = (tenant, extra = {}) => ({ Authorization: `Bearer ${ADMIN}`, 'X-Armada-Tenant': `t:${tenant}`, ...extra });

let tools;
let dir;
let up;

const status = () => JSON.parse(fs.readFileSync(path.join(dir, 'cluster.json'), 'utf8'));
const procs = () => status().processes;
const gateways = () => status().gateways;

// A small seeded generator (mulberry32): the same seed gives the same faults in the same order.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// A request through whichever gateway answers: a client of a cluster with two entries tries the
// other when one does not answer. `null` when neither did within `ms`.
async function viaGateway(route, init = {}, ms = 60000) {
  const deadline = Date.now() + ms * SLOW;
  for (let i = 0; Date.now() < deadline; i++) {
    const gws = gateways();
    const gw = gws[i % gws.length];
    try {
      const r = await fetch(gw + route, { ...init, signal: AbortSignal.timeout(10000) });
      if (r.status < 500) return r;
    } catch { /* refused, reset or timed out: the other one */ }
    await sleep(200);
  }
  return null;
}

before(async () => {
  tools = await startToolServer({ minDelayMs: 300, maxDelayMs: 900 });
  dir = tempDir('armada-chaos-');
  fs.chmodSync(dir, 0o755);  // PostgreSQL runs as its own user and must reach its directory
  const agents = writeAgents(dir, agentYaml(tools.url, { toolSteps: 3, maxSteps: 6, toolTimeoutMs: 3000 * SLOW }));
  up = await clusterUp(['--cells', '2', '--nodes', '3', '--brains', '2', '--globals', '2', '--gateways', '2',
    '--fault-proxies', '-m', tinyModel, '--data-dir', path.join(dir, 'c'), '--port', '0', '--agents', agents,
    '--lease-ttl', String(TTL_S), '--node-arg=--tool-allow', '--node-arg=127.0.0.1', '--node-arg=-np',
    '--node-arg=8', '--node-arg=-c', '--node-arg=16384', '--node-arg=-t', '--node-arg=1'],
  { timeoutMs: 180000 * SLOW, env: { ...process.env, ARMADA_API_KEY: ADMIN } });
  dir = path.join(dir, 'c');
  // Ready: six nodes behind both gateways, and a split that names both cells.
  const deadline = Date.now() + 180000 * SLOW;
  for (;;) {
    const r = await Promise.all(gateways().map((g) => fetch(g + '/readyz').then((x) => x.json()).catch(() => null)));
    if (r.length === 2 && r.every((x) => x?.nodes >= 6 && Object.keys(x.cell_weights ?? {}).length === 2)) break;
    if (Date.now() > deadline) throw new Error('the cluster did not become ready: ' + JSON.stringify(r));
    await sleep(500);
  }
  for (const name of TENANTS) {
    const r = await viaGateway('/admin/tenants', {
      method: 'POST', headers: { Authorization: `Bearer ${ADMIN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name }),
    });
    assert.equal(r?.status, 201, r ? await r.text() : 'no gateway answered');
  }
});

after(async () => {
  // Nothing left hung or stopped, so the cluster stops cleanly.
  for (const f of Object.values(status().proxies ?? {})) fs.rmSync(f.hang_file, { force: true });
  for (const p of procs()) if (alive(p.pid)) try { process.kill(p.pid, 'SIGCONT'); } catch { /* gone */ }
  await up?.stop();
  await tools?.close?.();
});

test(`a seeded nemesis for ${CHAOS_S} s: every session completes, no finished call is sent again, no session runs twice in an epoch`, { timeout: (CHAOS_S + 900) * 1000 * SLOW }, async () => {
  const random = rng(SEED);
  const pick = (xs) => xs[Math.floor(random() * xs.length)];
  const between = (lo, hi) => lo + Math.floor(random() * (hi - lo));
  const faults = [];  // { at_ms, what }
  const kills = [];   // when each fault began: a call outstanding then may be sent again
  const t0 = Date.now();
  const end = t0 + CHAOS_S * 1000;
  console.log(`chaos: seed ${SEED} (replay: ARMADA_CHAOS_SEED=${SEED}), ${CHAOS_S} s, ${SESSIONS} sessions`);

  // The load: sessions through both gateways over the first two thirds of the window.
  const ids = [];
  const tenantOf = new Map();
  const refused = [];
  const load = (async () => {
    const every = (CHAOS_S * 1000 * 2 / 3) / SESSIONS;
    for (let i = 0; i < SESSIONS; i++) {
      const at = t0 + i * every;
      if (Date.now() < at) await sleep(at - Date.now());
      const tenant = TENANTS[i % TENANTS.length];
      const r = await viaGateway('/v1/agents/worker/sessions', {
        method: 'POST', headers: as(tenant, { 'Content-Type': 'application/json' }), body: JSON.stringify({ input: `chaos ${i}` }),
      });
      if (r?.status === 201) {
        const id = (await r.json()).id;
        ids.push(id);
        tenantOf.set(id, tenant);
      }
      else refused.push(r ? `${r.status} ${await r.text()}` : 'no gateway answered');
    }
  })();

  // The nemesis: one fault at a time, a pause between.
  const note = (what) => {
    const at = Date.now() - t0;
    faults.push({ at_ms: at, what });
    kills.push(Date.now());
    console.log(`chaos: t=${(at / 1000).toFixed(1)}s ${what}`);
  };
  // Of `nodes`, the one running the most of the latest sessions, as their rows say (none: null).
  const busiestNode = async (nodes) => {
    const running = new Map();
    await Promise.all(ids.slice(-16).map(async (id) => {
      const r = await viaGateway(`/v1/sessions/${id}`, { headers: as(tenantOf.get(id)) }, 2000);
      const s = r?.status === 200 ? await r.json() : null;
      const n = s && !ENDED.includes(s.state) ? s.placement?.node : null;
      if (n) running.set(n, (running.get(n) ?? 0) + 1);
    }));
    let best = null;
    for (const x of nodes) if ((running.get(x.name) ?? 0) > (running.get(best?.name) ?? 0)) best = x;
    return best;
  };
  const armada = () => procs().filter((p) => ['node', 'cell', 'global', 'gateway'].includes(p.role) && alive(p.pid));
  while (Date.now() < end) {
    await sleep(between(4000, 10000));
    if (Date.now() >= end) break;
    const kind = pick(['kill', 'kill', 'stop', 'stop', 'restart', 'hang', 'hang']);
    if (kind === 'kill' || kind === 'stop') {
      // Never both gateways at once: a client needs an entry (each one is restarted by cluster up).
      const live = armada();
      const gws = live.filter((p) => p.role === 'gateway');
      // Half of these go to a node: nodes hold the sessions, and are the fewer of the processes
      // a uniform pick would take (6 of 14), so a short run would seldom move a session.
      const nodes = live.filter((x) => x.role === 'node');
      const p = nodes.length && random() < 0.5 ? pick(nodes) : pick(live.filter((x) => x.role !== 'gateway' || gws.length > 1));
      if (!p) continue;
      if (kind === 'kill') {
        note(`kill -9 ${p.name} (${p.role})`);
        process.kill(p.pid, 'SIGKILL');
      } else {
        // Half of a node's stops outlast its lease: it wakes to find its sessions moved on, with
        // steps and calls of its own still in hand (what fencing and the lease gate are for).
        // Such a stop goes to the node running the most sessions now, so that it has some.
        const long = p.role === 'node' && random() < 0.5;
        const ms = long ? TTL_S * 1000 + between(2000, 6000) : between(1000, 8000);
        const q = long ? (await busiestNode(nodes)) ?? p : p;
        note(`SIGSTOP ${q.name} (${q.role}) for ${ms} ms`);
        process.kill(q.pid, 'SIGSTOP');
        await sleep(ms);
        try { process.kill(q.pid, 'SIGCONT'); } catch { /* gone */ }
      }
    } else if (kind === 'restart') {
      const [name, server] = pick(Object.entries(status().servers));
      note(`restart ${name} (kill -9 ${server.pid})`);
      try { process.kill(server.pid, 'SIGKILL'); } catch { /* already gone */ }
    } else {
      const [name, proxy] = pick(Object.entries(status().proxies));
      const ms = between(2000, 8000);
      note(`${name} hangs for ${ms} ms`);
      fs.writeFileSync(proxy.hang_file, '');
      await sleep(ms);
      fs.rmSync(proxy.hang_file, { force: true });
    }
  }
  await load;
  console.log(`chaos: faults over; ${ids.length} sessions acknowledged, ${refused.length} refused`);

  // Every acknowledged session completes.
  const deadline = Date.now() + 600000 * SLOW;
  let done = new Map();
  for (;;) {
    const now = await Promise.all(ids.map(async (id) => {
      const r = await viaGateway(`/v1/sessions/${id}`, { headers: as(tenantOf.get(id)) }, 20000);
      return r?.status === 200 ? r.json() : null;
    }));
    done = new Map(now.filter((s) => s && ENDED.includes(s.state)).map((s) => [s.id, s]));
    if (done.size === ids.length || Date.now() > deadline) break;
    await sleep(2000);
  }

  // Which nodes ran each session at each epoch, from the nodes' logs.
  const twice = sessionsRunTwiceInAnEpoch(procs().filter((x) => x.role === 'node')
    .map((p) => ({ name: p.name, text: fs.readFileSync(p.log, 'utf8') })));

  // The outcome per cell, and the report.
  const byCell = {};
  for (const s of done.values()) {
    const c = (s.placement?.node ?? '?').replace(/-node\d+$/, '');
    byCell[c] ??= { completed: 0, other: 0, moves: 0 };
    if (s.state === 'completed') byCell[c].completed++; else byCell[c].other++;
    byCell[c].moves += (s.placement?.moves ?? []).length;
  }
  const report = {
    seed: SEED, chaos_s: CHAOS_S, sessions: ids.length, refused, ended: done.size, faults, by_cell: byCell,
    ran_twice_in_an_epoch: twice,
    calls_repeated: [...tools.replays].map(([k, n]) => ({ key: k, repeats: n })),
  };
  const reportFile = process.env.ARMADA_CHAOS_REPORT ?? path.join(dir, 'chaos-report.json');
  fs.writeFileSync(reportFile, JSON.stringify(report, null, 2));
  console.log(`chaos: ${faults.length} faults; per cell ${JSON.stringify(byCell)}; report ${reportFile}`);

  assert.equal(done.size, ids.length, `${ids.length - done.size} of ${ids.length} sessions did not end`);
  assert.deepEqual(twice, [], 'no session ran on two nodes in one epoch');
  for (const s of done.values()) {
    assert.equal(s.state, 'completed', `${s.id}: ${s.reason}`);
    assertCompleteLog(s, 3);  // no transcript forked: steps 1..n once each, each call once
  }
  const mine = new Set([...done.values()].flatMap((s) => s.steps.map((x) => x.idempotency_key).filter(Boolean)));
  const replays = new Map([...tools.replays].filter(([k]) => mine.has(k)));
  // A call outstanding at a fault was sent before it began (read by the tool server at most
  // 2 s late); a node that runs on after it lost its session sends calls well after.
  try {
    assertNoFinishedCallRepeated({ ...tools, replays }, [...done.values()], kills, { firstSentWithinMs: 2000 });
  } catch (e) {
    // What every process logged about the session, so a failure in CI says which node sent what.
    const id = /key (sess_[a-z0-9]+):/.exec(e.message)?.[1];
    const lines = id ? procs().flatMap((p) => fs.readFileSync(p.log, 'utf8').split('\n')
      .filter((l) => l.includes(id)).map((l) => `${p.name}: ${l}`)) : [];
    e.message += `\nlogged about ${id}:\n${lines.slice(0, 60).join('\n')}`;
    throw e;
  }
});
