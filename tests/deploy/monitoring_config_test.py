"""The shipped monitoring configuration, checked without running anything
long: deploy/prometheus/prometheus.yml discovers exactly the folders that
deploy/local_run.py and deploy/slurm/asympo.sbatch write their file_sd
targets into, and has no static target; every alert keeps the `run` label
of its series; every dashboard panel selects its run (and the panels fed by
Prometheus's own `up` and `ALERTS` also show what carries no run); the
Kubernetes PodMonitors put a `run` on their targets (their relabelling run
by `promtool check service-discovery` on made-up pods); the example
Alertmanager configuration (deploy/prometheus/alertmanager.yml) passes
`amtool check-config` and routes every alert of alerts.yml by its severity,
and a development run's alerts away from the pager (`amtool config routes
test`).

    python3 monitoring_config_test.py SOURCE_DIR WORK_DIR
Exit 0 on success, 1 on a failed check, 77 without promtool, amtool or
PyYAML.
"""
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    yaml = None

failures = []


def check(ok, what):
    print("%s: %s" % ("PASS" if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def file_sd_folders(src):
    """The folders prometheus.yml's file_sd globs name, resolved as
    Prometheus does (relative to the file), and whether any job has static
    targets."""
    folder = os.path.join(src, "deploy", "prometheus")
    with open(os.path.join(folder, "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    globs, static = [], []
    for job in config["scrape_configs"]:
        static += [job["job_name"] for key in job if key.endswith("_sd_configs") and key != "file_sd_configs"]
        static += [job["job_name"]] if "static_configs" in job else []
        for sd in job.get("file_sd_configs", []):
            globs += sd["files"]
    folders = sorted(os.path.normpath(os.path.join(folder, os.path.dirname(g))) for g in globs)
    return folders, globs, static


def written_folders(src):
    """Where local_run.py and the Slurm script write targets by default (run
    from, and submitted from, the checkout's root)."""
    with open(os.path.join(src, "deploy", "local_run.py")) as f:
        local = re.search(r'"--prometheus_targets", default=os.path.join\(([^)]*)\)', f.read())
    local_dir = os.path.join(src, *[p.strip().strip('"') for p in local.group(1).split(",")])
    with open(os.path.join(src, "deploy", "slurm", "asympo.sbatch")) as f:
        sbatch = f.read()
    shared = re.search(r"^ASYMPO_SHARED=\$\{ASYMPO_SHARED:-\$submit_dir/([^}]*)\}$", sbatch, re.M)
    prom = re.search(r"^ASYMPO_PROMETHEUS_DIR=\$\{ASYMPO_PROMETHEUS_DIR-\$ASYMPO_SHARED/([^}]*)\}$",
                     sbatch, re.M)
    check(local and shared and prom, "found the default target folders of local_run.py and asympo.sbatch")
    slurm_dir = os.path.join(src, shared.group(1), prom.group(1))
    return sorted(os.path.normpath(d) for d in (local_dir, slurm_dir))


def alert_checks(src):
    """No alert aggregates `run` away: each `by (...)` names it, none uses
    `without`, and no expression builds series from nothing (absent, vector)."""
    with open(os.path.join(src, "deploy", "prometheus", "alerts.yml")) as f:
        groups = yaml.safe_load(f)["groups"]
    lost = []
    for rule in (r for g in groups for r in g["rules"]):
        expr = rule["expr"]
        for by in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            if "run" not in [x.strip() for x in by.split(",")]:
                lost.append("%s: by (%s)" % (rule.get("alert") or rule.get("record"), by))
        if re.search(r"\bwithout\s*\(|\babsent\(|\bvector\(", expr):
            lost.append("%s: %s" % (rule.get("alert") or rule.get("record"), expr))
    names = [r["alert"] for g in groups for r in g["rules"] if "alert" in r]
    check(not lost, "every one of the %d alerts keeps its series' run label (lost: %s)" % (len(names), lost))
    check({"AsympoRewardCollapse", "AsympoRunEndedCollapsed", "AsympoRewardCollapseFromSeries",
           "AsympoSourceRewardCollapse"} <= set(names),
          "the collapse page, its warnings (series, source) and the ended-collapsed alert are there")


def dashboard_checks(src):
    with open(os.path.join(src, "deploy", "grafana", "asympo-dashboard.json")) as f:
        dash = json.load(f)
    wrong = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)
            for name, matchers in selectors:
                own = name in ("up", "ALERTS")  # Prometheus's series: run only where the target has one
                want = 'run=~"($run)|"' if own else 'run=~"$run"'
                if want not in matchers:
                    wrong.append("%s: %s" % (panel["title"], expr))
            if not selectors:
                wrong.append("%s: %s (no selector)" % (panel["title"], expr))
    check(not wrong, "every dashboard query selects the picked runs, up and ALERTS also those "
          "without a run (wrong: %s)" % wrong)


def podmonitor_checks(src, work):
    """The PodMonitors' relabelling, turned into the scrape configuration the
    Prometheus operator makes of it, applied by promtool to two made-up
    pods: one with app.kubernetes.io/instance, one without."""
    with open(os.path.join(src, "deploy", "kubernetes", "monitoring", "podmonitors.yaml")) as f:
        monitors = [m for m in yaml.safe_load_all(f) if m and m.get("kind") == "PodMonitor"]
    check(len(monitors) == 2, "two PodMonitors (learner, rollout)")
    os.makedirs(work, exist_ok=True)
    pods = [{"targets": ["10.0.0.1:9464"], "labels": {
                "__meta_kubernetes_namespace": "ns", "__meta_kubernetes_pod_name": "asympo-learner-0",
                "__meta_kubernetes_pod_label_app_kubernetes_io_instance": "run-7"}},
            {"targets": ["10.0.0.2:9465"], "labels": {
                "__meta_kubernetes_namespace": "ns", "__meta_kubernetes_pod_name": "asympo-rollout-x"}}]
    with open(os.path.join(work, "pods.json"), "w") as f:
        json.dump(pods, f)
    for m in monitors:
        for endpoint in m["spec"]["podMetricsEndpoints"]:
            relabel = [{re.sub(r"([A-Z])", lambda c: "_" + c.group(1).lower(), k): v for k, v in r.items()}
                       for r in endpoint.get("relabelings", [])]
            config = {"scrape_configs": [{
                "job_name": "pm", "honor_labels": endpoint.get("honorLabels", False),
                "file_sd_configs": [{"files": ["pods.json"]}], "relabel_configs": relabel}]}
            path = os.path.join(work, "pm.yml")
            with open(path, "w") as f:
                yaml.safe_dump(config, f)
            out = subprocess.run(["promtool", "check", "service-discovery", "--timeout=5s", path, "pm"],
                                 capture_output=True, text=True, timeout=60)
            try:
                targets = json.loads(out.stdout)
            except ValueError:
                targets = []
            runs = {t["labels"].get("instance"): t["labels"].get("run") for t in targets}
            check(runs == {"asympo-learner-0": "run-7", "asympo-rollout-x": "ns"},
                  "PodMonitor %s: run from the pod's app.kubernetes.io/instance, else the namespace (%s)"
                  % (m["metadata"]["name"], runs or out.stderr[-300:]))
            check(endpoint.get("honorLabels") is True,
                  "PodMonitor %s keeps the daemons' own run label (honorLabels)" % m["metadata"]["name"])


def routed_to(config, labels):
    """The receivers amtool resolves for an alert with LABELS (a dict)."""
    out = subprocess.run(["amtool", "config", "routes", "test", "--config.file=" + config] +
                         ["%s=%s" % kv for kv in sorted(labels.items())],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or out.stderr.strip()[-300:]


def alertmanager_checks(src):
    """The shipped Alertmanager configuration: valid, and each alert of
    alerts.yml routed by its severity (page to the pager, the rest to
    tickets), except a development run's (dev-*, test-*), which pages
    nobody; AsympoRewardCollapse's labels are one page per run."""
    config = os.path.join(src, "deploy", "prometheus", "alertmanager.yml")
    out = subprocess.run(["amtool", "check-config", config], capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, "amtool check-config alertmanager.yml (%s)" % out.stdout.strip()[-200:])
    with open(os.path.join(src, "deploy", "prometheus", "alerts.yml")) as f:
        alerts = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "alert" in r]
    want = {"page": "asympo-page", "warn": "asympo-tickets", "warning": "asympo-tickets"}
    wrong = []
    # The routes match on severity and run only: one alert of each severity
    # stands for the others (amtool takes a while to start).
    one_each = {r["labels"]["severity"]: r["alert"] for r in alerts}
    unknown = sorted(set(one_each) - set(want))
    check(not unknown, "every severity of alerts.yml has a route (unrouted: %s)" % unknown)
    cases = [(alert, severity, "r1", want.get(severity)) for severity, alert in sorted(one_each.items())]
    cases += [("X", severity, run, "asympo-dev") for severity in ("page", "warn") for run in ("dev-3", "test-ci-9")]
    for alert, severity, run, receiver in cases:
        got = routed_to(config, {"alertname": alert, "severity": severity, "run": run, "job": "asympo-learner"})
        if got != receiver:
            wrong.append("%s %s run=%s: %s (want %s)" % (alert, severity, run, got, receiver))
    check(not wrong, "amtool config routes test: an alert of each severity (%s) to its receiver, "
          "a dev-*/test-* run's to asympo-dev (wrong: %s)" % (", ".join(sorted(one_each)), wrong))
    check(routed_to(config, {"run": "device-1", "severity": "page"}) == "asympo-page",
          "a run whose name only starts like dev- still pages")
    with open(config) as f:
        route = yaml.safe_load(f)["route"]
    check("run" in route["group_by"], "notifications are grouped by run (%s)" % route["group_by"])


def main():
    src, work = sys.argv[1], sys.argv[2]
    if yaml is None or not shutil.which("promtool") or not shutil.which("amtool"):
        print("SKIP: PyYAML, promtool and amtool are needed")
        sys.exit(77)
    folders, globs, static = file_sd_folders(src)
    wanted = written_folders(src)
    check(not static, "prometheus.yml has no static (or other) targets, only file_sd (%s)" % static)
    check(folders == wanted and all(g.endswith("/*.json") for g in globs),
          "prometheus.yml reads exactly the folders local_run.py and asympo.sbatch write (%s; they "
          "write %s)" % (folders, wanted))
    alert_checks(src)
    dashboard_checks(src)
    podmonitor_checks(src, os.path.join(work, "podmonitors"))
    alertmanager_checks(src)
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
