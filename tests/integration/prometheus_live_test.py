"""The shipped monitoring against live runs: a real Prometheus with
deploy/prometheus/prometheus.yml (its scrape and rule intervals, 5 s and
15 s, and its file_sd folders; only the Alertmanager's address changed) and
alerts.yml, a real Alertmanager, and three runs at once:

- "live-collapse", found in the Slurm script's folder (runs/slurm/prometheus,
  a file as asympo.sbatch writes it): an asympo-learner fed by a generator
  whose rewards fall from 0.8 to 0.1, with one noisy step 20 s after the
  fall (mean 6.5: the reward EMA back within the detector's recovery band,
  so the detector clears) followed by 15 s without steps, and, when the
  page had not fired before that step, another such step 5 s after it
  fires (at least 5 s after the first one's pause); then the run stops
  while collapsed;
- "live-healthy": deploy/local_run.py with one rollout daemon learning the
  copy task (its own file in runs/prometheus_targets);
- "live-noisy": a learner fed rewards around 0.6 with step-to-step noise and
  now and then a step near 0.

Checks: AsympoRewardCollapse fires for the collapsing run within 65 s of
its reward EMA falling below half its peak (a noisy step does not hold it
off), stays firing through a noisy step after it fired, reaches the
Alertmanager's webhook with its run label and its own values, is not sent
as resolved
when the run stops: AsympoRunEndedCollapsed says that it ended collapsed.
Nothing fires, nor is pending, for the two healthy runs. Every query of the
Grafana dashboard is valid and has data. Before all that,
tests/deploy/monitoring_config_test.py checks the configuration itself.

    python3 prometheus_live_test.py SOURCE_DIR BUILD_DIR WORK_DIR
(its files in a new WORK_DIR/run-* folder, removed when every check passed).
Exit 0 on success, 1 on a failed check, 77 when Prometheus, the
Alertmanager or grpc are missing.
"""
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from learner_client import check, free_port, generate_stubs, grpc

COLLAPSE, HEALTHY, NOISY = "live-collapse", "live-healthy", "live-noisy"
CONFIG_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "monitoring_config_test.py")
PAGE = 'ALERTS{alertname="AsympoRewardCollapse",alertstate="firing",run="%s"}' % COLLAPSE


