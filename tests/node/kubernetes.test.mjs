// The Kubernetes manifests under deploy/kubernetes, checked offline: every object is valid
// against the Kubernetes API's OpenAPI schemas (the kubernetes-models package), the example
// overlay renders with kustomize (`kubectl kustomize`, when kubectl is installed) into objects
// that are valid too, the pods ask for what the README promises, and every flag a pod passes
// exists in the armada binary.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { renderPrometheusRule, ruleObjectFile, rulesFile } from './prometheus_rule.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../deploy/kubernetes');
const base = path.join(root, 'base');
const overlay = path.join(root, 'overlays/example');

function docs(text) {
  return YAML.parseAllDocuments(text).map((d) => d.toJS()).filter((o) => o);
}

function baseObjects() {
  const k = YAML.parse(fs.readFileSync(path.join(base, 'kustomization.yaml'), 'utf8'));
  return k.resources.flatMap((f) => docs(fs.readFileSync(path.join(base, f), 'utf8')));
}

// The model class for an object's apiVersion and kind, from kubernetes-models.
async function modelOf(obj) {
  const [group, version] = obj.apiVersion.includes('/') ? obj.apiVersion.split('/') : [null, obj.apiVersion];
  // The Prometheus Operator's kinds (the alert rules) come from its own package of models.
  const pkg = group === 'monitoring.coreos.com' ? '@kubernetes-models/prometheus-operator' : 'kubernetes-models';
  const mod = await import(group ? `${pkg}/${group}/${version}` : `${pkg}/${version}`);
  const Model = mod[obj.kind];
  assert.ok(Model, `kubernetes-models knows ${obj.apiVersion} ${obj.kind}`);
  return Model;
}

async function assertValid(obj) {
  const Model = await modelOf(obj);
  try {
    new Model(obj).validate();
  } catch (e) {
    assert.fail(`${obj.kind} ${obj.metadata?.name}: ${e.message}`);
  }
}

const find = (objs, kind, name) => {
  const o = objs.find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `${kind} ${name} is there`);
  return o;
};

const argOf = (args, flag) => {
  const a = args.find((x) => x.startsWith(`--${flag}=`));
  return a ? a.slice(flag.length + 3) : undefined;
};

const gib = (q) => {
  const m = /^(\d+(?:\.\d+)?)(Gi|G|Mi)$/.exec(q);
  assert.ok(m, `a size: ${q}`);
  return Number(m[1]) * (m[2] === 'Mi' ? 1 / 1024 : 1);
};

test('every object of the base is valid against the Kubernetes API schemas', async () => {
  const objs = baseObjects();
  assert.ok(objs.length >= 8);
  for (const o of objs) await assertValid(o);
});

test('the example overlay\'s own objects are valid too, with or without kustomize', async () => {
  const k = YAML.parse(fs.readFileSync(path.join(overlay, 'kustomization.yaml'), 'utf8'));
  const own = (k.resources ?? []).filter((r) => r.endsWith('.yaml'));
  assert.ok(own.length > 0, 'the overlay adds objects of its own');
  for (const f of own) for (const o of docs(fs.readFileSync(path.join(overlay, f), 'utf8'))) await assertValid(o);
});

test('a schema error is caught (the check can fail)', async () => {
  const node = find(baseObjects(), 'StatefulSet', 'armada-node');
  node.spec.template.spec.containers[0].ports[0].containerPort = 'eighty';
  await assert.rejects(assertValid(node), /containerPort/);
});

test('nodes are a Guaranteed StatefulSet with whole CPUs, probes, a drain and a disruption budget', () => {
  const objs = baseObjects();
  const node = find(objs, 'StatefulSet', 'armada-node');
  const pod = node.spec.template.spec;
  const c = pod.containers[0];
  // Guaranteed QoS: requests equal limits for CPU and memory; CPUs whole, for the static CPU manager.
  assert.deepEqual(c.resources.requests, c.resources.limits);
  assert.match(String(c.resources.limits.cpu), /^\d+$/);
  // Memory is at least 1.5 x (weights + KV budget); a 7B Q4_K_M model is about 4.4 GiB.
  assert.ok(gib(c.resources.limits.memory) >= 1.5 * (4.4 + gib(argOf(c.args, 'kv-budget'))));
  assert.equal(c.livenessProbe.httpGet.path, '/livez');
  assert.equal(c.readinessProbe.httpGet.path, '/readyz');
  assert.match(c.lifecycle.preStop.exec.command.join(' '), /kill -TERM 1/);
  assert.ok(pod.terminationGracePeriodSeconds > Number(argOf(c.args, 'drain-timeout')),
    'the grace period outlasts the drain');
  assert.equal(argOf(c.args, 'threads'), String(c.resources.limits.cpu), 'one compute thread per CPU');
  const pdb = find(objs, 'PodDisruptionBudget', 'armada-node');
  assert.deepEqual(pdb.spec.selector.matchLabels, node.spec.selector.matchLabels);
  const svc = find(objs, 'Service', 'armada-node');
  assert.equal(svc.spec.clusterIP, 'None');
  assert.equal(node.spec.serviceName, svc.metadata.name);
});

