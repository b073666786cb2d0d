#!/usr/bin/env node
// Runs the pods of rendered manifests on this machine, for kubernetes_test.sh:
// every learner rank (rank 0's StatefulSet and the workers') and one rollout daemon, with the
// containers' own command, args, env, flag files and probes, as a kubelet
// would start them. Only what a cluster provides is replaced: the
// volumes' mount paths by folders here, the pods' addresses and DNS names
// by 127.0.0.1, the ports by free ones (appended flags, which win), and
// /usr/local/bin by the build, and a Secret's key by the file
// SECRETS_DIR/<secret>/<key> where there is one (the shipped Secrets hold
// placeholders). The probes run as a kubelet runs them: startup until it
// passes, then liveness and readiness, on every rank. The learner trains a
// few steps; then rank 0 is stopped (SIGSTOP) longer than
// ASYMPO_HEARTBEAT_MAX_AGE, and the liveness probe must fail on every rank
// (rank 0 stalled in a step, the others waiting on it in a collective) and
// pass again once it goes on (SIGCONT); then every pod gets SIGTERM.
//
//   node kubernetes_pods.cjs --prefix NPM_PREFIX --build BUILD_DIR --work DIR
//       [--secrets SECRETS_DIR] NAME=RENDERED.yaml...
//
// Renderings whose learner is not the built-in tiny model on the CPU are
// skipped. Prints PASS/FAIL/SKIP lines and, last, "RESULT passed=N failed=M".
"use strict";
const fs = require("fs");
const path = require("path");
const net = require("net");
const http = require("http");
const { spawn, spawnSync } = require("child_process");
const { createRequire } = require("module");

const opts = { renders: [] };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a === "--prefix") opts.prefix = process.argv[++i];
  else if (a === "--build") opts.build = path.resolve(process.argv[++i]);
  else if (a === "--work") opts.work = path.resolve(process.argv[++i]);
  else if (a === "--secrets") opts.secrets = path.resolve(process.argv[++i]);
  else if (!a.startsWith("--") && a.includes("=")) {
    opts.renders.push({ name: a.slice(0, a.indexOf("=")), file: a.slice(a.indexOf("=") + 1) });
  } else throw new Error(`unknown argument ${a}`);
}
if (!opts.prefix || !opts.build || !opts.work)
  throw new Error("--prefix, --build and --work are needed");
const YAML = createRequire(path.join(path.resolve(opts.prefix), "package.json"))("yaml");

let passed = 0;
let failed = 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
}
function get(url) {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: 3000 }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve(res.statusCode === 200 ? body : null));
    });
    req.on("error", () => resolve(null));
    req.on("timeout", () => req.destroy());
  });
}

const BINARIES = { "asympo-learner": "learner_server", "asympo-rollout": "rollout_server" };
const daemonOf = (c) => {
  const m = /\/usr\/local\/bin\/asympo-(learner|rollout)\b/.exec((c.command || []).join(" "));
  return m ? m[1] : null;
};

