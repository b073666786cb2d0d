"""What bench/rehearsal.py measures and checks: memory, /metrics, the
checkpoint directory, the resumed learner's weights, and the report."""
import json
import os
import re
import subprocess
import time
import urllib.request

import numpy as np

import checkpoint_state  # tests/integration/checkpoint_state.py

# /metrics series summed per scrape (histograms by _sum and _count).
LEARNER = ["asympo_learner_version", "asympo_learner_step_duration_seconds_sum",
           "asympo_broadcast_publish_seconds_sum", "asympo_broadcast_transfer_seconds_sum",
           "asympo_broadcast_bytes_total", "asympo_learner_checkpoint_version"]
ROLLOUT = ["asympo_rollout_weight_version", "asympo_rollout_generation_seconds_sum",
           "asympo_rollout_weight_fetch_seconds_sum", "asympo_rollout_weight_fetch_bytes_total",
           "asympo_rollout_weight_load_seconds_sum", "asympo_rollout_weight_flips_total",
           "asympo_rollout_tokens_generated_total"]
# A process's peak against its plan: within this fraction.
PLAN_TOLERANCE = 0.15


def memory_fields(pid):
    """VmHWM, VmRSS and VmSwap of the process, bytes ({} when gone)."""
    fields = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("VmHWM", "VmRSS", "VmSwap"):
                    fields[key] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return fields


def hwm(pid):
    """The process's memory, in bytes: the larger of its peak resident
    memory (VmHWM) and what it holds now in memory and swap (VmRSS +
    VmSwap: with swap on, pages out of memory count too); 0 when gone."""
    f = memory_fields(pid)
    return max(f.get("VmHWM", 0), f.get("VmRSS", 0) + f.get("VmSwap", 0))


def resident(pid):
    """What the process holds now, in bytes, in memory and swap (VmRSS +
    VmSwap; not its peak); 0 when gone."""
    f = memory_fields(pid)
    return f.get("VmRSS", 0) + f.get("VmSwap", 0)


