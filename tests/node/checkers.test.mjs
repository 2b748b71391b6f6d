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
