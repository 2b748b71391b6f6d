// `armada serve -m FILE` refuses broken and hostile model files with a message, never a crash.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { tinyModel } from './harness.mjs';
import { tempDir } from './agents.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

test('bad GGUF files are rejected with an error and exit code 1', () => {
  const dir = tempDir('armada-badmodels-');
  const gen = spawnSync('python3', [path.join(here, '../badmodels/make_bad_ggufs.py'), tinyModel, dir], { encoding: 'utf8' });
  assert.equal(gen.status, 0, gen.stderr);
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.gguf')).sort();
  assert.deepEqual(files, ['block_count.gguf', 'huge_n_kv.gguf', 'not_gguf.gguf', 'oversized_string.gguf',
    'tensor_past_eof.gguf', 'truncated.gguf']);
  for (const f of [...files, 'missing.gguf']) {
    const r = spawnSync(process.env.ARMADA_BIN, ['serve', '-m', path.join(dir, f), '--port', '0',
      '--data-dir', path.join(dir, 'data')], { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.signal, null, `${f}: killed by ${r.signal}\n${r.stderr.slice(-500)}`);
    assert.equal(r.status, 1, `${f}: exit ${r.status}\n${r.stderr.slice(-500)}`);
    assert.match(r.stderr, /error: (model file not found|model file .* is rejected|llama\.cpp could not load)/, f);
  }
});
