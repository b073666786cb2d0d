#!/usr/bin/env node
// Validates rendered Kubernetes manifests offline, for kubernetes_test.sh.
//
//   node kubernetes_validate.cjs --prefix NPM_PREFIX --work DIR --alerts ALERTS_YML
//       --learner-flags FILE --rollout-flags FILE NAME=RENDERED.yaml...
//
// NPM_PREFIX holds kubernetes-models, @kubernetes-models/prometheus-operator,
// typescript and yaml (npm install --prefix). Every object is checked twice
// against the Kubernetes API (and the Prometheus operator's CRDs), both
// generated from their OpenAPI schemas by kubernetes-models:
//   1. the JSON schema (model.validate(), ajv): types, required fields,
//      formats such as quantities, enums;
//   2. the TypeScript interface, by compiling `const o: IStatefulSet = {...}`
//      with tsc --strict: an unknown or misspelled field is an error
//      (the JSON schemas allow extra properties; the interfaces do not).
// Deliberately broken copies of real objects must be rejected, so that the
// check cannot pass vacuously. Then the project's own rules: flags that the
// daemons know, ranks and WORLD_SIZE, Services, GPU requests, security
// settings, and the PrometheusRule against deploy/prometheus/alerts.yml.
// Prints PASS/FAIL lines and, last, "RESULT passed=N failed=M".
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");
const { execFileSync } = require("child_process");

function parseArgs(argv) {
  const o = { renders: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--prefix") o.prefix = next();
    else if (a === "--work") o.work = next();
    else if (a === "--alerts") o.alerts = next();
    else if (a === "--learner-flags") o.learnerFlags = next();
    else if (a === "--rollout-flags") o.rolloutFlags = next();
    else if (a.includes("=") && !a.startsWith("--")) {
      const [name, file] = [a.slice(0, a.indexOf("=")), a.slice(a.indexOf("=") + 1)];
      o.renders.push({ name, file });
    } else throw new Error(`unknown argument ${a}`);
  }
  for (const k of ["prefix", "work", "alerts", "learnerFlags", "rolloutFlags"]) {
    if (!o[k]) throw new Error(`missing --${k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase())}`);
  }
  if (o.renders.length === 0) throw new Error("no rendered manifests given");
  return o;
}

const opts = parseArgs(process.argv.slice(2));
const req = createRequire(path.join(path.resolve(opts.prefix), "package.json"));
const YAML = req("yaml");

let passed = 0;
let failed = 0;
function pass(what) {
  passed++;
  console.log(`PASS: ${what}`);
}
function fail(what, details) {
  failed++;
  console.log(`FAIL: ${what}`);
  for (const d of [].concat(details || [])) console.log(`    ${d}`);
}
// One named check: a list of problems, empty when it holds.
function check(what, problems) {
  if (problems.length === 0) pass(what);
  else fail(what, problems);
}

// --- loading -------------------------------------------------------------

function loadStream(file) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  const out = [];
  for (const d of docs) {
    if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
    const o = d.toJS();
    if (o !== null && o !== undefined) out.push(o);
  }
  return out;
}

const renders = opts.renders.map((r) => ({ ...r, objects: loadStream(r.file) }));
// JSON with sorted keys: equal for equal data, whatever the key order.
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v);
}
const id = (o) => `${o.kind}/${(o.metadata || {}).name}`;

// --- 1. JSON schema (ajv, kubernetes-models) ------------------------------

