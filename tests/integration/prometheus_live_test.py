"""The shipped monitoring against live runs: a real Prometheus with
deploy/prometheus/alerts.yml, a real Alertmanager, and two runs at once.

- "live-collapse": an asympo-learner fed by a generator whose rewards fall
  from 0.8 to 0.1 after 40 steps (what a collapsing policy's rollouts look
  like to the learner);
- "live-healthy": deploy/local_run.py with one rollout daemon learning the
  copy task.

Checks: Prometheus discovers both runs from the file_sd targets the test and
local_run write; AsympoRewardCollapse fires for the collapsing run only and
reaches the Alertmanager's webhook with its run label and its own values;
nothing fires for the healthy run; every query of the Grafana dashboard
(deploy/grafana/asympo-dashboard.json) is valid, and its main panels have
data. Prometheus scrapes and evaluates every second here, so the alerts'
own `for:` periods (2 minutes for the collapse) set the test's length.

    python3 prometheus_live_test.py SOURCE_DIR BUILD_DIR WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when Prometheus, the
Alertmanager or grpc are missing.
"""
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from learner_client import check, free_port, generate_stubs, grpc

COLLAPSE, HEALTHY = "live-collapse", "live-healthy"


class Webhook(http.server.BaseHTTPRequestHandler):
    """The Alertmanager's receiver: keeps every notification it is sent."""
    received = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Webhook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def configs(src, work, targets, am_port, hook_port):
    """Prometheus and Alertmanager configurations; returns their paths."""
    prom = os.path.join(work, "prometheus.yml")
    with open(prom, "w") as f:
        f.write("""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%s]
alerting:
  alertmanagers:
    - static_configs: [{targets: ["127.0.0.1:%d"]}]
scrape_configs:
  - job_name: asympo
    honor_labels: true
    file_sd_configs: [{files: ["%s/*.json"], refresh_interval: 1s}]
""" % (json.dumps(os.path.join(src, "deploy", "prometheus", "alerts.yml")), am_port, targets))
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
    webhook_configs: [{url: "http://127.0.0.1:%d/", send_resolved: false}]
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


def collapsing_generator(stubs, port, stop):
    """Submits one step's groups (2) every 0.1 s: rewards with mean 0.8 for
    40 steps, then 0.1."""
    learner_pb2_grpc, rollout_pb2 = stubs
    channel = grpc.insecure_channel("127.0.0.1:%d" % port)
    stub = learner_pb2_grpc.LearnerStub(channel)
    step = 0
    while not stop.is_set():
        rewards = [1.0, 1.0, 0.6, 0.6] if step < 40 else [0.2, 0.0, 0.2, 0.0]
        groups = [rollout_pb2.PromptGroup(
            prompt_id="p%d-%d" % (step, g), prompt_tokens=[1, 2 + g, 3],
            responses=[rollout_pb2.Response(tokens=[4 + i, 5, 6], reward=r)
                       for i, r in enumerate(rewards)]) for g in range(2)]
        try:
            stub.Submit(rollout_pb2.RolloutBatch(source="collapsing", groups=groups), timeout=10)
            step += 1
        except grpc.RpcError:
            pass  # full queue or not up yet: try again
        stop.wait(0.1)


def dashboard_checks(src, prom):
    """Every dashboard query is valid; the main panels have data."""
    with open(os.path.join(src, "deploy", "grafana", "asympo-dashboard.json")) as f:
        dash = json.load(f)
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    check(len(exprs) >= 30, "the dashboard has %d queries in %d panels" %
          (len(exprs), sum(1 for p in dash["panels"] if p.get("targets"))))
    empty = []
    for title, expr in exprs:
        result = prom.query(expr.replace("$run", "live-.+"))
        if not result:
            empty.append(title)
    check(not empty, "every dashboard query has data from the live runs (none: %s)" % empty)
    runs = prom.values('count by (run) (asympo_learner_version{run=~"live-.+"})')
    check(set(runs) == {COLLAPSE, HEALTHY}, "the dashboard's run variable offers both runs")


