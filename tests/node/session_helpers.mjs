// Helpers shared by the session tests.
import assert from 'node:assert/strict';

export async function getJson(base, route, headers = {}) {
  const r = await fetch(base + route, { headers });
  return { status: r.status, json: await r.json().catch(() => null) };
}

export async function waitFor(base, id, states, { timeoutMs = 60000, headers = {} } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await getJson(base, `/v1/sessions/${id}`, headers);
    if (r.status === 200 && states.includes(r.json.state)) return r.json;
    if (Date.now() > deadline) throw new Error(`session ${id} stuck: ${JSON.stringify(r.json?.state)} ${r.json?.reason}`);
    await new Promise((res) => setTimeout(res, 50));
  }
}

// Checks that a finished session's log has every step once, in order.
export function assertCompleteLog(s, toolSteps) {
  const kinds = s.steps.map((x) => x.kind);
  const seqs = s.steps.map((x) => x.seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1), 'step numbers run 1..n with no gap or repeat');
  assert.equal(kinds.filter((k) => k === 'model_output').length, toolSteps + 1, JSON.stringify(kinds));
  assert.equal(kinds.filter((k) => k === 'tool_call').length, toolSteps);
  assert.equal(kinds.filter((k) => k === 'tool_result').length, toolSteps);
  const keys = s.steps.filter((x) => x.kind === 'tool_call').map((x) => x.idempotency_key);
  assert.equal(new Set(keys).size, keys.length, 'no tool call repeated');
  for (const k of keys) {
    assert.match(k, new RegExp(`^${s.id}:\\d+:\\d+$`));
    assert.equal(s.steps.filter((x) => x.kind === 'tool_result' && x.idempotency_key === k).length, 1);
  }
  const roles = s.transcript.map((m) => m.role);
  assert.equal(roles[0], 'user');
  assert.equal(roles.at(-1), 'assistant');
  assert.equal(roles.filter((r) => r === 'tool').length, toolSteps);
}


// A repeated delivery is allowed only for a call that was still outstanding, and every copy of
// it arrived before its result was durable (a repeat of a finished call is the bug this catches).
// An outstanding call may be sent again for one of three reasons:
// - the node that holds it tried again (a timeout): no more repeats than the durable result's
//   `attempts` counts beyond the first;
// - its session moved (a failover) after the call was first sent and before the repeat: the
//   node that took it over sends it again (a `moved` step lies between the two);
// - a fault began while it was outstanding: its result was durable after the fault began, and
//   the repeat answered after it.
// When the tool server first read a call says little: a request a process wrote just before its
// SIGKILL is still delivered by the kernel, and on 2 loaded cores the server may read it late.
//
// `firstSentWithinMs`, when given, also requires that the call was first sent before that fault
// began, or at most this long after it (a request written just before a SIGKILL is read late):
// a call first sent well into a fault was not outstanding at it. Two nodes that each run the
// session after a node was stopped past its lease (fencing or the lease gate broken) both send
// its next call seconds after the stop began, before its result is durable: only this tells
// that apart from a re-send. (Their first copy is sent after the session's move, so the move
// does not excuse it either.)
export function assertNoFinishedCallRepeated(tools, sessions, kills, { firstSentWithinMs = Infinity } = {}) {
  const resultAt = new Map();
  const attemptsOf = new Map();
  const movesOf = new Map();  // key -> when its session's `moved` steps were written
  for (const s of sessions) {
    const moves = s.steps.filter((x) => x.kind === 'moved').map((x) => x.ts_ms);
    for (const st of s.steps.filter((x) => x.kind === 'tool_result')) {
      resultAt.set(st.idempotency_key, st.ts_ms);
      attemptsOf.set(st.idempotency_key, Number(st.data?.attempts ?? 1));
      movesOf.set(st.idempotency_key, moves);
    }
  }
  for (const [k, n] of tools.replays) {
    const done = resultAt.get(k);
    const again = tools.replayAt.get(k);
    const arrived = tools.arrivals.get(k) ?? [];
    const lastArrival = arrived.at(-1);
    const first = tools.firstAt.get(k);
    const attempts = attemptsOf.get(k) ?? 1;
    const moves = movesOf.get(k) ?? [];
    const repeatArrived = arrived[1] ?? again;
    const retried = n <= attempts - 1;
    const moved = moves.some((m) => first <= m && m <= repeatArrived);
    const atFault = kills.some((t) => done >= t && again >= t && !(first > t + firstSentWithinMs));
    assert.ok((retried || moved || atFault) && lastArrival <= done,
      `key ${k} was sent ${n + 1} times, but it had finished before any fault, or was first sent well after the fault began (first sent ${first}, ` +
      `repeated ${again}, arrivals ${arrived}, result ${done} after ${attempts} attempt(s), moves ${moves}, faults ${kills})`);
  }
}

// The runs the nodes' logs record, as "session@epoch" → the nodes that started it under that
// epoch (a placement, a move here, an adoption of an assignment, a takeover). `logs` is
// [{ name, text }]. Returns those started on more than one node: "id@epoch on a and b".
export function sessionsRunTwiceInAnEpoch(logs) {
  const ranOn = new Map();
  const patterns = [/cluster: running session (\S+) \(epoch (\d+)\)/g, /cluster: session (\S+) moved here from \S+ \(epoch (\d+)/g,
    /session (\S+): assigned to this node \(epoch (\d+)\) but not running here; started/g,
    /session (\S+): runs here under epoch (\d+) \(claimed by this node\)/g];
  for (const { name, text } of logs) {
    for (const re of patterns) {
      for (const m of text.matchAll(re)) {
        const k = `${m[1]}@${m[2]}`;
        if (!ranOn.has(k)) ranOn.set(k, new Set());
        ranOn.get(k).add(name);
      }
    }
  }
  return [...ranOn].filter(([, nodes]) => nodes.size > 1).map(([k, nodes]) => `${k} on ${[...nodes].join(' and ')}`);
}