function modelPath(o) {
  const [group, version] = String(o.apiVersion).includes("/")
    ? o.apiVersion.split("/")
    : ["", o.apiVersion];
  if (!/^[A-Za-z]+$/.test(String(o.kind)) || !version) return null;
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}/${o.kind}`;
  }
  return `kubernetes-models/${group ? group + "/" : ""}${version}/${o.kind}`;
}

function schemaErrors(o) {
  const p = modelPath(o);
  let Model;
  try {
    Model = p && req(p)[o.kind];
  } catch (e) {
    Model = undefined;
  }
  if (!Model) return [`no schema for apiVersion ${o.apiVersion}, kind ${o.kind}`];
  try {
    new Model(JSON.parse(JSON.stringify(o))).validate();
    return [];
  } catch (e) {
    return String(e.message)
      .split(/, (?=data\/)/)
      .map((m) => `schema: ${m}`);
  }
}

// --- 2. TypeScript interfaces (tsc --strict) ------------------------------

// JSON, one value per line, with the path of each line, so that a tsc error
// names the field it is about.
function serialize(value, indent, p, lines, paths) {
  const pad = "  ".repeat(indent);
  if (Array.isArray(value) && value.length) {
    lines[lines.length - 1] += "[";
    value.forEach((v, i) => {
      lines.push(pad + "  ");
      paths.push(`${p}/${i}`);
      serialize(v, indent + 1, `${p}/${i}`, lines, paths);
      if (i < value.length - 1) lines[lines.length - 1] += ",";
    });
    lines.push(pad + "]");
    paths.push(p);
  } else if (
    value &&
    typeof value === "object" &&
    !Array.isArray(value) &&
    Object.keys(value).length
  ) {
    lines[lines.length - 1] += "{";
    const keys = Object.keys(value);
    keys.forEach((k, i) => {
      lines.push(pad + "  " + JSON.stringify(k) + ": ");
      paths.push(`${p}/${k}`);
      serialize(value[k], indent + 1, `${p}/${k}`, lines, paths);
      if (i < keys.length - 1) lines[lines.length - 1] += ",";
    });
    lines.push(pad + "}");
    paths.push(p);
  } else {
    lines[lines.length - 1] += JSON.stringify(value);
  }
}

// Compiles every object against its interface; returns errors per object.
function typeErrors(objects) {
  fs.mkdirSync(opts.work, { recursive: true });
  const lines = [];
  const paths = [];
  const owner = [];
  const imports = new Map();
  const result = objects.map(() => []);
  const body = [];
  objects.forEach((o, i) => {
    const p = modelPath(o);
    if (!p) {
      result[i].push(`types: no interface for apiVersion ${o.apiVersion}, kind ${o.kind}`);
      return;
    }
    if (!imports.has(p)) imports.set(p, `T${imports.size}`);
    body.push({ i, alias: imports.get(p), kind: o.kind });
  });
  for (const [p, alias] of imports) {
    const kind = p.slice(p.lastIndexOf("/") + 1);
    lines.push(`import type { I${kind} as ${alias} } from ${JSON.stringify(p)};`);
    paths.push("");
    owner.push(-1);
  }
  for (const { i, alias } of body) {
    const start = lines.length;
    lines.push(`export const o${i}: ${alias} = `);
    paths.push("");
    serialize(objects[i], 0, "", lines, paths);
    lines[lines.length - 1] += ";";
    while (owner.length < lines.length) owner.push(i);
    owner[start] = i;
  }
  fs.writeFileSync(path.join(opts.work, "objects.ts"), lines.join("\n") + "\n");
  fs.writeFileSync(
    path.join(opts.work, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        strict: true,
        noEmit: true,
        module: "commonjs",
        moduleResolution: "node",
        target: "es2019",
        lib: ["es2019"],
        skipLibCheck: true,
        types: [],
        baseUrl: ".",
        paths: { "*": [path.join(path.resolve(opts.prefix), "node_modules", "*")] },
      },
      files: ["objects.ts"],
    }),
  );
  const tsc = path.join(path.resolve(opts.prefix), "node_modules", "typescript", "bin", "tsc");
  let out = "";
  try {
    execFileSync(
      process.execPath,
      [tsc, "-p", path.join(opts.work, "tsconfig.json"), "--pretty", "false"],
      { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 180000 },
    );
  } catch (e) {
    if (e.status === null || e.status === undefined) throw new Error(`tsc did not finish: ${e}`);
    out = String(e.stdout || "") + String(e.stderr || "");
  }
  let current = null;
  for (const line of out.split("\n")) {
    const m = /^.*objects\.ts\((\d+),(\d+)\): error (TS\d+): (.*)$/.exec(line);
    if (m) {
      const ln = Number(m[1]) - 1;
      const i = owner[ln];
      const msg = m[4].length > 300 ? m[4].slice(0, 300) + "..." : m[4];
      const at = paths[ln]
        ? ` (at ${paths[ln]}: ${lines[ln].trim().replace(/,$/, "").slice(0, 80)})`
        : "";
      if (i === undefined || i < 0) throw new Error(`tsc: ${line}`);
      current = { i, text: `types: ${m[3]} ${msg}${at}` };
      result[i].push(current.text);
    } else if (line.trim() && current === null) {
      throw new Error(`tsc: ${line}`);
    }
  }
  return result;
}

// --- negative controls ----------------------------------------------------

function clone(o) {
  return JSON.parse(JSON.stringify(o));
}
const all = [];
for (const r of renders) for (const o of r.objects) all.push({ render: r.name, o });
const sts = all.find((x) => x.o.kind === "StatefulSet");
const pm = all.find((x) => x.o.kind === "PodMonitor");
const broken = [];
if (sts) {
  const a = clone(sts.o);
  a.spec.replicas = "two";
  broken.push({ what: 'spec.replicas: "two"', o: a, expect: /replicas/ });
  const b = clone(sts.o);
  const c = b.spec.template.spec.containers[0];
  c.imagePullPolize = c.imagePullPolicy;
  delete c.imagePullPolicy;
  broken.push({
    what: "a misspelled container field (imagePullPolize)",
    o: b,
    expect: /imagePullPolize/,
  });
  const d = clone(sts.o);
  d.spec.template.spec.containers[0].resources.limits.memory = "lots";
  broken.push({ what: 'a memory limit that is no quantity ("lots")', o: d, expect: /memory/ });
}
if (pm) {
  const e = clone(pm.o);
  e.spec.podMetricsEndpoints[0].intervall = "5s";
  broken.push({ what: "a misspelled PodMonitor field (intervall)", o: e, expect: /intervall/ });
}

// --- schema and type checks -----------------------------------------------

const everything = all.map((x) => x.o).concat(broken.map((b) => b.o));
const tErrors = typeErrors(everything);
all.forEach((x, i) => {
  check(
    `${x.render}: ${id(x.o)} matches the API schema and types`,
    schemaErrors(x.o).concat(tErrors[i]),
  );
});
if (!sts || !pm) fail("negative controls: no StatefulSet or PodMonitor was rendered");
broken.forEach((b, j) => {
  const errs = schemaErrors(b.o).concat(tErrors[all.length + j]);
  if (errs.some((e) => b.expect.test(e))) {
    pass(`the validator rejects ${id(b.o)} with ${b.what}: ${errs.find((e) => b.expect.test(e))}`);
  } else {
    fail(`the validator did not reject ${id(b.o)} with ${b.what}`, errs);
  }
});

// --- the project's rules --------------------------------------------------

const known = {
  learner: new Set(fs.readFileSync(opts.learnerFlags, "utf8").split(/\s+/).filter(Boolean)),
  rollout: new Set(fs.readFileSync(opts.rolloutFlags, "utf8").split(/\s+/).filter(Boolean)),
};

function podSpecOf(o) {
  if (o.kind === "Deployment" || o.kind === "StatefulSet") return o.spec.template.spec;
  return null;
}
// Which daemon the container runs: the binary its command executes.
function daemonOf(c) {
  const m = /\/usr\/local\/bin\/asympo-(learner|rollout)\b/.exec((c.command || []).join(" "));
  return m ? m[1] : null;
}
// The daemon's flags in order: each --flagfile's lines where it stands.
function flagsOf(c, spec, objects, problems) {
  const flags = [];
  for (const a of c.args || []) {
    if (!a.startsWith("--")) {
      problems.push(`argument ${JSON.stringify(a)} is no --flag`);
      continue;
    }
    const m = /^--([A-Za-z0-9_]+)(?:=(.*))?$/s.exec(a);
    if (!m) {
      problems.push(`argument ${JSON.stringify(a)} is no --flag`);
      continue;
    }
    if (m[1] !== "flagfile") {
      flags.push({ name: m[1], value: m[2], from: "args" });
      continue;
    }
    const file = m[2] || "";
    const mount = (c.volumeMounts || []).find((v) => file.startsWith(v.mountPath + "/"));
    const vol = mount && (spec.volumes || []).find((v) => v.name === mount.name);
    const cm =
      vol &&
      vol.configMap &&
      objects.find((x) => x.kind === "ConfigMap" && x.metadata.name === vol.configMap.name);
    const key = mount && file.slice(mount.mountPath.length + 1);
    if (!cm || !cm.data || cm.data[key] === undefined) {
      problems.push(`--flagfile=${file}: no ConfigMap key is mounted there`);
      continue;
    }
    cm.data[key].split("\n").forEach((line, n) => {
      const t = line.trim();
      if (!t || t.startsWith("#")) return;
      const f = /^--([A-Za-z0-9_]+)(?:=(.*))?$/.exec(t);
      if (!f) problems.push(`${key}:${n + 1}: ${JSON.stringify(t)} is no --flag`);
      else flags.push({ name: f[1], value: f[2], from: `${key}:${n + 1}` });
    });
  }
  return flags;
}
const last = (flags, name) => {
  const f = flags.filter((x) => x.name === name);
  return f.length
    ? f[f.length - 1].value === undefined
      ? "true"
      : f[f.length - 1].value
    : undefined;
};
function envValue(c, name, objects) {
  const e = (c.env || []).find((x) => x.name === name);
  if (!e) return undefined;
  if (e.value !== undefined) return e.value;
  const ref = e.valueFrom && e.valueFrom.configMapKeyRef;
  if (ref) {
    const cm = objects.find((x) => x.kind === "ConfigMap" && x.metadata.name === ref.name);
    return cm && cm.data ? cm.data[ref.key] : undefined;
  }
  return undefined;
}
const portOf = (addr) => Number(String(addr).slice(String(addr).lastIndexOf(":") + 1));
const matches = (selector, labels) =>
  Object.entries(selector || {}).every(([k, v]) => (labels || {})[k] === v);

// Ranks 1 and up (StatefulSet W): rank 0's pod template but for the name,
// labels, offset, ports and the volume, which they lack (they write
// nothing); selectors that keep the two sets apart; the same headless
// Service; the same flags.
function checkWorkers(L, W, objects, lp) {
  if (L.o.spec.volumeClaimTemplates === undefined) lp.push("rank 0 has no volumeClaimTemplate");
  if (!W) {
    lp.push("no StatefulSet of learner ranks with ASYMPO_RANK_OFFSET=1");
    return;
  }
  const wn = W.o.metadata.name;
  if (W.o.spec.volumeClaimTemplates) lp.push(`${wn} has volumeClaimTemplates: it writes nothing`);
  if ((W.c.volumeMounts || []).some((m) => (L.c.volumeMounts || []).some(
    (x) => x.name === m.name && (L.o.spec.volumeClaimTemplates || []).some(
      (t) => t.metadata.name === m.name)))) {
    lp.push(`${wn} mounts rank 0's checkpoint volume`);
  }
  for (const k of ["serviceName", "podManagementPolicy"]) {
    if (W.o.spec[k] !== L.o.spec[k]) lp.push(`${wn}'s ${k} is not rank 0's`);
  }
  if ((W.o.spec.updateStrategy || {}).type !== "OnDelete") lp.push(`${wn} is not OnDelete`);
  const [lt, wt] = [L.o.spec.template.metadata.labels, W.o.spec.template.metadata.labels];
  if (!matches(W.o.spec.selector.matchLabels, wt) || matches(W.o.spec.selector.matchLabels, lt) ||
      !matches(L.o.spec.selector.matchLabels, lt) || matches(L.o.spec.selector.matchLabels, wt)) {
    lp.push("the selectors of rank 0 and the workers do not keep their pods apart");
  }
  const headless = objects.find((o) => o.kind === "Service" && o.metadata.name === L.o.spec.serviceName);
  if (headless && !matches(headless.spec.selector, wt)) lp.push("the headless Service misses the workers");
  if (envValue(W.c, "ASYMPO_RANK_OFFSET", objects) !== "1") lp.push(`${wn}'s offset is not 1`);
  if (JSON.stringify(W.c.command) !== JSON.stringify(L.c.command)) {
    lp.push(`${wn}'s command is not rank 0's`);
  }
  const flagList = (x) => x.flags.map((f) => `--${f.name}=${f.value}`).join(" ");
  if (flagList(W) !== flagList(L)) lp.push(`${wn}'s flags are not rank 0's`);
  for (const k of ["WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RUN_NAME"]) {
    if (envValue(W.c, k, objects) !== envValue(L.c, k, objects)) lp.push(`${wn}'s ${k} differs`);
  }
}

