// The chaos run's checks fed what they exist to catch, so that a green chaos run means something:
// a session started on two nodes in one epoch, a forked or incomplete transcript, and a finished
// tool call sent again. Each is also fed what must pass.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { assertCompleteLog, assertNoFinishedCallRepeated, sessionsRunTwiceInAnEpoch } from './session_helpers.mjs';

test('a session started on two nodes in one epoch is caught, whichever way each node took it', () => {
  const a = '[..] [info] cluster: running session s1 (epoch 1)\n[..] [info] cluster: running session s2 (epoch 1)\n';
  const b = '[..] [info] cluster: session s2 moved here from a (epoch 2, kv: transfer)\n' +
    '[..] [info] session s3: runs here under epoch 4 (claimed by this node)\n';
  assert.deepEqual(sessionsRunTwiceInAnEpoch([{ name: 'a', text: a }, { name: 'b', text: b }]), [], 'moves are new epochs');
  for (const line of ['cluster: running session s1 (epoch 1)', 'cluster: session s1 moved here from a (epoch 1, kv: none)',
    'session s1: assigned to this node (epoch 1) but not running here; started',
    'session s1: runs here under epoch 1 (claimed by this node)']) {
    assert.deepEqual(sessionsRunTwiceInAnEpoch([{ name: 'a', text: a }, { name: 'c', text: `[..] ${line}\n` }]),
      ['s1@1 on a and c'], line);
  }
});

const session = (steps) => ({
  id: 's', steps,
  transcript: [{ role: 'user' }, { role: 'assistant' }, { role: 'tool' }, { role: 'assistant' }],
});
const whole = () => [
  { seq: 1, kind: 'model_output' }, { seq: 2, kind: 'tool_call', idempotency_key: 's:1:0' },
  { seq: 3, kind: 'tool_result', idempotency_key: 's:1:0', ts_ms: 5000 }, { seq: 4, kind: 'model_output' },
];

test('a forked or incomplete transcript is caught', () => {
  assertCompleteLog(session(whole()), 1);
  const gap = whole().filter((x) => x.seq !== 2);
  assert.throws(() => assertCompleteLog(session(gap), 1), /no gap or repeat/);
  const again = whole();
  again.splice(3, 0, { seq: 4, kind: 'tool_result', idempotency_key: 's:1:0' });
  again[4].seq = 5;
  assert.throws(() => assertCompleteLog(session(again), 1));
  const twoCalls = [...whole().slice(0, 3), { seq: 4, kind: 'tool_call', idempotency_key: 's:1:0' },
    { seq: 5, kind: 'tool_result', idempotency_key: 's:1:0' }, { seq: 6, kind: 'model_output' }];
  assert.throws(() => assertCompleteLog(session(twoCalls), 2), /no tool call repeated|tool_result/);
});

test('a finished call sent again is caught; one outstanding at a fault is allowed', () => {
  const sessions = [session(whole())];
  const tools = (again, last) => ({
    replays: new Map([['s:1:0', 1]]), replayAt: new Map([['s:1:0', again]]),
    arrivals: new Map([['s:1:0', [1000, last]]]), firstAt: new Map([['s:1:0', 1000]]),
  });
  // Outstanding at the fault (t=4000): its result (5000) came after, the repeat arrived before it.
  assertNoFinishedCallRepeated(tools(4500, 4500), sessions, [4000]);
  // Finished (5000) before the only fault (6000), then sent again: the bug.
  assert.throws(() => assertNoFinishedCallRepeated(tools(6500, 6500), sessions, [6000]), /had finished before any fault/);
  // Sent again with no fault at all.
  assert.throws(() => assertNoFinishedCallRepeated(tools(5500, 5500), sessions, []), /had finished/);
  // First sent 3 s into the only fault (two nodes ran the session after it): not outstanding at
  // it, when the check asks when the call was first sent; a call first sent 1 s into it is.
  const late = { ...tools(4500, 4500), firstAt: new Map([['s:1:0', 3000]]) };
  assertNoFinishedCallRepeated(late, sessions, [0]);
  assert.throws(() => assertNoFinishedCallRepeated(late, sessions, [0], { firstSentWithinMs: 2000 }), /had finished/);
  assertNoFinishedCallRepeated({ ...late, firstAt: new Map([['s:1:0', 1000]]) }, sessions, [0], { firstSentWithinMs: 2000 });
});

test('a repeat the holder made itself, or the node a session moved to, is allowed; a second runner is not', () => {
  const tools = (arrivals) => ({
    replays: new Map([['s:1:0', arrivals.length - 1]]), replayAt: new Map([['s:1:0', arrivals[1] + 500]]),
    arrivals: new Map([['s:1:0', arrivals]]), firstAt: new Map([['s:1:0', arrivals[0]]]),
  });
  const result = (attempts) => ({ seq: 3, kind: 'tool_result', idempotency_key: 's:1:0', ts_ms: 5000, data: { attempts } });
  const withResult = (attempts, extra = []) => [session([...whole().slice(0, 2), ...extra, result(attempts), whole()[3]])];
  // No fault at all. A timeout retry: the durable result says it took two attempts.
  assertNoFinishedCallRepeated(tools([1000, 4100]), withResult(2), []);
  assert.throws(() => assertNoFinishedCallRepeated(tools([1000, 4100]), withResult(1), []), /after 1 attempt/);
  // Two attempts do not excuse two repeats.
  assert.throws(() => assertNoFinishedCallRepeated(tools([1000, 2000, 4100]), withResult(2), []), /sent 3 times/);
  // The session moved (a failover) between the first copy and the repeat: the new holder sent it.
  const movedAt = (t) => [{ seq: 3, kind: 'moved', ts_ms: t }];
  assertNoFinishedCallRepeated(tools([1000, 4100]), withResult(1, movedAt(3000)), []);
  // Both copies came after the move: two nodes ran the session after it, which no move excuses.
  assert.throws(() => assertNoFinishedCallRepeated(tools([3500, 4100]), withResult(1, movedAt(3000)), []), /moves 3000/);
  // A repeat after the result was durable is caught whatever the attempts and moves.
  assert.throws(() => assertNoFinishedCallRepeated(tools([1000, 5100]), withResult(2, movedAt(3000)), [0]), /had finished/);
});
