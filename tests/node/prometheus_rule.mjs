// deploy/prometheus/armada.rules.yml as a PrometheusRule for the Prometheus Operator: the
// component deploy/kubernetes/components/prometheus-rules holds what this renders, and
// kubernetes.test.mjs fails when it differs. After editing the rules file, write it again with
//   node tests/node/prometheus_rule.mjs
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const rulesFile = path.join(repo, 'deploy/prometheus/armada.rules.yml');
export const ruleObjectFile = path.join(repo, 'deploy/kubernetes/components/prometheus-rules/prometheus-rule.yaml');

export function renderPrometheusRule() {
  const rules = YAML.parse(fs.readFileSync(rulesFile, 'utf8'));
  const obj = {
    apiVersion: 'monitoring.coreos.com/v1',
    kind: 'PrometheusRule',
    metadata: { name: 'armada', labels: { 'app.kubernetes.io/name': 'armada', role: 'alert-rules' } },
    spec: { groups: rules.groups },
  };
  return '# Rendered from deploy/prometheus/armada.rules.yml by tests/node/prometheus_rule.mjs: edit that\n' +
    '# file, then run `node tests/node/prometheus_rule.mjs`.\n' + YAML.stringify(obj, { lineWidth: 0 });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  fs.writeFileSync(ruleObjectFile, renderPrometheusRule());
  console.log(`wrote ${path.relative(repo, ruleObjectFile)}`);
}