// Every rank's liveness reflects its training loop: --heartbeat_file on the
// path the probes read, a startup probe for the first beat, exec probes of
// learner-probe.sh, and a documented stall time (ASYMPO_HEARTBEAT_MAX_AGE).
function checkHeartbeat(where, c, spec, flags, objects) {
  const live = c.livenessProbe || {};
  const maxAge = Number(envValue(c, "ASYMPO_HEARTBEAT_MAX_AGE", objects));
  const stall = maxAge + (live.periodSeconds || 10) * (live.failureThreshold || 3);
  check(
    `${where}: startup at the first heartbeat; liveness fails ${maxAge}-${stall} s after ` +
      "its training loop stalls, on every rank",
    heartbeatProblems(c, spec, flags, objects),
  );
}
function heartbeatProblems(c, spec, flags, objects) {
  const hp = [];
  const file = envValue(c, "ASYMPO_HEARTBEAT_FILE", objects);
  const maxAge = Number(envValue(c, "ASYMPO_HEARTBEAT_MAX_AGE", objects));
  const flag = last(flags, "heartbeat_file");
  if (!file) hp.push("no ASYMPO_HEARTBEAT_FILE");
  if (flag !== "$(ASYMPO_HEARTBEAT_FILE)") hp.push(`--heartbeat_file is ${flag}`);
  const mount = (c.volumeMounts || []).find((m) => (file || "").startsWith(m.mountPath + "/"));
  const vol = mount && (spec.volumes || []).find((v) => v.name === mount.name);
  if (!vol || !vol.emptyDir) hp.push(`the heartbeat ${file} is not on a writable emptyDir`);
  if (!(maxAge >= 60)) hp.push(`ASYMPO_HEARTBEAT_MAX_AGE ${maxAge} is not 60 s or more`);
  // Rank 0 serves /metrics: its readiness is GET /ready there, which fails
  // while it makes no progress; the other ranks' is their heartbeat.
  const ready = (c.readinessProbe || {}).httpGet;
  const rank0 = (c.ports || []).some((p) => p.name === "metrics");
  if (rank0 && !(ready && ready.path === "/ready" && ready.port === "metrics")) {
    hp.push("rank 0's readinessProbe is not GET /ready on the metrics port");
  }
  for (const [p, mode] of [
    ["startupProbe", "startup"],
    ["livenessProbe", "live"],
    ...(rank0 ? [] : [["readinessProbe", "ready"]]),
  ]) {
    const cmd = ((c[p] || {}).exec || {}).command || [];
    if (!/learner-probe\.sh$/.test(cmd[cmd.length - 2] || "") || cmd[cmd.length - 1] !== mode) {
      hp.push(`${p} does not run learner-probe.sh ${mode}`);
    }
  }
  return hp;
}

