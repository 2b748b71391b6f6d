// Agent files for the tests, written to a temp dir.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

// Every directory a test file makes goes when its process exits (by then its servers have
// stopped): a whole run leaves gigabytes otherwise, and a CI machine's disk fills. Set
// ARMADA_KEEP_TMP=1 to keep them for a look afterwards.
const madeDirs = [];
function removeTempDirs() {
  if (process.env.ARMADA_KEEP_TMP === '1') {
    if (madeDirs.length) console.log(`kept (ARMADA_KEEP_TMP=1): ${madeDirs.join(' ')}`);
    return;
  }
  for (const dir of madeDirs) {
    try { fs.rmSync(dir, { recursive: true, force: true, maxRetries: 3 }); } catch { /* a server still writing */ }
  }
}

export function tempDir(prefix) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  if (madeDirs.length === 0) process.on('exit', removeTempDirs);
  madeDirs.push(dir);
  return dir;
}

// An agent that must call a tool on each of its first `toolSteps` steps, then answers.
// `toolTimeoutMs` bounds each tool attempt (sanitizer builds, several times slower, pass more).
export function agentYaml(toolUrl, { id = 'worker', toolSteps = 3, maxSteps = 8, extra = '', toolTimeoutMs = 3000 } = {}) {
  return `agents:
  - id: ${id}
    instructions: You are a careful worker. Use the tools, then answer.
    min_tool_steps: ${toolSteps}
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 7 }
    limits: { max_steps: ${maxSteps}, max_tokens_per_step: 96, tool_timeout_ms: ${toolTimeoutMs + 2000} }
    tools:
      - name: lookup
        description: Look up a record
        url: ${toolUrl}/lookup
        timeout_ms: ${toolTimeoutMs}
        retries: 2
        parameters:
          type: object
          properties:
            record: { type: string, enum: [alpha, beta, gamma] }
          required: [record]
          additionalProperties: false
      - name: store
        description: Store a value
        url: ${toolUrl}/store
        timeout_ms: ${toolTimeoutMs}
        retries: 2
        parameters:
          type: object
          properties:
            value: { type: integer, enum: [1, 2, 3] }
          required: [value]
          additionalProperties: false
${extra}`;
}

export function writeAgents(dir, text) {
  const file = path.join(dir, 'agents.yaml');
  fs.writeFileSync(file, text);
  return file;
}

// An agent declared through the API, with numeric schema keywords and limits.
export const richAgent = (toolUrl, id = 'rich') => `id: ${id}
instructions: Use the tool, then answer in one line.
min_tool_steps: 1
answer_without_tools: true
parallel_tool_calls: false
sampling: { temperature: 0.5, seed: 3, top_k: 20, top_p: 0.9 }
limits: { max_steps: 4, max_tokens_per_step: 96, token_budget: 50000, tool_timeout_ms: 4000 }
tools:
  - name: lookup
    description: Look up a record
    url: ${toolUrl}/lookup
    timeout_ms: 3000
    retries: 1
    parameters:
      type: object
      properties:
        record: { type: string, enum: [alpha, beta], maxLength: 5 }
        count: { type: integer, enum: [1, 2, 3], minimum: 1, maximum: 3 }
      required: [record, count]
      additionalProperties: false
`;

