// Agent files for the tests, written to a temp dir.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export function tempDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// An agent that must call a tool on each of its first `toolSteps` steps, then answers.
export function agentYaml(toolUrl, { id = 'worker', toolSteps = 3, maxSteps = 8, extra = '' } = {}) {
  return `agents:
  - id: ${id}
    instructions: You are a careful worker. Use the tools, then answer.
    min_tool_steps: ${toolSteps}
    answer_without_tools: true
    parallel_tool_calls: false
    sampling: { temperature: 0.7, seed: 7 }
    limits: { max_steps: ${maxSteps}, max_tokens_per_step: 96, tool_timeout_ms: 5000 }
    tools:
      - name: lookup
        description: Look up a record
        url: ${toolUrl}/lookup
        timeout_ms: 3000
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
        timeout_ms: 3000
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