// A container with a GPU is Guaranteed: requests equal limits for cpu and
// memory (the last that a node under memory pressure evicts).
function qosProblems(res) {
  const qp = [];
  const gpu = (res.limits || {})["nvidia.com/gpu"];
  for (const k of gpu !== undefined ? ["cpu", "memory"] : []) {
    const [rq, lm] = [(res.requests || {})[k], (res.limits || {})[k]];
    if (rq === undefined || String(rq) !== String(lm)) {
      qp.push(`${k} request ${rq} and limit ${lm} differ: not Guaranteed QoS`);
    }
  }
  return qp;
}

// A flag naming a file under a Secret or ConfigMap mount names a key the
// rendered object has (--tls_cert, --auth_file, --tls_token_file, ...).
function checkMountedFiles(where, c, spec, flags, objects) {
  const [n, mp] = mountedFileProblems(c, spec, flags, objects);
  if (n) check(`${where}: the ${n} files its flags name are keys of mounted objects`, mp);
}
function mountedFileProblems(c, spec, flags, objects) {
  const mp = [];
  let n = 0;
  for (const f of flags) {
    if (f.name === "flagfile" || typeof f.value !== "string") continue;
    const mount = (c.volumeMounts || [])
      .filter((m) => f.value.startsWith(m.mountPath + "/"))
      .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
    const vol = mount && (spec.volumes || []).find((v) => v.name === mount.name);
    const ref = vol && (vol.secret || vol.configMap);
    if (!ref) continue;
    n++;
    const [kind, name] = vol.secret ? ["Secret", ref.secretName] : ["ConfigMap", ref.name];
    const o = objects.find((x) => x.kind === kind && x.metadata.name === name);
    const key = f.value.slice(mount.mountPath.length + 1);
    const keys = o ? Object.keys({ ...(o.data || {}), ...(o.stringData || {}) }) : [];
    if (!o) mp.push(`--${f.name}=${f.value}: ${kind} ${name} is not rendered`);
    else if (!keys.includes(key)) mp.push(`--${f.name}=${f.value}: ${kind} ${name} has no ${key}`);
  }
  return [n, mp];
}

