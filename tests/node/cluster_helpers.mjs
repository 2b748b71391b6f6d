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