// One pod of a workload: its files, environment and command line here.
class Pod {
  constructor(render, workload, container, podName, dir) {
    this.objects = render.objects;
    this.w = workload;
    this.c = container;
    this.name = podName;
    this.dir = dir;
    this.mounts = []; // [mountPath, local folder], longest first
    this.secretFiles = new Set();
    fs.mkdirSync(dir, { recursive: true });
    const spec = workload.spec.template.spec;
    for (const m of container.volumeMounts || []) {
      const v = (spec.volumes || []).find((x) => x.name === m.name);
      // A claim is one folder for every pod that mounts it (a shared,
      // ReadWriteMany volume); anything else is the pod's own.
      const local =
        v && v.persistentVolumeClaim
          ? path.join(path.dirname(dir), "claims", v.persistentVolumeClaim.claimName)
          : path.join(dir, "volumes", m.name);
      fs.mkdirSync(local, { recursive: true });
      this.mounts.push([m.mountPath, local]);
      if (v && v.configMap) {
        const cm = this.objects.find(
          (o) => o.kind === "ConfigMap" && o.metadata.name === v.configMap.name,
        );
        for (const [k, text] of Object.entries((cm && cm.data) || {})) {
          fs.writeFileSync(path.join(local, k), text);
        }
      }
      if (v && v.secret) this.writeSecret(v.secret.secretName, local);
    }
    this.mounts.sort((a, b) => b[0].length - a[0].length);
    for (const [, local] of this.mounts) {
      for (const f of fs.readdirSync(local)) {
        const p = path.join(local, f);
        if (fs.statSync(p).isFile() && !this.secretFiles.has(p)) {
          fs.writeFileSync(p, this.local(fs.readFileSync(p, "utf8")));
        }
      }
    }
  }
  // A Secret's keys (stringData, data), each replaced by
  // SECRETS_DIR/<name>/<key> when that file exists; the files here are
  // left out of the path rewriting (they are credentials, not text).
  writeSecret(name, local) {
    const s = this.objects.find((o) => o.kind === "Secret" && o.metadata.name === name);
    const keys = { ...((s && s.stringData) || {}) };
    for (const [k, b64] of Object.entries((s && s.data) || {})) {
      keys[k] = Buffer.from(b64, "base64").toString("utf8");
    }
    for (const [k, text] of Object.entries(keys)) {
      const given = opts.secrets && path.join(opts.secrets, name, k);
      const file = path.join(local, k);
      if (given && fs.existsSync(given)) fs.copyFileSync(given, file);
      else fs.writeFileSync(file, text);
      this.secretFiles.add(file);
    }
  }
  // Mount paths and the image's binaries, as paths on this machine.
  local(text) {
    // One pass, longest mount path first, so that a replaced path (which
    // may itself start with /tmp) is not replaced again.
    const esc = (x) => x.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
    // A mount path ends at a "/" or where the path does (a flag's value).
    const re = new RegExp(
      `(${this.mounts.map(([mp]) => esc(mp)).join("|")})(?=[/\\s"',;]|$)`,
      "gm",
    );
    const t = this.mounts.length
      ? text.replace(re, (mp) => this.mounts.find(([x]) => x === mp)[1])
      : text;
    return t.replace(/\/usr\/local\/bin\/(asympo-learner|asympo-rollout)\b/g, (_, b) =>
      path.join(opts.build, BINARIES[b], b),
    );
  }
  // The container's environment: configMapKeyRef, fieldRef and $(VAR).
  env(overrides) {
    const env = { PATH: process.env.PATH, HOSTNAME: this.name };
    const expand = (s) =>
      String(s).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) =>
        env[v] !== undefined ? env[v] : m,
      );
    for (const e of this.c.env || []) {
      if (e.value !== undefined) env[e.name] = expand(e.value);
      else if (e.valueFrom && e.valueFrom.configMapKeyRef) {
        const ref = e.valueFrom.configMapKeyRef;
        const cm = this.objects.find((o) => o.kind === "ConfigMap" && o.metadata.name === ref.name);
        env[e.name] = cm.data[ref.key];
      } else if (e.valueFrom && e.valueFrom.fieldRef) {
        env[e.name] = {
          "metadata.name": this.name,
          "metadata.namespace": "asympo-test",
          "status.podIP": "127.0.0.1",
        }[e.valueFrom.fieldRef.fieldPath];
      }
      if (overrides[e.name] !== undefined) env[e.name] = overrides[e.name];
    }
    for (const [k, v] of Object.entries(overrides)) env[k] = this.local(String(v));
    env.HOME = this.local(env.HOME || this.dir);
    this.envVars = env;
    // What the process and its probes see: values naming a mounted path
    // (ASYMPO_HEARTBEAT_FILE) as paths here. argv() expands $(VAR) from the
    // values as written and rewrites the result once.
    this.procEnv = { ...env };
    for (const e of this.c.env || []) {
      if (e.value !== undefined && overrides[e.name] === undefined) {
        this.procEnv[e.name] = this.local(env[e.name]);
      }
    }
    return env;
  }
  argv(extra) {
    const env = this.envVars;
    const expand = (s) =>
      String(s).replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) =>
        env[v] !== undefined ? env[v] : m,
      );
    return (this.c.command || [])
      .concat(this.c.args || [])
      .map((a) => this.local(expand(a)))
      .concat(extra);
  }
  start(extra) {
    this.extra = extra;
    const argv = this.argv(extra);
    this.log = path.join(this.dir, "log");
    const out = fs.openSync(this.log, "w");
    this.proc = spawn(argv[0], argv.slice(1), { env: this.procEnv, stdio: ["ignore", out, out] });
    this.exit = new Promise((resolve) => this.proc.on("exit", (code, sig) => resolve(sig || code)));
    this.exited = undefined;
    this.exit.then((x) => (this.exited = x));
  }
  probe(kind, env) {
    const p = this.c[kind];
    if (p && p.httpGet) return this.httpProbe(p.httpGet);
    if (!p || !p.exec) return null;
    const argv = p.exec.command.map((a) => this.local(a));
    const r = spawnSync(argv[0], argv.slice(1), {
      env: { ...this.procEnv, ...env },
      timeout: 10000,
    });
    return r.status === 0;
  }
  // An httpGet probe of the metrics port, on the address start() gave it.
  httpProbe(h) {
    const given = (this.extra || []).find((a) => a.startsWith("--metrics_address="));
    if (h.port !== "metrics" || !given) return false;
    const port = Number(given.split(":").pop());
    const get =
      `require("http").get({host: "127.0.0.1", port: ${port}, path: ${JSON.stringify(h.path)}, ` +
      `timeout: 5000}, (r) => process.exit(r.statusCode >= 200 && r.statusCode < 400 ? 0 : 1))` +
      `.on("error", () => process.exit(1));`;
    return spawnSync(process.execPath, ["-e", get], { timeout: 10000 }).status === 0;
  }
  tail(n) {
    try {
      return fs
        .readFileSync(this.log, "utf8")
        .trimEnd()
        .split("\n")
        .slice(-n)
        .map((l) => `  ${this.name}: ${l}`);
    } catch (e) {
      return [];
    }
  }
}