for (const r of renders) {
  const objects = r.objects;
  const overlay = r.name.startsWith("overlays/");
  const workloads = objects.filter((o) => podSpecOf(o));
  if (r.name === "monitoring") continue;
  const daemons = {};
  for (const o of workloads) {
    const spec = podSpecOf(o);
    for (const c of spec.containers) {
      const where = `${r.name}: ${id(o)} container ${c.name}`;
      const d = daemonOf(c);
      if (!d) {
        fail(`${where}: runs asympo-learner or asympo-rollout`);
        continue;
      }
      const problems = [];
      const flags = flagsOf(c, spec, objects, problems);
      for (const f of flags) {
        if (!known[d].has(f.name)) {
          problems.push(`--${f.name} (${f.from}) is not a flag of asympo-${d}`);
        }
      }
      check(`${where}: every flag is one asympo-${d} knows (${flags.length} flags)`, problems);
      // The learner's ranks 1 and up are a StatefulSet of their own.
      const role = d === "learner" && envValue(c, "ASYMPO_RANK_OFFSET", objects) === "1";
      daemons[role ? "workers" : d] = { o, spec, c, flags };

      // $(VAR) in args and env: defined before use.
      const vp = [];
      const defined = new Set();
      for (const e of c.env || []) {
        for (const m of String(e.value || "").matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!defined.has(m[1])) vp.push(`env ${e.name} uses $(${m[1]}) before it is defined`);
        }
        defined.add(e.name);
      }
      for (const a of c.args || []) {
        for (const m of a.matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
          if (!defined.has(m[1])) vp.push(`${a} uses $(${m[1]}), which env does not define`);
        }
      }
      for (const e of c.env || []) {
        const ref = e.valueFrom && e.valueFrom.configMapKeyRef;
        if (ref && envValue(c, e.name, objects) === undefined) {
          vp.push(`env ${e.name}: ConfigMap ${ref.name} key ${ref.key} is not rendered`);
        }
      }
      for (const v of spec.volumes || []) {
        if (
          v.configMap &&
          !objects.some((x) => x.kind === "ConfigMap" && x.metadata.name === v.configMap.name)
        ) {
          vp.push(`volume ${v.name}: ConfigMap ${v.configMap.name} is not rendered`);
        }
        if (
          v.persistentVolumeClaim &&
          !objects.some(
            (x) =>
              x.kind === "PersistentVolumeClaim" &&
              x.metadata.name === v.persistentVolumeClaim.claimName,
          )
        ) {
          vp.push(`volume ${v.name}: PVC ${v.persistentVolumeClaim.claimName} is not rendered`);
        }
      }
      for (const m of c.volumeMounts || []) {
        const known2 =
          (spec.volumes || []).some((v) => v.name === m.name) ||
          (o.spec.volumeClaimTemplates || []).some((t) => t.metadata.name === m.name);
        if (!known2) vp.push(`volumeMount ${m.mountPath}: no volume ${m.name}`);
      }
      check(`${where}: variables, ConfigMaps and volumes it refers to exist`, vp);

      // Security and resources.
      const sp = [];
      const psc = spec.securityContext || {};
      const sc = c.securityContext || {};
      if (psc.runAsNonRoot !== true && sc.runAsNonRoot !== true)
        sp.push("runAsNonRoot is not true");
      if (sc.allowPrivilegeEscalation !== false) sp.push("allowPrivilegeEscalation is not false");
      if (sc.readOnlyRootFilesystem !== true) sp.push("readOnlyRootFilesystem is not true");
      if (!((sc.capabilities || {}).drop || []).includes("ALL"))
        sp.push("capabilities do not drop ALL");
      const seccomp = (sc.seccompProfile || psc.seccompProfile || {}).type;
      if (seccomp !== "RuntimeDefault") sp.push("seccompProfile is not RuntimeDefault");
      if (spec.automountServiceAccountToken !== false)
        sp.push("the service account token is mounted");
      const res = c.resources || {};
      for (const k of ["cpu", "memory"]) {
        if (!(res.requests || {})[k]) sp.push(`no ${k} request`);
      }
      if (!(res.limits || {}).memory) sp.push("no memory limit");
      if (
        !/^([a-z0-9.-]+(:[0-9]+)?\/)*[a-z0-9._-]*asympo-rl:[A-Za-z0-9._-]+$/.test(c.image) ||
        c.image.endsWith(":latest")
      ) {
        sp.push(`image ${c.image} is not asympo-rl with a fixed tag`);
      }
      for (const p of ["readinessProbe", "livenessProbe"]) if (!c[p]) sp.push(`no ${p}`);
      if ((c.args || []).includes("--insecure")) {
        sp.push("--insecure is hard-coded in the args (an overlay's flag file chooses it)");
      }
      check(`${where}: non-root, read-only, no capabilities, resources, probes, image tag`, sp);
      if (d === "learner") checkHeartbeat(where, c, spec, flags, objects);
      // Ranks 1 and up read no file but the flag file (no TLS, no checkpoints).
      if (envValue(c, "ASYMPO_RANK_OFFSET", objects) !== "1") {
        checkMountedFiles(where, c, spec, flags, objects);
      }

      // GPUs: wanted by --device=cuda, requested in requests and limits alike.
      const gp = [];
      const device = last(flags, "device") || "cpu";
      const gpuLimit = (res.limits || {})["nvidia.com/gpu"];
      const gpuRequest = (res.requests || {})["nvidia.com/gpu"];
      const wantsGpu = device.startsWith("cuda");
      if (wantsGpu && !(Number(gpuLimit) >= 1))
        gp.push(`--device=${device} without nvidia.com/gpu`);
      if (!wantsGpu && gpuLimit !== undefined) gp.push(`nvidia.com/gpu on --device=${device}`);
      if (gpuRequest !== undefined && String(gpuRequest) !== String(gpuLimit)) {
        gp.push("nvidia.com/gpu request and limit differ");
      }
      if (r.name === "overlays/gpu" && !wantsGpu) gp.push("the gpu overlay runs on the CPU");
      if (r.name === "overlays/gpu" && !(Number(gpuLimit) >= 1)) {
        gp.push("the gpu overlay does not request nvidia.com/gpu");
      }
      gp.push(...qosProblems(res));
      check(
        `${where}: GPU requests match --device=${device}` +
          (gpuLimit !== undefined ? ` (nvidia.com/gpu: ${gpuLimit}, Guaranteed QoS)` : ""),
        gp,
      );
    }
  }

  // The learner's ranks, Services and the rollouts' way to it.
  const L = daemons.learner;
  const R = daemons.rollout;
  const lp = [];
  if (!L || L.o.kind !== "StatefulSet") lp.push("no learner StatefulSet");
  if (!R || R.o.kind !== "Deployment") lp.push("no rollout Deployment");
  if (lp.length) {
    check(`${r.name}: the learner and the rollouts are wired together`, lp);
    continue;
  }
  const world = Number(envValue(L.c, "WORLD_SIZE", objects));
  const replicas = L.o.spec.replicas === undefined ? 1 : L.o.spec.replicas;
  const W = daemons.workers;
  const workers = !W ? 0 : W.o.spec.replicas === undefined ? 1 : W.o.spec.replicas;
  if (replicas !== 1) lp.push(`rank 0's StatefulSet has ${replicas} replicas, not 1`);
  if (world !== 1 + workers) lp.push(`WORLD_SIZE ${world} but 1 + ${workers} learner ranks`);
  checkWorkers(L, W, objects, lp);
  if (world > 1 && last(L.flags, "dist_insecure") !== "true") {
    lp.push(`${world} ranks without --dist_insecure`);
  }
  if (L.o.spec.podManagementPolicy !== "Parallel") lp.push("podManagementPolicy is not Parallel");
  const headless = objects.find(
    (o) => o.kind === "Service" && o.metadata.name === L.o.spec.serviceName,
  );
  if (!headless || headless.spec.clusterIP !== "None") {
    lp.push(`serviceName ${L.o.spec.serviceName} is no headless Service`);
  } else {
    if (headless.spec.publishNotReadyAddresses !== true) {
      lp.push("the headless Service does not publish rank 0 before it is ready");
    }
    if (!matches(headless.spec.selector, L.o.spec.template.metadata.labels)) {
      lp.push("the headless Service does not select the learner pods");
    }
  }
  const master = envValue(L.c, "MASTER_ADDR", objects);
  const wantMaster = `${L.o.metadata.name}-0.${L.o.spec.serviceName}.$(POD_NAMESPACE).svc`;
  if (master !== wantMaster) lp.push(`MASTER_ADDR is ${master}, not ${wantMaster}`);
  const nsEnv = (L.c.env || []).find((e) => e.name === "POD_NAMESPACE");
  if (!nsEnv || ((nsEnv.valueFrom || {}).fieldRef || {}).fieldPath !== "metadata.namespace") {
    lp.push("POD_NAMESPACE is not the pod's namespace");
  }
  if (envValue(L.c, "MASTER_PORT", objects) !== "29500") lp.push("MASTER_PORT is not 29500");
  const cmd = (L.c.command || []).join(" ");
  if (!cmd.includes("ordinal=${HOSTNAME##*-}") ||
      !cmd.includes("RANK=$((ordinal + ${ASYMPO_RANK_OFFSET:-0}))")) {
    lp.push("the learner's command does not take RANK from the pod's ordinal and offset");
  }
  if (envValue(L.c, "ASYMPO_RANK_OFFSET", objects) !== "0") lp.push("rank 0's offset is not 0");
  // Secure by default: the daemons refuse to listen beyond loopback in
  // plaintext, and to serve /metrics there, unless told so.
  const beyondLoopback = (a) => a !== undefined && !/^(127\.|localhost:|\[::1\])/.test(a);
  if (beyondLoopback(last(L.flags, "listen")) && last(L.flags, "insecure") !== "true" &&
      !last(L.flags, "tls_cert")) {
    lp.push("the learner listens beyond loopback with neither --tls_cert nor --insecure");
  }
  for (const [who, d] of [["learner", L], ["rollout", R]]) {
    if (beyondLoopback(last(d.flags, "metrics_address")) &&
        last(d.flags, "metrics_insecure") !== "true") {
      lp.push(`the ${who} serves /metrics beyond loopback without --metrics_insecure`);
    }
  }
  const grpcPort = portOf(last(L.flags, "listen"));
  const metricsPort = portOf(last(L.flags, "metrics_address"));
  const cports = Object.fromEntries((L.c.ports || []).map((p) => [p.name, p.containerPort]));
  if (grpcPort !== 50051 || cports.grpc !== 50051) lp.push("the learner's gRPC port is not 50051");
  if (metricsPort !== 9464 || cports.metrics !== 9464)
    lp.push("the learner's metrics port is not 9464");
  const svc = objects.find((o) => o.kind === "Service" && o.metadata.name === "asympo-learner");
  if (!svc) {
    lp.push("no Service asympo-learner");
  } else {
    const pod0 = {
      ...L.o.spec.template.metadata.labels,
      "statefulset.kubernetes.io/pod-name": `${L.o.metadata.name}-0`,
    };
    const pod1 = W
      ? { ...W.o.spec.template.metadata.labels,
          "statefulset.kubernetes.io/pod-name": `${W.o.metadata.name}-0` }
      : { ...pod0, "statefulset.kubernetes.io/pod-name": `${L.o.metadata.name}-1` };
    if (!matches(svc.spec.selector, pod0) || matches(svc.spec.selector, pod1)) {
      lp.push("Service asympo-learner does not select rank 0 alone");
    }
    if (!(svc.spec.ports || []).some((p) => p.port === 50051))
      lp.push("Service asympo-learner lacks 50051");
  }
  if (last(R.flags, "learner") !== "asympo-learner:50051") {
    lp.push(`the rollouts' --learner is ${last(R.flags, "learner")}`);
  }
  const idFlag = last(R.flags, "id");
  const podName = (R.c.env || []).find((e) => e.name === "POD_NAME");
  if (
    idFlag !== "$(POD_NAME)" ||
    !podName ||
    ((podName.valueFrom || {}).fieldRef || {}).fieldPath !== "metadata.name"
  ) {
    lp.push("the rollouts' --id is not their pod name");
  }
  if (portOf(last(R.flags, "metrics_address")) !== 9465)
    lp.push("the rollouts' metrics port is not 9465");
  for (const [d, x] of [
    ["learner", L],
    ["rollout", R],
  ]) {
    if (last(x.flags, "run_name") !== "$(RUN_NAME)")
      lp.push(`asympo-${d} lacks --run_name=$(RUN_NAME)`);
  }
  if (envValue(L.c, "RUN_NAME", objects) !== envValue(R.c, "RUN_NAME", objects)) {
    lp.push("the learner's and the rollouts' RUN_NAME differ");
  }
  // The PodMonitors take `up`'s run label from app.kubernetes.io/instance.
  if (overlay) {
    const runName = envValue(L.c, "RUN_NAME", objects);
    for (const o of objects) {
      if (!["StatefulSet", "Deployment"].includes(o.kind)) continue;
      const instance = ((o.spec.template.metadata || {}).labels || {})["app.kubernetes.io/instance"];
      if (instance !== runName) {
        lp.push(`${id(o)}'s pods are labelled app.kubernetes.io/instance=${instance}, not RUN_NAME ${runName}`);
      }
    }
  }
  for (const f of ["model", "dtype", "tiny_vocab_size"]) {
    if ((last(L.flags, f) || "") !== (last(R.flags, f) || "")) {
      lp.push(`--${f} differs: learner ${last(L.flags, f)}, rollouts ${last(R.flags, f)}`);
    }
  }
  if ((L.o.spec.template.spec.terminationGracePeriodSeconds || 30) < 60) {
    lp.push("the learner has less than 60 s to write its final checkpoint");
  }
  const ckpt = last(L.flags, "checkpoint_dir") || "";
  if (
    !ckpt ||
    !(L.c.volumeMounts || []).some(
      (m) =>
        ckpt.startsWith(m.mountPath + "/") &&
        (L.o.spec.volumeClaimTemplates || []).some((t) => t.metadata.name === m.name),
    )
  ) {
    lp.push(`--checkpoint_dir=${ckpt} is not on the learner's volumeClaimTemplate`);
  }
  check(
    `${r.name}: ${world} learner rank(s) meet at rank 0, the only one with a volume; rollouts reach it at ` +
      "asympo-learner:50051",
    lp,
  );

  const np = [];
  if (overlay) {
    for (const o of objects) {
      if (o.kind !== "Namespace" && !o.metadata.namespace) np.push(`${id(o)} has no namespace`);
    }
  }
  const pol = objects.find(
    (o) =>
      o.kind === "NetworkPolicy" &&
      matches(o.spec.podSelector.matchLabels, L.o.spec.template.metadata.labels),
  );
  if (!pol) {
    np.push("no NetworkPolicy guards the learner");
  } else {
    const grpcRule = (pol.spec.ingress || []).find((i) =>
      (i.ports || []).some((p) => p.port === 50051),
    );
    const admits =
      grpcRule &&
      (grpcRule.from || []).some(
        (f) =>
          f.podSelector && matches(f.podSelector.matchLabels, R.o.spec.template.metadata.labels),
      );
    if (!admits) np.push("the NetworkPolicy does not admit the rollouts to 50051");
  }
  check(`${r.name}: namespace and NetworkPolicy`, np);
}

