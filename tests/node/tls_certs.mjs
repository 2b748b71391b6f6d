// A test CA and certificates made with the openssl command: one for localhost signed by the CA,
// one naming another host, one that expired in 2020, and one from a CA nobody trusts.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

function openssl(dir, args) {
  const r = spawnSync('openssl', args, { cwd: dir, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: ${r.stderr}`);
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];

function makeCa(dir, name) {
  fs.mkdirSync(path.join(dir, name), { recursive: true });
  const d = path.join(dir, name);
  openssl(d, ['req', '-x509', ...EC, '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '3', '-subj', `/CN=${name}`]);
  fs.writeFileSync(path.join(d, 'index.txt'), '');
  fs.writeFileSync(path.join(d, 'serial'), '01\n');
  fs.writeFileSync(path.join(d, 'ca.cnf'), `[ ca ]\ndefault_ca = test\n[ test ]\ndir = .\ndatabase = index.txt\n` +
    `new_certs_dir = .\nserial = serial\ndefault_md = sha256\npolicy = any\ncopy_extensions = copy\n` +
    `[ any ]\ncommonName = supplied\n`);
  return d;
}

// A key and certificate for `sans` (e.g. "DNS:localhost,IP:127.0.0.1") signed by the CA in `ca`.
function issue(ca, name, sans, dates) {
  openssl(ca, ['req', '-new', ...EC, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`,
    '-addext', `subjectAltName=${sans}`]);
  openssl(ca, ['ca', '-batch', '-config', 'ca.cnf', '-cert', 'ca.crt', '-keyfile', 'ca.key', '-in', `${name}.csr`,
    '-out', `${name}.crt`, ...dates]);
  return { key: path.join(ca, `${name}.key`), cert: path.join(ca, `${name}.crt`) };
}

export function makeCerts(dir) {
  const ca = makeCa(dir, 'armada-test-ca');
  const rogue = makeCa(dir, 'untrusted-ca');
  const days = ['-days', '3'];
  return {
    ca: path.join(ca, 'ca.crt'),
    good: issue(ca, 'good', 'DNS:localhost,IP:127.0.0.1', days),
    wrongHost: issue(ca, 'elsewhere', 'DNS:other.example', days),
    expired: issue(ca, 'old', 'DNS:localhost,IP:127.0.0.1', ['-startdate', '20200101000000Z', '-enddate', '20200102000000Z']),
    untrusted: issue(rogue, 'rogue', 'DNS:localhost,IP:127.0.0.1', days),
  };
}