def ancestors():
    """This process and the ones that started it (a script that runs the
    rehearsal may name its directory too)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def processes_using(path):
    """Other processes whose command line names `path` (an earlier
    rehearsal's daemons, which may still write into it)."""
    found, mine = [], ancestors()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if path in cmd and int(pid) not in mine and "rehearsal.py" not in cmd:
            found.append("%s: %s" % (pid, cmd[:120]))
    return found


def scrape(port, names):
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    except OSError:
        return None
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def poll(run):
    """Samples memory; on a new learner version, records the deltas of the
    learner's and the rollout's metrics since the last one."""
    run.sample()
    learner = scrape(run.metrics, LEARNER)
    rollout = scrape(run.rollout_metrics, ROLLOUT)
    if rollout is not None and "rollout" in run.procs and rollout["asympo_rollout_weight_flips_total"] == 0 and \
            rollout["asympo_rollout_weight_fetch_bytes_total"] == 0:
        # Ready with the model it loaded at start, before any snapshot: what
        # it holds then, not its peak (reading the model's files maps them,
        # and the peak kept that transient: the plan read 16% high).
        run.rollout_start = max(getattr(run, "rollout_start", 0), resident(run.procs["rollout"].pid))
    if rollout is None:  # unanswered (paused, or too busy): its sums as last seen
        rollout = dict(run.versions[-1]["rollout"]) if run.versions else dict.fromkeys(ROLLOUT, 0.0)
    if learner is None:
        return
    version = int(learner["asympo_learner_version"])
    last = run.versions[-1] if run.versions else None
    if last is not None and last["version"] == version:
        return
    row = {"version": version, "time": time.time(), "learner": learner, "rollout": rollout}
    run.versions.append(row)


def checkpoints(root):
    """The versions of the whole checkpoints under `root`, ascending."""
    if not os.path.isdir(root):
        return []
    return sorted(int(d[5:]) for d in os.listdir(root) if d.startswith("ckpt-"))


def saving(root):
    return os.path.isdir(root) and any(d.startswith(".tmp-ckpt-") for d in os.listdir(root))


def listing(root):
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def du(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def bf16_bytes(a):
    """float32 -> bfloat16 (round to nearest even), as little-endian bytes."""
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.astype("<u2").tobytes()


def resumed_weights_match(run, ckpt_dir, snapshot):
    """Whether the resumed learner's first snapshot holds the checkpoint's
    weights (bfloat16 of its float32 masters), tensor by tensor."""
    import hashlib
    state = checkpoint_state.read_state(ckpt_dir)["weight"]
    shapes = {}
    with open(os.path.join(ckpt_dir, "manifest.json")) as f:
        for p in json.load(f)["params"]:
            shapes[p["name"]] = p["shape"]
    bad = [n for n, w in state.items()
           if hashlib.sha256(bf16_bytes(w)).hexdigest() != snapshot["sha256"].get(n)]
    return not bad and len(state) == len(snapshot["sha256"]), bad[:3]


def fetch_resumed_snapshot(run, timeout):
    """A new subscriber's first snapshot of the resumed learner (while the
    rollout is paused, the learner's start version), into resumed.jsonl."""
    env = dict(os.environ, PYTHONPATH=os.path.join(run.work, "python_pkg"))
    out = os.path.join(run.work, "resumed.jsonl")
    if os.path.exists(out):
        os.remove(out)
    once = subprocess.Popen(["/usr/bin/python3", os.path.join(os.path.dirname(__file__), "rehearsal_receivers.py"),
                             "once", "127.0.0.1:%d" % run.port, out], env=env,
                            stdout=open(run.log("once"), "w"), stderr=subprocess.STDOUT)
    # The learner trains on meanwhile: its versions are sampled as they come.
    deadline = time.time() + timeout
    while once.poll() is None and time.time() < deadline:
        poll(run)
        time.sleep(1.0)
    if once.poll() is None:
        once.kill()
        once.wait()
        run.failures.append("no snapshot of the resumed learner within %d s" % timeout)


def phase_rows(versions):
    """Per learner version: the deltas of the learner's and rollout's sums."""
    rows = []
    for prev, cur in zip(versions, versions[1:]):
        d = lambda side, k: cur[side][k] - prev[side][k]  # noqa: E731
        rows.append({
            "version": cur["version"], "wall_s": cur["time"] - prev["time"],
            "train_s": d("learner", "asympo_learner_step_duration_seconds_sum"),
            "publish_s": d("learner", "asympo_broadcast_publish_seconds_sum"),
            "grpc_send_s": d("learner", "asympo_broadcast_transfer_seconds_sum"),
            "grpc_bytes": d("learner", "asympo_broadcast_bytes_total"),
            "generate_s": d("rollout", "asympo_rollout_generation_seconds_sum"),
            "rollout_fetch_s": d("rollout", "asympo_rollout_weight_fetch_seconds_sum"),
            "rollout_fetch_bytes": d("rollout", "asympo_rollout_weight_fetch_bytes_total"),
            "rollout_load_s": d("rollout", "asympo_rollout_weight_load_seconds_sum"),
            "tokens_generated": d("rollout", "asympo_rollout_tokens_generated_total"),
        })
    return rows


def plan_peaks(run):
    """Each process's plan, GiB, and what it counts. The learners: their own
    (asympo-plan's, logged at start). The others hold what they are built to
    hold on top of what they take before any weights (measured in this run):
    the subscriber the version it fetches and, with deltas, the one it
    rebuilds it from and a bucket's delta; the weight-group worker a bucket as it arrives and its
    host copy (and with deltas the version held); the rollout, ready with the
    model it loaded at start, the receiver's verified version and the next
    one being fetched (a delta's rebuild beside its base)."""
    out = {}
    for name in ("learner0", "learner1", "learner-resumed"):
        path = run.log(name)
        if os.path.exists(path):
            m = re.findall(r"peak per rank: ([0-9.]+) GiB", open(path, errors="replace").read())
            if m:
                out[name] = (float(m[-1]), "asympo-plan (logged at start)")
    subs = read_jsonl(os.path.join(run.work, "subscriber.jsonl"))
    group = read_jsonl(os.path.join(run.work, "group.jsonl"))
    version = max([s["bytes"] for s in subs] or [0])
    base = getattr(run, "python_base", 0)
    if subs:
        if subs[-1].get("deltas"):
            bucket = max(s.get("largest_bucket", 0) for s in subs)
            out["subscriber"] = ((base + 2 * version + bucket) / 2**30,
                                 "Python base + 2 versions + a bucket's delta")
        else:
            out["subscriber"] = ((base + version) / 2**30, "Python base + 1 version")
    if group:
        bucket = max(g.get("largest_bucket", 0) for g in group)
        deltas = any(g.get("deltas") for g in group)
        out["group"] = ((base + 2 * bucket + (version if deltas else 0)) / 2**30,
                        "Python base + 2 buckets" + (" + the version held" if deltas else ""))
    start = getattr(run, "rollout_start", 0)
    if start and version:
        out["rollout"] = ((start + 2 * version) / 2**30, "at ready + 2 versions")
    return out


def wait_for_receivers(run, deadline):
    """Until the weight-group worker and the subscriber each hold a version
    of the resumed learner (a row after the kill); a failure if not."""
    def after(name, ok):
        return any(r["time"] > run.kill_time and ok(r)
                   for r in read_jsonl(os.path.join(run.work, name + ".jsonl")))
    group_ok = lambda: after("group", lambda r: r.get("complete") and not r["error"])  # noqa: E731
    subs_ok = lambda: after("subscriber", lambda r: True)  # noqa: E731
    while time.time() < deadline and not (group_ok() and subs_ok()):
        run.sample()
        time.sleep(1.0)
    if not group_ok():
        run.failures.append("the weight-group worker took no version of the resumed learner")
    if not subs_ok():
        run.failures.append("the subscriber took no version of the resumed learner")


def receiver_rows(run):
    """Per leg and version: the weight-group worker's transfer and the
    subscriber's fetch, seconds."""
    kill = getattr(run, "kill_time", float("inf"))
    out = {}
    for name, key in (("group", "transfer_s"), ("subscriber", "fetch_s")):
        for r in read_jsonl(os.path.join(run.work, name + ".jsonl")):
            if r.get(key) is not None and not r.get("error"):
                out.setdefault((1 if r["time"] <= kill else 2, r["version"]), {})[name] = r[key]
    return out


def check_resumed(run):
    """While the resumed learner waits at its start version (the rollout
    paused) and its checkpoint is still there: the version it resumed and
    whether a new subscriber's first snapshot holds the checkpoint's weights.
    Sets run.resumed = (version, exact, failures)."""
    text = open(run.log("learner-resumed"), errors="replace").read()
    m = re.search(r"resumed from (\S+) at version (\d+)", text)
    incarnation = re.search(r"incarnation (\S+)", text)
    failures, version, exact = [], int(m.group(2)) if m else None, None
    newest = (run.killed_at or [None])[-1]
    if version is None or version != newest:
        failures.append("the resumed learner's version %s is not the newest checkpoint's %s"
                        % (version, newest))
    if m and incarnation:
        first = next((s for s in read_jsonl(os.path.join(run.work, "resumed.jsonl"))
                      if s["version"] == version and s["incarnation"] == incarnation.group(1)),
                     None)
        if first is None:
            failures.append("no snapshot of the resumed learner's version %s" % version)
        else:
            exact, bad = resumed_weights_match(run, m.group(1), first)
            if not exact:
                failures.append("the resumed learner's weights differ from the checkpoint's: %s"
                                % bad)
    run.resumed = (version, exact, failures)


def report(run, seconds):
    ckpt = os.path.join(run.work, "ckpt")
    subs = read_jsonl(os.path.join(run.work, "subscriber.jsonl"))
    group = read_jsonl(os.path.join(run.work, "group.jsonl"))
    resumed_version, weights_exact, resumed_failures = getattr(run, "resumed", (None, None, []))
    failures = list(run.failures) + list(resumed_failures)
    split = getattr(run, "resumed_rows", len(run.versions))
    steps = max([v["version"] for v in run.versions] or [0])
    if steps < run.args.steps:
        failures.append("only %d steps of %d" % (steps, run.args.steps))
    ckpt_dirs = [d for d in listing(ckpt) if d.startswith("ckpt-")]
    plans = plan_peaks(run)
    peaks = {k: v / 2**30 for k, v in run.peaks.items()}
    for name, (plan, _) in sorted(plans.items()):
        if name in peaks and abs(peaks[name] - plan) > PLAN_TOLERANCE * plan:
            failures.append("%s peaked at %.2f GiB, %+.0f%% of its plan's %.2f GiB"
                            % (name, peaks[name], 100 * (peaks[name] / plan - 1), plan))
    receivers = receiver_rows(run)
    phases = [dict(r, leg=1) for r in phase_rows(run.versions[:split])] + \
        [dict(r, leg=2) for r in phase_rows(run.versions[split:])]
    for p in phases:
        got = receivers.get((p["leg"], p["version"]), {})
        p["group_transfer_s"], p["subscriber_fetch_s"] = got.get("group"), got.get("subscriber")
    return {
        "shape": run.args.shape, "seconds": seconds, "steps": steps,
        "killed_during_save": run.killed_during_save, "left_after_kill": run.left_after_kill,
        "checkpoints_before_kill": run.killed_at, "resumed_version": resumed_version,
        "resumed_weights_exact": weights_exact,
        "checkpoint_bytes": du(os.path.join(ckpt, ckpt_dirs[-1])) if ckpt_dirs else 0,
        "peak_rss_gib": peaks,
        "plan_peak_gib": {k: v[0] for k, v in plans.items()},
        "plan_basis": {k: v[1] for k, v in plans.items()},
        "phases": phases,
        "subscriber": [{k: s[k] for k in ("version", "bytes", "time")} for s in subs],
        "group_worker": group, "failures": failures,
    }


def markdown(r):
    seconds = lambda x: "-" if x is None else "%.1f" % x  # noqa: E731
    out = ["Rehearsal of a %s-shaped model: %d steps in %.0f s; killed during a save: %s; "
           "resumed at version %s with the checkpoint's exact weights: %s."
           % (r["shape"], r["steps"], r["seconds"], r["killed_during_save"], r["resumed_version"],
              r["resumed_weights_exact"]), "",
           "| leg | version | wall s | train s | publish s | gRPC send s | generate s | rollout fetch s "
           "| fetch MB | rollout load s | group worker s | subscriber s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in r["phases"]:
        out.append("| %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.0f | %.2f | %s | %s |" % (
            p["leg"], p["version"], p["wall_s"], p["train_s"], p["publish_s"], p["grpc_send_s"],
            p["generate_s"], p["rollout_fetch_s"], p["rollout_fetch_bytes"] / 1e6, p["rollout_load_s"],
            seconds(p["group_transfer_s"]), seconds(p["subscriber_fetch_s"])))
    out += ["", "| process | peak GiB | plan GiB | against the plan | the plan counts |",
            "| --- | --- | --- | --- | --- |"]
    for name, gib in sorted(r["peak_rss_gib"].items()):
        plan = r["plan_peak_gib"].get(name)
        out.append("| %s | %.2f | %s | %s | %s |" % (
            name, gib, "%.2f" % plan if plan else "-", "%+.1f%%" % (100 * (gib / plan - 1)) if plan else "-",
            r["plan_basis"].get(name, "-")))
    out += ["", "checkpoint: %.2f GB; failures: %s" % (r["checkpoint_bytes"] / 1e9,
                                                      r["failures"] or "none"), ""]
    return "\n".join(out)
