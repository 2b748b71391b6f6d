// Helpers shared by the tests that start a cluster with `armada cluster up`.
import fs from 'node:fs';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Running, and not a zombie that `cluster up` has yet to reap.
export const alive = (pid) => {
  try {
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
};

// A sanitizer build reports to each process's stderr, which `cluster up` sends to its log, and
// the process's exit code reaches no test: its reports are looked for in the logs instead.
const SANITIZER_REPORT = /WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error: /;

export function sanitizerReports(logsDir) {
  if (!fs.existsSync(logsDir)) return [];
  return fs.readdirSync(logsDir).filter((f) => SANITIZER_REPORT.test(fs.readFileSync(`${logsDir}/${f}`, 'utf8')));
}