function flagValue(pod, name) {
  // The last value the daemon would see: flag files where they stand, then args.
  let value;
  for (const a of pod.argv([])) {
    const m = /^--([A-Za-z0-9_]+)(?:=(.*))?$/s.exec(a);
    if (!m) continue;
    if (m[1] === "flagfile") {
      for (const line of fs.readFileSync(m[2], "utf8").split("\n")) {
        const f = /^\s*--([A-Za-z0-9_]+)(?:=(.*))?\s*$/.exec(line);
        if (f && f[1] === name) value = f[2] === undefined ? "true" : f[2];
      }
    } else if (m[1] === name) value = m[2] === undefined ? "true" : m[2];
  }
  return value;
}

// Rank 0 stopped (SIGSTOP) for 5 s, its heartbeat allowed 3 s: every
// rank's liveness probe must fail (rank 0 stalled in its step, the others
// waiting on it), and pass again once it goes on (SIGCONT).
async function stallRankZero(ranks, ports, problems, notes) {
  const env = { ...ports, ASYMPO_HEARTBEAT_MAX_AGE: "3" };
  ranks[0].proc.kill("SIGSTOP");
  await sleep(5000);
  const stalled = ranks.map((pod) => pod.probe("livenessProbe", env) === false);
  ranks[0].proc.kill("SIGCONT");
  let back = false;
  for (const until = Date.now() + 15000; !back && Date.now() < until; ) {
    await sleep(500);
    back = ranks.every((pod) => pod.probe("livenessProbe", env) === true);
  }
  stalled.forEach((failed, i) => {
    if (!failed) problems.push(`rank ${i}'s liveness probe passed with rank 0 stopped for 5 s`);
  });
  if (!back) problems.push("the liveness probes did not pass again once rank 0 went on");
  if (stalled.every(Boolean) && back) {
    notes.push(`liveness failed on ${ranks.length} rank(s) while rank 0 stalled, passed after`);
  }
}