// The rules above reject broken copies of real learners, so that they cannot
// pass vacuously.
{
  const clone = (x) => JSON.parse(JSON.stringify(x));
  const learnerIn = (r, name = "asympo-learner") => {
    const o = r.objects.find((x) => x.kind === "StatefulSet" && x.metadata.name === name);
    const spec = o.spec.template.spec;
    const c = spec.containers.find((x) => daemonOf(x) === "learner");
    return { o, spec, c, flags: flagsOf(c, spec, r.objects, []), objects: r.objects };
  };
  const controls = [];
  const gpu = renders.find((r) => r.name === "overlays/gpu");
  const tls = renders.find((r) => r.name === "overlays/tls");
  if (gpu) {
    const L = learnerIn(gpu);
    const hb = (c, flags) => heartbeatProblems(c, L.spec, flags || L.flags, L.objects);
    let c = clone(L.c);
    delete c.startupProbe;
    controls.push(["without a startupProbe", hb(c)]);
    c = clone(L.c);
    c.livenessProbe = { tcpSocket: { port: 9464 } };
    controls.push(["whose liveness probe checks a port", hb(c)]);
    controls.push(["without --heartbeat_file", hb(L.c, L.flags.filter((f) => f.name !== "heartbeat_file"))]);
    c = clone(L.c);
    c.resources.requests.memory = "64Gi";
    controls.push(["with a GPU and 64Gi of memory requested under its limit", qosProblems(c.resources)]);
    const W = clone(learnerIn(gpu, "asympo-learner-worker"));
    W.o.spec.volumeClaimTemplates = L.o.spec.volumeClaimTemplates;
    const wp = [];
    checkWorkers(L, W, L.objects, wp);
    controls.push(["whose workers get a volume too", wp]);
  }
  if (tls) {
    const L = learnerIn(tls);
    const objects = clone(L.objects);
    delete objects.find((x) => x.kind === "Secret" && x.metadata.name === "asympo-learner-tls")
      .stringData["tls.key"];
    controls.push(["whose Secret lacks the key --tls_key names",
      mountedFileProblems(L.c, L.spec, L.flags, objects)[1]]);
  }
  if (!gpu || !tls) fail("negative controls of the project's rules: no gpu or tls overlay");
  for (const [what, problems] of controls) {
    if (problems.length) pass(`the project's rules reject a learner ${what}: ${problems[0]}`);
    else fail(`the project's rules accept a learner ${what}`);
  }
}