def collapse_checks(prom):
    """The collapse alert fires for the collapsing run, through the
    Alertmanager, quoting its own values; nothing fires for the healthy one."""
    firing = 'ALERTS{alertname="AsympoRewardCollapse",alertstate="firing"}'
    wait_for("AsympoRewardCollapse fires for %s" % COLLAPSE,
             lambda: COLLAPSE in prom.values(firing), 200)
    check(set(prom.values(firing)) == {COLLAPSE}, "it fires for that run only")
    wait_for("the Alertmanager delivers it to the webhook",
             lambda: any(a["labels"].get("alertname") == "AsympoRewardCollapse"
                         for n in Webhook.received for a in n["alerts"]), 30)
    alert = [a for n in Webhook.received for a in n["alerts"]
             if a["labels"].get("alertname") == "AsympoRewardCollapse"][0]
    print("delivered:", json.dumps(alert["labels"]), alert["annotations"]["description"])
    check(alert["labels"]["run"] == COLLAPSE and alert["labels"]["severity"] == "page" and
          "exported_run" not in alert["labels"],
          "the delivered alert carries run=%s (once) and severity page" % COLLAPSE)
    description = alert["annotations"]["description"]
    ema = float(description.split("Reward EMA ")[1].split(" ")[0])
    peak = float(description.split("(peak ")[1].split(")")[0])
    check(ema < 0.3 and 0.7 < peak < 0.85,
          "its description quotes the collapsing run's own EMA %.3f and peak %.3f" % (ema, peak))
    pending = prom.values('ALERTS{alertname="AsympoRewardCollapseFromSeries"}')
    check(COLLAPSE in pending and HEALTHY not in pending,
          "AsympoRewardCollapseFromSeries is under way for the collapsing run only")
    others = prom.query('ALERTS{run="%s",alertname!~"AsympoRewardCollapse.*"}' % COLLAPSE)
    check(not others, "no other alert for the collapsing run (%s)" % others)
    healthy = prom.query('max_over_time(ALERTS{run="%s"}[15m])' % HEALTHY)
    check(not healthy, "no alert, not even pending, for the healthy run (%s)" % healthy)
    flagged = prom.values('max_over_time(asympo_learner_collapse_suspected{run="%s"}[15m])' % HEALTHY)
    check(flagged.get(HEALTHY) == 0, "the healthy run's detector never flagged it")
    rise = prom.values('asympo_learner_reward_ema{run="%s"} - '
                       'min_over_time(asympo_learner_reward_ema{run="%s"}[15m])' % (HEALTHY, HEALTHY))
    steps = prom.values('asympo_learner_steps_total{run="%s"}' % HEALTHY)
    print("healthy run: %d steps, reward EMA %.3f above its lowest" %
          (steps.get(HEALTHY, 0), rise.get(HEALTHY, 0)))
    check(steps.get(HEALTHY, 0) >= 50 and rise.get(HEALTHY, 0) > 0.02,
          "the healthy run trained and its reward rose")


def start(name, cmd, work, **kw):
    log = open(os.path.join(work, name + ".log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kw)


def main():
    src, build, work = sys.argv[1], sys.argv[2], sys.argv[3]
    prometheus_bin, am_bin = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if not prometheus_bin or not am_bin:
        print("SKIP: prometheus and prometheus-alertmanager (Debian packages) are needed")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    targets = os.path.join(work, "targets")
    os.makedirs(targets)
    learner_pb2, learner_pb2_grpc, rollout_pb2 = generate_stubs(
        os.path.join(src, "proto"), os.path.join(work, "stubs"))

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    prom_port, am_port = free_port(), free_port()
    prom_cfg, am_cfg = configs(src, work, targets, am_port, hook.server_address[1])
    procs = [start("alertmanager", [am_bin, "--config.file=" + am_cfg, "--storage.path=" +
                                    os.path.join(work, "am-data"), "--web.listen-address=127.0.0.1:%d" % am_port,
                                    "--cluster.listen-address="], work),
             start("prometheus", [prometheus_bin, "--config.file=" + prom_cfg, "--storage.tsdb.path=" +
                                  os.path.join(work, "prom-data"),
                                  "--web.listen-address=127.0.0.1:%d" % prom_port], work)]
    api, metrics = free_port(), free_port()
    procs.append(start("learner-collapse", [
        os.path.join(build, "learner_server", "asympo-learner"), "--listen=127.0.0.1:%d" % api,
        "--metrics_address=127.0.0.1:%d" % metrics, "--run_name=" + COLLAPSE,
        "--prompts_per_step=2", "--queue_capacity=8", "--max_groups_per_batch=8", "--lr=1e-4"], work))
    write_json(os.path.join(targets, COLLAPSE + ".json"), [
        {"targets": ["127.0.0.1:%d" % metrics], "labels": {"job": "asympo-learner", "run": COLLAPSE}}])
    healthy = start("local_run", [
        sys.executable, os.path.join(src, "deploy", "local_run.py"), "--build_dir", build,
        "--out", os.path.join(work, "healthy"), "--run_name", HEALTHY, "--prometheus_targets", targets,
        "--rollouts", "1", "--max_steps", "0", "--minutes", "8", "--lr_schedule", "constant",
        "--no_eval", "--interval", "30"], work)
    stop = threading.Event()
    generator = threading.Thread(target=collapsing_generator, args=((learner_pb2_grpc, rollout_pb2), api, stop))
    generator.start()
    prom = Prometheus(prom_port)
    try:
        wait_for("Prometheus scrapes both runs' learners from the file_sd targets",
                 lambda: prom.values('up{job="asympo-learner"} == 1').keys() >= {COLLAPSE, HEALTHY}, 90)
        check(True, "both learners are up in Prometheus, told apart by their run label")
        wait_for("the collapsing run's detector flags it",
                 lambda: prom.values('asympo_learner_collapse_suspected == 1').get(COLLAPSE), 60)
        collapse_checks(prom)
        dashboard_checks(src, prom)
    finally:
        stop.set()
        generator.join()
        healthy.send_signal(signal.SIGINT)
        healthy.wait(timeout=60)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
        hook.shutdown()
    check(not os.path.exists(os.path.join(targets, HEALTHY + ".json")),
          "local_run removed its targets file when it stopped")


if __name__ == "__main__":
    main()