async function runRender(r) {
  const objects = YAML.parseAllDocuments(fs.readFileSync(r.file, "utf8"))
    .map((d) => d.toJS())
    .filter(Boolean);
  r.objects = objects;
  // Rank 0's StatefulSet (asympo-learner) and that of ranks 1 and up
  // (asympo-learner-worker: ordinal + 1).
  const learnerOf = (o) => o.spec.template.spec.containers.find((c) => daemonOf(c) === "learner");
  const sets = objects.filter((o) => o.kind === "StatefulSet" && learnerOf(o));
  const sts = sets.find((o) => o.metadata.name === "asympo-learner");
  const wsts = sets.find((o) => o !== sts);
  const dep = objects.find((o) => o.kind === "Deployment");
  const lc = sts && learnerOf(sts);
  const rc = dep && dep.spec.template.spec.containers.find((c) => daemonOf(c) === "rollout");
  if (!lc || !rc) return [`${r.name}: no learner StatefulSet and rollout Deployment`];
  const base = path.join(opts.work, r.name.replace(/\//g, "_"));
  const workers = !wsts ? 0 : wsts.spec.replicas === undefined ? 1 : wsts.spec.replicas;
  const world = 1 + workers;
  const [grpc, metrics, master, rmetrics] = [
    await freePort(),
    await freePort(),
    await freePort(),
    await freePort(),
  ];
  const ports = { ASYMPO_GRPC_PORT: String(grpc), ASYMPO_METRICS_PORT: String(metrics) };
  const ranks = [];
  for (let i = 0; i < world; i++) {
    const [set, name] = i === 0 ? [sts, `${sts.metadata.name}-0`] : [wsts, `${wsts.metadata.name}-${i - 1}`];
    const pod = new Pod(r, set, learnerOf(set), name, path.join(base, `rank${i}`));
    pod.env({ MASTER_ADDR: "127.0.0.1", MASTER_PORT: String(master) });
    ranks.push(pod);
  }
  const model = flagValue(ranks[0], "model");
  const device = flagValue(ranks[0], "device") || "cpu";
  if (model !== "tiny" || device !== "cpu") {
    console.log(
      `SKIP: ${r.name}: its pods run ${
        model === "tiny" ? "the tiny model" : "a model " + "directory"
      } with --device=${device}, not the tiny model on the CPU`,
    );
    return null;
  }
  const rollout = new Pod(
    r,
    dep,
    rc,
    `${dep.metadata.name}-5d8c9-x7k2q`,
    path.join(base, "rollout"),
  );
  rollout.env({});
  const runName = ranks[0].envVars.RUN_NAME;
  const problems = [];
  const notes = [];
  // No --max_steps: the ranks train until they are stopped as a kubelet
  // stops a pod (SIGTERM), after the probes and the metrics were seen and 3
  // steps trained; rank 0 then writes its final checkpoint.
  for (const pod of ranks) {
    pod.start([
      `--listen=127.0.0.1:${grpc}`,
      `--metrics_address=127.0.0.1:${metrics}`,
      "--checkpoint_every=0",
    ]);
  }
  rollout.start([`--learner=127.0.0.1:${grpc}`, `--metrics_address=127.0.0.1:${rmetrics}`]);
  const seen = { metrics: null, rmetrics: null };
  // Each rank's probes as a kubelet runs them: startup until it passes, then
  // liveness and readiness.
  const state = ranks.map(() => ({ started: false, live: false, ready: false, liveFailed: 0 }));
  const probeRanks = (env) =>
    ranks.forEach((pod, i) => {
      const s = state[i];
      if (pod.exited !== undefined) return;
      if (!s.started) {
        s.started = pod.probe("startupProbe", env) !== false;
        return;
      }
      if (pod.probe("livenessProbe", env) === false) s.liveFailed++;
      else s.live = true;
      if (pod.probe("readinessProbe", env)) s.ready = true;
    });
  const deadline = Date.now() + 120000;
  const steps = (text) => {
    const m = /^asympo_learner_steps_total(?:\{[^}]*\})? (\d+)/m.exec(text || "");
    return m ? Number(m[1]) : 0;
  };
  let trained = 0;
  while (ranks[0].exited === undefined && Date.now() < deadline) {
    const probed = state.every((s) => s.live && s.ready);
    if (probed && seen.metrics && seen.rmetrics && trained >= 3) break;
    probeRanks(ports);
    const scrape = await get(`http://127.0.0.1:${metrics}/metrics`);
    if (scrape) {
      seen.metrics = scrape;
      trained = steps(scrape);
    }
    if (!seen.rmetrics) seen.rmetrics = await get(`http://127.0.0.1:${rmetrics}/metrics`);
    await sleep(300);
  }
  if (ranks[0].exited !== undefined) {
    problems.push(`rank 0 exited by itself after ${trained} steps`);
  } else if (Date.now() >= deadline) {
    problems.push(`within 120 s: ${trained} of 3 steps, probes and metrics ${JSON.stringify({
      probes: state, metrics: !!seen.metrics, rollout: !!seen.rmetrics})}`);
  } else {
    await stallRankZero(ranks, ports, problems, notes);
  }
  for (const pod of ranks) if (pod.exited === undefined) pod.proc.kill("SIGTERM");
  const codes = await Promise.race([Promise.all(ranks.map((p) => p.exit)), sleep(60000)]);
  if (!codes) problems.push("the learner ranks did not all stop");
  rollout.proc.kill("SIGTERM");
  const rcode = await Promise.race([rollout.exit, sleep(30000)]);
  const logs = ranks.map((p) => fs.readFileSync(p.log, "utf8")).join("\n");
  if (/built for one rank only/.test(logs) && world > 1) {
    console.log(`SKIP: ${r.name}: this build's learner is built for one rank only`);
    return null;
  }
  (codes || []).forEach((c, i) => c !== 0 && problems.push(`rank ${i} exited with ${c}`));
  if (rcode !== 0) problems.push(`the rollout daemon exited with ${rcode} after SIGTERM`);
  state.forEach((s, i) => {
    if (!s.started || !s.live || !s.ready) problems.push(`rank ${i}'s probes: ${JSON.stringify(s)}`);
    if (s.liveFailed) problems.push(`rank ${i}'s liveness probe failed while it trained`);
  });
  if (flagValue(ranks[0], "tls_cert")) {
    if (/callers authenticated/.test(fs.readFileSync(ranks[0].log, "utf8"))) {
      notes.push("TLS with authenticated callers");
    } else problems.push("rank 0 has --tls_cert but did not log TLS with authenticated callers");
  }
  const run = `run="${runName}"`;
  if (!seen.metrics || !seen.metrics.includes(run))
    problems.push(`the learner's /metrics lacks ${run}`);
  if (!seen.rmetrics || !seen.rmetrics.includes(run))
    problems.push(`the rollout's /metrics lacks ${run}`);
  const ckptDir = flagValue(ranks[0], "checkpoint_dir");
  const ckpts = fs.existsSync(ckptDir)
    ? fs.readdirSync(ckptDir).filter((f) => f.startsWith("ckpt-"))
    : [];
  if (ckpts.length === 0) problems.push(`no checkpoint in ${ckptDir}`);
  else notes.push(`checkpoint ${ckpts[ckpts.length - 1]}`);
  const accepted = /(\d+) accepted by the learner/.exec(fs.readFileSync(rollout.log, "utf8"));
  if (!accepted || accepted[1] === "0")
    problems.push("the learner accepted no group of the rollout");
  else notes.push(`${accepted[1]} groups accepted`);
  if (problems.length) {
    for (const p of ranks.concat([rollout])) problems.push(...p.tail(6));
  }
  return {
    problems,
    summary:
      `${world} rank(s) and a rollout ran as their pods would: ` +
      `${trained}+ steps, stopped by SIGTERM, ${notes.join(", ")}, probes and run label as ` +
      "expected",
  };
}

(async () => {
  for (const r of opts.renders) {
    let out;
    try {
      out = await runRender(r);
    } catch (e) {
      out = [String((e && e.stack) || e)];
    }
    if (out === null) continue;
    if (Array.isArray(out)) out = { problems: out, summary: "pods ran" };
    if (out.problems.length === 0) {
      passed++;
      console.log(`PASS: ${r.name}: ${out.summary}`);
    } else {
      failed++;
      console.log(`FAIL: ${r.name}: its pods, run here`);
      for (const p of out.problems) console.log(`    ${p}`);
    }
  }
  console.log(`RESULT passed=${passed} failed=${failed}`);
  process.exit(failed ? 1 : 0);
})();