// --- monitoring -----------------------------------------------------------

const mon = renders.find((r) => r.name === "monitoring");
if (!mon) {
  fail("monitoring was rendered");
} else {
  const rule = mon.objects.find((o) => o.kind === "PrometheusRule");
  const alerts = YAML.parse(fs.readFileSync(opts.alerts, "utf8"));
  const same = rule && canonical(rule.spec.groups) === canonical(alerts.groups);
  const names = (alerts.groups || []).flatMap((g) => g.rules.map((x) => x.alert));
  check(
    `monitoring: the PrometheusRule's groups are exactly alerts.yml's ` +
      `(${(alerts.groups || []).length} groups, ${names.length} alerts)`,
    same ? [] : ["they differ: run python3 deploy/kubernetes/sync_rules.py"],
  );
  const overlays = renders.filter((r) => r.name.startsWith("overlays/"));
  for (const [name, role, port] of [
    ["asympo-learner", "learner", 9464],
    ["asympo-rollout", "rollout", 9465],
  ]) {
    const p = [];
    const m = mon.objects.find((o) => o.kind === "PodMonitor" && o.metadata.name === name);
    if (!m) {
      check(`monitoring: PodMonitor ${name}`, ["missing"]);
      continue;
    }
    if (m.spec.jobLabel !== "app.kubernetes.io/name")
      p.push("jobLabel is not app.kubernetes.io/name");
    for (const r of overlays) {
      const w = r.objects.find(
        (o) => podSpecOf(o) && podSpecOf(o).containers.some((c) => daemonOf(c) === role),
      );
      if (!w) continue;
      const labels = w.spec.template.metadata.labels;
      if (labels["app.kubernetes.io/name"] !== name) p.push(`${r.name}: job would not be ${name}`);
      const n = w.spec.replicas === undefined ? 1 : w.spec.replicas;
      for (let i = 0; i < Math.max(n, 2); i++) {
        const pod =
          w.kind === "StatefulSet"
            ? { ...labels, "statefulset.kubernetes.io/pod-name": `${w.metadata.name}-${i}` }
            : labels;
        const want = w.kind !== "StatefulSet" || i === 0;
        if (matches(m.spec.selector.matchLabels, pod) !== want) {
          p.push(`${r.name}: ${want ? "misses" : "scrapes"} pod ${i} (only rank 0 serves metrics)`);
        }
      }
      const c = podSpecOf(w).containers.find((x) => daemonOf(x) === role);
      for (const e of m.spec.podMetricsEndpoints) {
        const cp = (c.ports || []).find((x) => x.name === e.port);
        if (!cp || cp.containerPort !== port) p.push(`${r.name}: port ${e.port} is not ${port}`);
      }
    }
    check(
      `monitoring: PodMonitor ${name} scrapes ${role === "learner" ? "rank 0" : "every rollout"}` +
        ` on ${port} as job ${name}`,
      p,
    );
  }
}

console.log(`RESULT passed=${passed} failed=${failed}`);
process.exit(failed ? 1 : 0);