test('two of each brain, a gateway Deployment behind a Service, the config and the keys', () => {
  const objs = baseObjects();
  for (const name of ['armada-cell0', 'armada-global']) assert.equal(find(objs, 'Deployment', name).spec.replicas, 2);
  const gw = find(objs, 'Deployment', 'armada-gateway');
  const svc = find(objs, 'Service', 'armada');
  assert.deepEqual(svc.spec.selector, gw.spec.selector.matchLabels);
  const cm = find(objs, 'ConfigMap', 'armada-cluster');
  const cluster = YAML.parse(cm.data['cluster.yaml']);
  for (const k of ['etcd', 'nats', 'redis', 'postgres']) assert.ok(cluster[k], `cluster.yaml names ${k}`);
  // No `password:` setting and no user:password@ in a URL (password_file names a file).
  assert.ok(!/(^|[{\s,])password\s*:|:\/\/[^/@:]+:[^@/]+@/m.test(cm.data['cluster.yaml']), 'no password in the ConfigMap');
  // Each server is reached as a user with a password from a file, over TLS checked against a CA,
  // and every pod that reads the config has those files.
  for (const k of ['etcd', 'nats', 'redis'])
    assert.ok(cluster.credentials?.[k]?.password_file && cluster.credentials[k].ca_file, `credentials for ${k}: ${JSON.stringify(cluster.credentials?.[k])}`);
  assert.ok(cluster.credentials.postgres?.ca_file, 'PostgreSQL over TLS');
  const files = new Set(Object.values(cluster.credentials).flatMap((c) => [c.password_file, c.ca_file]).filter(Boolean));
  for (const w of objs.flatMap((o) => o.spec?.template?.spec ? [o.spec.template.spec] : [])) {
    const c = w.containers[0];
    const mount = c.volumeMounts.find((m) => m.name === 'services');
    assert.ok(mount, 'a pod mounts the services Secret');
    for (const f of files) assert.ok(f.startsWith(mount.mountPath + '/'), `${f} is under ${mount.mountPath}`);
    const vol = w.volumes.find((v) => v.name === 'services');
    assert.equal(vol.secret.defaultMode & 0o077, 0, 'no one else may read the files');
  }
  // Every Secret a pod names is one the example overlay makes.
  const made = YAML.parse(fs.readFileSync(path.join(overlay, 'kustomization.yaml'), 'utf8'))
    .secretGenerator.map((s) => s.name);
  let refs = 0;
  for (const w of objs.flatMap((o) => o.spec?.template?.spec ? [o.spec.template.spec] : [])) {
    for (const v of w.volumes ?? []) {
      if (!v.secret) continue;
      assert.ok(made.includes(v.secret.secretName), v.secret.secretName);
      refs++;
    }
    for (const c of w.containers) {
      for (const e of c.env ?? []) {
        const ref = e.valueFrom?.secretKeyRef;
        if (!ref) continue;
        assert.ok(made.includes(ref.name), ref.name);
        refs++;
      }
    }
  }
  assert.ok(refs >= 5, 'pods take their keys and the PostgreSQL password from Secrets');
});

test('every flag a pod passes exists in the armada binary', () => {
  const bin = process.env.ARMADA_BIN;
  assert.ok(bin, 'ARMADA_BIN is set');
  const help = new Map();
  for (const o of baseObjects()) {
    const pod = o.spec?.template?.spec;
    if (!pod) continue;
    for (const c of pod.containers) {
      const [sub, ...rest] = c.args;
      if (!help.has(sub)) {
        const r = spawnSync(bin, [sub, '--help'], { encoding: 'utf8' });
        assert.equal(r.status, 0, r.stderr);
        help.set(sub, r.stdout);
      }
      for (const a of rest) {
        const flag = a.split('=')[0];
        assert.match(flag, /^--[a-z-]+$/, `${o.metadata.name}: ${a}`);
        assert.ok(new RegExp(`(^|[ ,])${flag}[ ,\\n]`, 'm').test(help.get(sub)),
          `${o.metadata.name}: armada ${sub} has no ${flag}`);
      }
    }
  }
});

test('the example overlay renders with kustomize into valid objects', async (t) => {
  const which = spawnSync('sh', ['-c', 'command -v kubectl'], { encoding: 'utf8' });
  if (which.status !== 0) {
    t.skip('kubectl is not installed: the kustomize output is not checked here');
    return;
  }
  const r = spawnSync('kubectl', ['kustomize', overlay], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  const objs = docs(r.stdout);
  for (const o of objs) {
    // kustomize wraps a Secret's base64 over lines; the API server's decoder skips the line
    // breaks, the schema's "byte" format does not.
    if (o.kind === 'Secret') for (const k of Object.keys(o.data ?? {})) o.data[k] = o.data[k].replace(/\s+/g, '');
    await assertValid(o);
  }
  for (const o of objs.filter((x) => x.kind !== 'Namespace')) assert.equal(o.metadata.namespace, 'agents', o.metadata.name);
  const node = find(objs, 'StatefulSet', 'armada-node');
  assert.equal(node.spec.replicas, 4);
  const c = node.spec.template.spec.containers[0];
  assert.equal(c.image, 'registry.example.com/armada:0.1.0');
  assert.deepEqual(c.resources.requests, c.resources.limits);
  assert.equal(argOf(c.args, 'threads'), String(c.resources.limits.cpu));
  assert.ok(gib(c.resources.limits.memory) >= 1.5 * (4.4 + gib(argOf(c.args, 'kv-budget'))));
  find(objs, 'Secret', 'armada-keys');
  find(objs, 'Secret', 'armada-postgres');
  find(objs, 'Secret', 'armada-peer');
});

test('rollouts drive the node StatefulSet: the global brain\'s account may do what the restarter does', () => {
  const objs = baseObjects();
  const global = find(objs, 'Deployment', 'armada-global');
  assert.ok(global.spec.template.spec.containers[0].args.includes('--restarter=kubernetes'));
  const account = global.spec.template.spec.serviceAccountName;
  find(objs, 'ServiceAccount', account);
  const binding = objs.find((o) => o.kind === 'RoleBinding' && o.subjects.some((s) => s.kind === 'ServiceAccount' && s.name === account));
  assert.ok(binding, `a RoleBinding for ${account}`);
  const role = find(objs, 'Role', binding.roleRef.name);
  const may = (group, resource, verb) => role.rules.some((r) => r.apiGroups.includes(group) &&
    r.resources.includes(resource) && r.verbs.includes(verb));
  // What cluster/kube_restarter.cpp calls.
  for (const [g, res, v] of [['apps', 'statefulsets', 'get'], ['apps', 'statefulsets', 'patch'],
    ['apps', 'controllerrevisions', 'get'], ['', 'pods', 'get'], ['', 'pods', 'delete']])
    assert.ok(may(g, res, v), `${v} ${g || 'core'}/${res}`);
  // A partition only works with RollingUpdate (the default), and the nodes read their version
  // label from the environment the restarter patches.
  const node = find(objs, 'StatefulSet', 'armada-node');
  assert.notEqual(node.spec.updateStrategy?.type, 'OnDelete');
  const c = node.spec.template.spec.containers[0];
  assert.equal(c.name, 'armada');
  const label = c.env.find((e) => e.name === 'ARMADA_VERSION_LABEL')?.value;
  assert.ok(label, 'the nodes\' version label is in their environment');
  assert.equal(node.spec.template.metadata.annotations['armada.dev/version'], label);
});

test('the alert rules ship as a PrometheusRule the example overlay includes, valid and the same as the rules file', async () => {
  const text = fs.readFileSync(ruleObjectFile, 'utf8');
  assert.equal(text, renderPrometheusRule(),
    'prometheus-rule.yaml differs from deploy/prometheus/armada.rules.yml: run `node tests/node/prometheus_rule.mjs`');
  const [rule] = docs(text);
  const { PrometheusRule } = await import('@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1');
  new PrometheusRule(rule).validate();
  assert.deepEqual(rule.spec.groups, YAML.parse(fs.readFileSync(rulesFile, 'utf8')).groups);
  const alerts = rule.spec.groups.flatMap((g) => g.rules).filter((r) => r.alert).map((r) => r.alert);
  for (const a of ['ArmadaChainSurvivalLow', 'ArmadaRolloutGateFired', 'ArmadaKvWatermarkHigh', 'ArmadaElectionWithoutLeader',
    'ArmadaLeadershipFlapping', 'ArmadaEtcdNearQuota', 'ArmadaPoolBreakerOpen', 'ArmadaGateway5xxHigh', 'ArmadaQuotaRefusals'])
    assert.ok(alerts.includes(a), `${a} is among the rules`);
  const component = YAML.parse(fs.readFileSync(path.join(root, 'components/prometheus-rules/kustomization.yaml'), 'utf8'));
  assert.equal(component.kind, 'Component');
  assert.deepEqual(component.resources, ['prometheus-rule.yaml']);
  const k = YAML.parse(fs.readFileSync(path.join(overlay, 'kustomization.yaml'), 'utf8'));
  assert.ok((k.components ?? []).includes('../../components/prometheus-rules'), 'the example overlay includes the rules');
  // The check can fail: a rule without its expression is refused by the schema.
  const broken = structuredClone(rule);
  delete broken.spec.groups[1].rules[0].expr;
  assert.throws(() => new PrometheusRule(broken).validate(), /expr/);
});