class Webhook(http.server.BaseHTTPRequestHandler):
    """The Alertmanager's receiver: keeps every alert it is sent, with the
    time it came."""
    received = []  # (time, status, labels, annotations)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        for a in body["alerts"]:
            Webhook.received.append((time.time(), a["status"], a["labels"], a["annotations"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def configs(src, work, am_port, hook_port):
    """The shipped prometheus.yml and alerts.yml in WORK/deploy/prometheus, so
    that its file_sd folders are WORK/runs/...; an Alertmanager
    configuration. Returns their paths."""
    conf = os.path.join(work, "deploy", "prometheus")
    os.makedirs(conf)
    shutil.copy(os.path.join(src, "deploy", "prometheus", "alerts.yml"), conf)
    with open(os.path.join(src, "deploy", "prometheus", "prometheus.yml")) as f:
        text = f.read()
    check(text.count('"127.0.0.1:9093"') == 1, "prometheus.yml sends alerts to 127.0.0.1:9093")
    prom = os.path.join(conf, "prometheus.yml")
    with open(prom, "w") as f:
        f.write(text.replace('"127.0.0.1:9093"', '"127.0.0.1:%d"' % am_port))
    am = os.path.join(work, "alertmanager.yml")
    with open(am, "w") as f:
        f.write("""route:
  receiver: hook
  group_by: [alertname, run]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs: [{url: "http://127.0.0.1:%d/", send_resolved: true}]
""" % hook_port)
    return prom, am


class Prometheus:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d/api/v1/" % port

    def query(self, expr):
        """The result list of an instant query; raises on an invalid one."""
        url = self.base + "query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            reply = json.load(r)
        if reply.get("status") != "success":
            raise ValueError("%s: %s" % (expr, reply))
        return reply["data"]["result"]

    def values(self, expr):
        """{run: value} of an instant query (run "" when the series has none)."""
        try:
            return {s["metric"].get("run", ""): float(s["value"][1]) for s in self.query(expr)}
        except OSError:
            return {}


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(1)
    check(False, "%s within %d s" % (what, timeout))


class CollapsePlan:
    """The collapsing run's rewards: mean 0.8 until fall(), then 0.1, but
    one noisy step (mean 6.5) 20 s after the fall, and another when
    noise_at() asks for one, each followed by 15 s without steps."""

    def __init__(self):
        self.fell, self.next_noise, self.noisy = None, None, []

    def fall(self):
        self.fell = time.time()
        self.next_noise = self.fell + 20

    def noise_at(self, when):
        self.next_noise = when

    def __call__(self, step):
        if self.fell is None:
            return [1.0, 1.0, 0.6, 0.6]
        now = time.time()
        if self.next_noise is not None and now >= self.next_noise:
            self.next_noise = None
            self.noisy.append(now)
            return [7.0, 7.0, 6.0, 6.0]
        if self.noisy and now - self.noisy[-1] < 15:
            return None
        return [0.2, 0.0, 0.2, 0.0]


def noisy_healthy(seed):
    """Rewards around 0.6 (+-0.2 per step), and every 40th step near 0."""
    rng = random.Random(seed)

    def rewards(step):
        if step % 40 == 39:
            return [0.1, 0.0, 0.1, 0.0]
        m = 0.6 + rng.uniform(-0.2, 0.2)
        return [m + 0.2, m + 0.2, m - 0.2, m - 0.2]
    return rewards


def generator(stubs, port, source, rewards, stop):
    """Submits one step's groups (2) every 0.1 s with rewards(step), or
    nothing while it returns None."""
    learner_pb2_grpc, rollout_pb2 = stubs
    stub = learner_pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % port))
    step = 0
    while not stop.is_set():
        r = rewards(step)
        if r is None:
            stop.wait(0.2)
            continue
        groups = [rollout_pb2.PromptGroup(
            prompt_id="p%d-%d" % (step, g), prompt_tokens=[1, 2 + g, 3],
            responses=[rollout_pb2.Response(tokens=[4 + i, 5, 6], reward=x) for i, x in enumerate(r)])
            for g in range(2)]
        try:
            stub.Submit(rollout_pb2.RolloutBatch(source=source, groups=groups), timeout=10)
            step += 1
        except grpc.RpcError:
            pass  # full queue or not up yet: try again
        stop.wait(0.1)


def dashboard_checks(src, prom):
    """Every dashboard query is valid and has data."""
    with open(os.path.join(src, "deploy", "grafana", "asympo-dashboard.json")) as f:
        dash = json.load(f)
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    check(len(exprs) >= 30, "the dashboard has %d queries in %d panels" %
          (len(exprs), sum(1 for p in dash["panels"] if p.get("targets"))))
    empty = [title for title, expr in exprs if not prom.query(expr.replace("$run", "live-.+"))]
    check(not empty, "every dashboard query has data from the live runs (none: %s)" % empty)
    runs = prom.values('count by (run) (asympo_learner_version{run=~"live-.+"})')
    check(set(runs) == {COLLAPSE, HEALTHY, NOISY}, "the dashboard's run variable offers the three runs")


def watch_page(prom, plan):
    """From the fall until 20 s after the pause of a noisy step that came
    after the page fired: the time the page first fires. The first noisy
    step comes 20 s after the fall; when the page had not fired by then (a
    slow learner, or the scrape's timing), a second comes 5 s after it
    fires (and 5 s after the first one's pause at the earliest, so that it
    lifts the EMA from its low, not above the peak). Checks that the page never stops once fired, that it fired within
    65 s of the learner's reward EMA falling below half its peak (35 s by
    the rules, plus the noisy step's pause: the noisy step did not hold it
    off), and that the detector cleared during the first noisy step."""
    fired, ema_fell, detector, trace = None, None, [], []
    while True:
        now = time.time()
        firing = bool(prom.values(PAGE))
        ema = prom.values('asympo_learner_reward_ema{run="%s"}' % COLLAPSE).get(COLLAPSE)
        peak = prom.values('asympo_learner_reward_ema_peak{run="%s"}' % COLLAPSE).get(COLLAPSE)
        trace.append("%.0f:%s/%s%s" % (now - plan.fell, ema, peak, "!" if firing else ""))
        if ema_fell is None and ema is not None and peak is not None and peak - ema > max(0.5 * peak, 0.05):
            ema_fell = now
        if fired is None and firing:
            fired = now
            if plan.noisy:  # fired after the first noisy step: another, once its pause is over
                plan.noise_at(max(fired + 5, plan.noisy[0] + 20))
        if fired is not None and not firing:
            check(False, "the page, once fired, stays firing (not at %.0f s after the fall; %s)"
                  % (now - plan.fell, " ".join(trace)))
        detector.append(prom.values('asympo_learner_collapse_suspected{run="%s"}' % COLLAPSE).get(COLLAPSE))
        if fired is not None and plan.next_noise is None and plan.noisy and now >= plan.noisy[-1] + 35:
            break
        if now > plan.fell + 150:
            check(False, "the page fired, and a noisy step after it came and went, within 150 s of the fall "
                  "(fired: %s; EMA/peak by second after the fall, ! firing: %s)"
                  % (fired and "%.1f s" % (fired - plan.fell), " ".join(trace)))
        time.sleep(1)
    print("fall to page: %.1f s; the EMA below half its peak %.1f s after the fall; noisy steps at %s s"
          % (fired - plan.fell, ema_fell - plan.fell, ", ".join("%.1f" % (t - plan.fell) for t in plan.noisy)))
    check(fired - ema_fell <= 65, "the page fired within 65 s of the reward EMA falling below half its peak, "
          "through the noisy step (%.1f s)" % (fired - ema_fell))
    check(fired < plan.noisy[-1], "AsympoRewardCollapse stayed firing through a noisy step after it fired")
    cleared = 1 in detector and 0 in detector[detector.index(1):]
    check(cleared, "the learner's detector cleared during the noisy step (%s)" % detector)
    return fired


def delivered(alertname, status):
    return [(t, labels, notes) for t, s, labels, notes in Webhook.received
            if labels.get("alertname") == alertname and s == status and labels.get("run") == COLLAPSE]


def page_checks(prom, fired):
    wait_for("the Alertmanager delivers the page to the webhook",
             lambda: delivered("AsympoRewardCollapse", "firing"), 30)
    t, labels, notes = delivered("AsympoRewardCollapse", "firing")[0]
    print("delivered %.1f s after firing:" % (t - fired), json.dumps(labels), notes["description"])
    check(labels["severity"] == "page" and labels.get("job") == "asympo-learner" and
          "exported_run" not in labels and "instance" not in labels,
          "the delivered page carries run=%s (once), its job and severity page, and no address (one "
          "page per run, whatever address its learner restarts on)" % COLLAPSE)
    ema = float(notes["description"].split("Reward EMA ")[1].split(" ")[0])
    peak = float(notes["description"].split("(peak ")[1].split(")")[0])
    # The EMA of the moment it fired: 0.1-0.4 after the fall, or up to 0.75
    # when it fires during the noisy step's pause.
    check(0.05 < ema < 0.76 and 0.7 < peak < 0.85,
          "its description quotes the collapsing run's own EMA %.3f and peak %.3f" % (ema, peak))
    check(set(prom.values('ALERTS{alertname="AsympoRewardCollapse"}')) == {COLLAPSE},
          "it fires for that run only")
    others = prom.query('ALERTS{run="%s",alertname!~"AsympoRewardCollapse.*"}' % COLLAPSE)
    check(not others, "no other alert for the collapsing run (%s)" % others)


def healthy_checks(prom):
    for run in (HEALTHY, NOISY):
        alerts = prom.query('max_over_time(ALERTS{run="%s"}[15m])' % run)
        check(not alerts, "no alert, not even pending, for the healthy run %s (%s)" % (run, alerts))
        flagged = prom.values('max_over_time(asympo_learner_collapse_suspected{run="%s"}[15m])' % run)
        state = prom.values('max_over_time(asympo_learner:reward_collapse{run="%s"}[15m])' % run)
        check(flagged.get(run) == 0 and state.get(run) == 0,
              "%s: neither the detector nor the page's windowed state ever flagged it" % run)
    rise = prom.values('asympo_learner_reward_ema{run="%s"} - '
                       'min_over_time(asympo_learner_reward_ema{run="%s"}[15m])' % (HEALTHY, HEALTHY))
    steps = prom.values('asympo_learner_steps_total{run=~"%s|%s"}' % (HEALTHY, NOISY))
    print("healthy runs: %s steps; %s reward EMA %.3f above its lowest" % (steps, HEALTHY, rise.get(HEALTHY, 0)))
    check(steps.get(HEALTHY, 0) >= 50 and steps.get(NOISY, 0) >= 200 and rise.get(HEALTHY, 0) > 0.02,
          "the healthy runs trained and %s's reward rose" % HEALTHY)


def stop_checks(prom, stopped):
    """The collapsing run has stopped: the page is not resolved, and
    AsympoRunEndedCollapsed says the run ended collapsed."""
    ended = 'ALERTS{alertname="AsympoRunEndedCollapsed",alertstate="firing",run="%s"}' % COLLAPSE
    wait_for("AsympoRunEndedCollapsed fires", lambda: prom.values(ended), 60)
    print("run stopped to AsympoRunEndedCollapsed: %.1f s" % (time.time() - stopped))
    wait_for("the Alertmanager delivers it", lambda: delivered("AsympoRunEndedCollapsed", "firing"), 30)
    print("delivered:", delivered("AsympoRunEndedCollapsed", "firing")[0][2]["summary"])
    hold = time.time() + 30
    while time.time() < hold:
        if not prom.values(PAGE):
            check(False, "the page stays firing after the run stopped")
        time.sleep(1)
    check(True, "the page stayed firing for 30 s more")
    check(not delivered("AsympoRewardCollapse", "resolved"),
          "the page was never sent as resolved (%s)" % delivered("AsympoRewardCollapse", "resolved"))


def start(name, cmd, work, **kw):
    log = open(os.path.join(work, name + ".log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kw)


def learner(build, work, name, api, metrics):
    return start("learner-" + name, [
        os.path.join(build, "learner_server", "asympo-learner"), "--listen=127.0.0.1:%d" % api,
        "--metrics_address=127.0.0.1:%d" % metrics, "--run_name=" + name,
        "--prompts_per_step=2", "--queue_capacity=8", "--max_groups_per_batch=8", "--lr=1e-4"], work)


def monitoring(src, work, prometheus_bin, am_bin):
    """Starts the webhook, the Alertmanager and Prometheus; returns the
    webhook's server, Prometheus's port and the two processes."""
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    prom_port, am_port = free_port(), free_port()
    prom_cfg, am_cfg = configs(src, work, am_port, hook.server_address[1])
    procs = [start("alertmanager", [am_bin, "--config.file=" + am_cfg, "--storage.path=" +
                                    os.path.join(work, "am-data"), "--web.listen-address=127.0.0.1:%d" % am_port,
                                    "--cluster.listen-address="], work),
             start("prometheus", [prometheus_bin, "--config.file=" + prom_cfg, "--storage.tsdb.path=" +
                                  os.path.join(work, "prom-data"),
                                  "--web.listen-address=127.0.0.1:%d" % prom_port], work)]
    return hook, prom_port, procs


def work_folders(root):
    """A folder of its own under ROOT (a second run of this test at the same
    time, in the same build tree, must not delete this one's files) and its
    two file_sd folders, as in a checkout."""
    os.makedirs(root, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=root)
    print("work folder:", work)
    folders = [os.path.join(work, "runs", "prometheus_targets"), os.path.join(work, "runs", "slurm", "prometheus")]
    for d in folders:
        os.makedirs(d)
    return [work] + folders


def main():
    src, build, work = sys.argv[1], sys.argv[2], sys.argv[3]
    prometheus_bin, am_bin = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if not prometheus_bin or not am_bin:
        print("SKIP: prometheus and prometheus-alertmanager (Debian packages) are needed")
        sys.exit(77)
    work, local_targets, slurm_targets = work_folders(work)
    rc = subprocess.call([sys.executable, CONFIG_TEST, src, os.path.join(work, "config")])
    check(rc == 0, "tests/deploy/monitoring_config_test.py (exit %d)" % rc)
    learner_pb2, learner_pb2_grpc, rollout_pb2 = generate_stubs(
        os.path.join(src, "proto"), os.path.join(work, "stubs"))
    stubs = (learner_pb2_grpc, rollout_pb2)

    hook, prom_port, procs = monitoring(src, work, prometheus_bin, am_bin)
    ports = {name: (free_port(), free_port()) for name in (COLLAPSE, NOISY)}
    collapsing = learner(build, work, COLLAPSE, *ports[COLLAPSE])
    procs.append(learner(build, work, NOISY, *ports[NOISY]))
    slurm_file = os.path.join(slurm_targets, "asympo-4242-learner.json")
    write_json(slurm_file, [{"targets": ["127.0.0.1:%d" % ports[COLLAPSE][1]], "labels": {
        "job": "asympo-learner", "run": COLLAPSE, "slurm_job_id": "4242"}}])
    write_json(os.path.join(local_targets, NOISY + ".json"), [
        {"targets": ["127.0.0.1:%d" % ports[NOISY][1]], "labels": {"job": "asympo-learner", "run": NOISY}}])
    healthy = start("local_run", [
        sys.executable, os.path.join(src, "deploy", "local_run.py"), "--build_dir", build,
        "--out", os.path.join(work, "healthy"), "--run_name", HEALTHY, "--prometheus_targets", local_targets,
        "--rollouts", "1", "--max_steps", "0", "--minutes", "8", "--lr_schedule", "constant",
        "--no_eval", "--interval", "30"], work)
    plan, stop, stop_collapse = CollapsePlan(), threading.Event(), threading.Event()
    generators = [threading.Thread(target=generator, args=(stubs, ports[COLLAPSE][0], "collapsing", plan,
                                                           stop_collapse)),
                  threading.Thread(target=generator, args=(stubs, ports[NOISY][0], "noisy", noisy_healthy(7),
                                                           stop))]
    for g in generators:
        g.start()
    prom = Prometheus(prom_port)
    try:
        wait_for("Prometheus scrapes the three learners from the two file_sd folders",
                 lambda: prom.values('up{job="asympo-learner"} == 1').keys() >= {COLLAPSE, HEALTHY, NOISY}, 90)
        check(True, "the three learners are up in Prometheus, told apart by their run label")
        up = time.time()
        time.sleep(30)  # a healthy stretch in every window of the rules
        plan.fall()
        fired = watch_page(prom, plan)
        page_checks(prom, fired)
        dashboard_checks(src, prom)
        os.remove(slurm_file)  # as asympo.sbatch does at the end of its job
        stop_collapse.set()
        collapsing.send_signal(signal.SIGTERM)
        stopped = time.time()
        stop_checks(prom, stopped)
        time.sleep(max(0, up + 210 - time.time()))  # the healthy runs watched for 3.5 minutes at least
        healthy_checks(prom)
    finally:
        stop.set()
        stop_collapse.set()
        for g in generators:
            g.join()
        healthy.send_signal(signal.SIGINT)
        healthy.wait(timeout=60)
        for p in procs + [collapsing]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs + [collapsing]:
            p.wait(timeout=30)
        hook.shutdown()
    check(not os.path.exists(os.path.join(local_targets, HEALTHY + ".json")),
          "local_run removed its targets file when it stopped")
    shutil.rmtree(work, ignore_errors=True)  # kept where a check failed


if __name__ == "__main__":
    main()
