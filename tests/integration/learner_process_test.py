"""A real asympo-learner process, in two scenarios:

kill_restart: kill -9 and restart; the restarted learner resumes from the
  newest checkpoint, and its weights are the checkpoint's bit for bit
  (compared through --export_dir).
skipped_steps: steps that fail (a NaN loss, a LibTorch exception, injected
  with the --fault_* flags) are skipped and counted by reason on /metrics,
  logged once per reason, and training goes on to a clean exit.
retry_after_deadline: a Submit the learner accepts but answers after the
  client's deadline (--fault_submit_reply_delay) is sent again with its
  batch_id: acknowledged as a duplicate, trained once, counted on /metrics.
poisoned: rewards beyond --max_abs_reward are refused; with the bound
  raised, a group whose rewards overflow is dropped from its step while the
  others train, and its source is quarantined after repeated poison.
readiness: GET /ready on the metrics port is 200 while the learner is idle
  (its queue empty, or short of a step), 503 naming the stuck training loop
  while a step takes longer than --ready_stall_timeout (--fault_step_delay),
  and 200 again once it is done.
retry_after_restart: batch ids survive a restart from a checkpoint (SIGTERM,
  then kill -9): a trained batch sent again is a duplicate, a batch that was
  still queued at the stop is accepted again and trained once.

    python3 learner_process_test.py SCENARIO PROTO_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc/grpc_tools are missing.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

from learner_client import check, free_port, generate_stubs, grpc

# The launcher's /metrics sample names, without the run label.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy"))
import local_run  # noqa: E402


def tensors(path):
    """name -> raw bytes of every tensor in a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


class Learner:
    """Starts asympo-learner processes and talks to them."""

    def __init__(self, proto_dir, binary, work):
        self.binary, self.work = binary, work
        shutil.rmtree(work, ignore_errors=True)
        self.pb2, self.pb2_grpc, self.rollout_pb2 = generate_stubs(proto_dir, work)
        self.ckpt = os.path.join(work, "ckpt")

    def start(self, port, extra, metrics_address=""):
        self.log_path = os.path.join(self.work, "learner-%d.log" % port)
        log = open(self.log_path, "w")
        return subprocess.Popen([self.binary, "--listen=127.0.0.1:%d" % port,
                                 "--metrics_address=" + metrics_address,
                                 "--prompts_per_step=2", "--checkpoint_every=1", "--lr=1e-3",
                                 "--checkpoint_dir=" + self.ckpt] + extra,
                                stdout=log, stderr=subprocess.STDOUT)

    def stub_for(self, port):
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        grpc.channel_ready_future(channel).result(timeout=60)
        return self.pb2_grpc.LearnerStub(channel)

    def feed_until(self, stub, version):
        """Submits one-group batches until the learner reaches `version`."""
        i = 0
        while stub.GetStatus(self.pb2.GetStatusRequest()).version < version:
            stub.Submit(self.rollout_pb2.RolloutBatch(groups=[self.rollout_pb2.PromptGroup(
                prompt_id="p%d" % i, prompt_tokens=[1, 2, 3 + i % 50], responses=[
                    self.rollout_pb2.Response(tokens=[5 + (i + r) % 50, 9], reward=float(r == i % 3))
                    for r in range(3)])]))
            i += 1


def metric(text, name):
    """The value of the sample `name` (with its labels but the run label,
    which every series has) in a scrape."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if local_run.without_run_label(sample) == name:
            return float(value)
    return None


def skipped_steps(learner):
    port, metrics_port = free_port(), free_port()
    proc = learner.start(port, ["--fault_nonfinite_loss_steps=2,4", "--fault_exception_steps=3"],
                         "127.0.0.1:%d" % metrics_port)
    learner.feed_until(learner.stub_for(port), 3)
    scrape = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read()
    scrape = scrape.decode()
    skipped = 'asympo_learner_steps_skipped_total{reason="%s"}'
    check(metric(scrape, skipped % "nonfinite_loss") == 2, "two NaN-loss steps counted")
    check(metric(scrape, skipped % "torch_error") == 1, "one LibTorch-exception step counted")
    check(metric(scrape, "asympo_learner_skipped_groups_total") == 6, "their 6 groups counted")
    status = learner.stub_for(port).GetStatus(learner.pb2.GetStatusRequest())
    in_step = status.accepted_groups - (status.trained_groups + status.skipped_groups +
                                        status.queue_depth_groups)
    check(status.skipped_groups == 6 and in_step in (0, 2),  # a step holds 2 groups
          "GetStatus: accepted %d = trained %d + skipped %d + queued %d (+ a step's 2)" % (
              status.accepted_groups, status.trained_groups, status.skipped_groups,
              status.queue_depth_groups))
    check(metric(scrape, "asympo_learner_steps_total") >= 3, "training went on")
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")
    log = open(learner.log_path).read()
    check(log.count("step skipped (nonfinite_loss)") == 1,
          "the second NaN loss within a minute is not logged again")
    check(log.count("step skipped (torch_error)") == 1, "the exception is logged")
    check("frame #" not in log, "no LibTorch backtrace in the log")


def skipped_in_a_row(learner):
    """A learner whose every step fails stops, rather than take groups for ever."""
    port = free_port()
    proc = learner.start(port, ["--fault_nonfinite_loss_steps=1,2,3,4,5,6,7,8",
                                "--max_consecutive_skipped_steps=3"])
    stub = learner.stub_for(port)
    deadline = time.time() + 60
    i = 0
    while proc.poll() is None and time.time() < deadline:
        try:
            stub.Submit(batch(learner, "", 1, "s%d-" % i), timeout=5)
        except grpc.RpcError:
            pass  # the learner is stopping
        i += 1
        time.sleep(0.02)
    check(proc.wait(timeout=60) == 2, "the learner exits 2 after 3 skipped steps in a row")
    log = open(learner.log_path).read()
    check("3 training steps in a row were skipped (the last: " in log and
          "--max_consecutive_skipped_steps" in log, "the log says why")
    check(os.path.isdir(os.path.join(learner.ckpt, "ckpt-%012d" % 0)),
          "the unchanged weights were checkpointed")


def stop_during_start(learner):
    """SIGTERM while rank 0 waits for a rank that never comes: the learner
    ends at once, not after its rendezvous timeout."""
    port, master = free_port(), free_port()
    proc = learner.start(port, ["--dist_world_size=2", "--dist_rank=0", "--dist_insecure",
                                "--dist_master_addr=127.0.0.1", "--dist_master_port=%d" % master,
                                "--dist_timeout=5m"])
    time.sleep(2)
    check(proc.poll() is None, "rank 0 waits for rank 1")
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    check(rc == 1 and time.time() - t0 < 5, "it ends at once (%.1f s, exit %d)" % (time.time() - t0, rc))
    check("stopped by a signal during start-up" in open(learner.log_path).read(), "and says why")
    # From the "ready" line on, a stop is clean, however soon after it comes
    # (three starts; the later ones resume the checkpoint the first wrote).
    for i in range(3):
        proc = learner.start(free_port(), [])
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and "ready: " not in open(learner.log_path).read():
            time.sleep(0.01)
        check("ready: " in open(learner.log_path).read(), "start %d: the learner logs ready" % i)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        check(rc == 0, "SIGTERM as soon as the learner logs ready: exit 0 (start %d, exit %d; log tail: %s)"
              % (i, rc, open(learner.log_path).read()[-600:]))


def kill_restart(learner):
    port = free_port()
    proc = learner.start(port, [])
    learner.feed_until(learner.stub_for(port), 4)
    ckpt, export = learner.ckpt, os.path.join(learner.work, "export")
    learner_pb2 = learner.pb2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpts = sorted(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))
    check(len(ckpts) >= 1, "checkpoints written before the kill: %s" % ckpts)
    newest = ckpts[-1]
    version = int(newest[5:])

    # Restart, then stop at once: the export holds the restored weights.
    port = free_port()
    proc = learner.start(port, ["--export_dir=" + export])
    status = learner.stub_for(port).GetStatus(learner_pb2.GetStatusRequest())
    check(status.version == version, "restart resumed version %d" % version)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")
    # One process writes each parameter whole, as the piece "weight/<name>/0".
    saved = tensors(os.path.join(ckpt, newest, "shard-00000-of-00001.safetensors"))
    exported = tensors(os.path.join(export, "model.safetensors"))
    check(len(exported) > 0 and all(saved["weight/%s/0" % k] == v for k, v in exported.items()),
          "restored weights equal the checkpoint's bit for bit (%d tensors)" % len(exported))
    check(any(k.startswith("exp_avg/") for k in saved), "the checkpoint carries optimizer state")


def batch(learner, batch_id, groups, tag):
    pb = learner.rollout_pb2
    return pb.RolloutBatch(source="exactly-once-test", batch_id=batch_id, groups=[pb.PromptGroup(
        prompt_id="%s%d" % (tag, g), prompt_tokens=[1, 2, 3 + g], responses=[
            pb.Response(tokens=[5 + g + r, 9], reward=float(r == g % 3)) for r in range(3)])
        for g in range(groups)])


def wait_status(learner, stub, what, cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = stub.GetStatus(learner.pb2.GetStatusRequest())
        if cond(status):
            return status
        time.sleep(0.05)
    check(False, what + " (last status: %s)" % str(status).replace("\n", " "))


def retry_after_deadline(learner):
    port, metrics_port = free_port(), free_port()
    proc = learner.start(port, ["--fault_submit_reply_delay=1s"], "127.0.0.1:%d" % metrics_port)
    stub = learner.stub_for(port)
    try:
        stub.Submit(batch(learner, "ext/a", 1, "a"), timeout=0.3)
        check(False, "the first Submit's reply came after its 0.3 s deadline")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, "the first Submit timed out: %s" % e.code())
    wait_status(learner, stub, "the learner accepted it all the same",
                lambda s: s.accepted_groups == 1)
    reply = stub.Submit(batch(learner, "ext/a", 1, "a"), timeout=10)
    check(reply.duplicate_batches == 1 and reply.accepted_groups == 1,
          "the retry is acknowledged as a duplicate of an accepted batch")
    stub.Submit(batch(learner, "ext/b", 1, "b"), timeout=10)
    status = wait_status(learner, stub, "one step trained a and b", lambda s: s.version >= 1)
    check(status.accepted_groups == 2 and status.trained_groups == 2 and
          status.duplicate_batches == 1 and status.queue_depth_groups == 0,
          "accepted 2 = trained 2, 1 duplicate, nothing queued (%d/%d/%d/%d)" % (
              status.accepted_groups, status.trained_groups, status.duplicate_batches,
              status.queue_depth_groups))
    scrape = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10).read()
    check(metric(scrape.decode(), 'asympo_learner_batches_total{result="duplicate"}') == 1,
          "the duplicate is counted on /metrics")
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")


def retry_after_restart(learner):
    port = free_port()
    proc = learner.start(port, [])
    stub = learner.stub_for(port)
    stub.Submit(batch(learner, "ext/a", 2, "a"), timeout=10)
    wait_status(learner, stub, "a trained at version 1", lambda s: s.version == 1)
    stub.Submit(batch(learner, "ext/b", 1, "b"), timeout=10)  # one group: waits for a second
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit with b untrained")
    meta = json.load(open(os.path.join(learner.ckpt, "ckpt-%012d" % 1, "meta.json")))
    recorded = [b["id"] for b in meta.get("batches", [])]
    check(recorded == ["ext/a"] and meta["batches"][0]["trained"] == [0, 1] and
          len(meta["batches"][0]["digest"]) == 64,
          "the checkpoint keeps the trained batch only, with its digest: %s" % meta.get("batches"))

    port = free_port()
    proc = learner.start(port, [])
    stub = learner.stub_for(port)
    check(stub.Submit(batch(learner, "ext/a", 2, "a"), timeout=10).duplicate_batches == 1,
          "after the restart, a (trained) sent again is a duplicate")
    check(stub.Submit(batch(learner, "ext/b", 1, "b"), timeout=10).duplicate_batches == 0,
          "b (queued, not trained, at the stop) is accepted again")
    stub.Submit(batch(learner, "ext/c", 1, "c"), timeout=10)
    status = wait_status(learner, stub, "b and c trained at version 2", lambda s: s.version == 2)
    check(status.accepted_groups == 2 and status.trained_groups == 2 and
          status.duplicate_batches == 1, "this process trained b and c once each")
    wait_status(learner, stub, "checkpoint 2 written",
                lambda s: os.path.isdir(os.path.join(learner.ckpt, "ckpt-%012d" % 2)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    port = free_port()
    proc = learner.start(port, [])
    stub = learner.stub_for(port)
    dups = [stub.Submit(batch(learner, i, n, i[-1]), timeout=10).duplicate_batches
            for i, n in (("ext/a", 2), ("ext/b", 1), ("ext/c", 1))]
    check(dups == [1, 1, 1], "after kill -9, a, b and c are all duplicates: %s" % dups)
    status = stub.GetStatus(learner.pb2.GetStatusRequest())
    check(status.accepted_groups == 0 and status.queue_depth_groups == 0, "nothing queued twice")
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")


def poisoned(learner):
    """Rewards beyond --max_abs_reward are refused at validation. With the
    bound raised, a group whose rewards overflow float32 sums is dropped
    from its step while the honest group beside it trains; a step of poison
    only is skipped without counting toward --max_consecutive_skipped_steps;
    the source is then refused for a while, and the learner never stops."""
    pb = learner.rollout_pb2

    def group(tag, poison):
        rewards = [-3e38, 3e38, 3e38] if poison else [1.0, 0.0, 0.0]
        return pb.PromptGroup(prompt_id=tag, prompt_tokens=[1, 2, 3], responses=[
            pb.Response(tokens=[5 + r, 9], reward=x) for r, x in enumerate(rewards)])

    port = free_port()
    proc = learner.start(port, [])
    stub = learner.stub_for(port)
    try:
        stub.Submit(pb.RolloutBatch(groups=[group("huge", True)]), timeout=10)
        check(False, "a reward of 3e38 is refused under the default bound")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_abs_reward 1e+06" in e.details(),
              "a reward of 3e38 is refused at validation: %s" % e.details())
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")

    shutil.rmtree(learner.ckpt, ignore_errors=True)
    port, metrics_port = free_port(), free_port()
    proc = learner.start(port, ["--max_abs_reward=3.4e38", "--quarantine_after_groups=7",
                                "--quarantine_duration=1h", "--max_consecutive_skipped_steps=2"],
                         "127.0.0.1:%d" % metrics_port)
    stub = learner.stub_for(port)
    stub.Submit(pb.RolloutBatch(groups=[group("h0", False), group("p0", True)]), timeout=10)
    status = wait_status(learner, stub, "the step trained the honest group", lambda s: s.version >= 1)
    check(status.trained_groups == 1 and status.skipped_groups == 1,
          "1 group trained, the poisoned one dropped (trained %d, skipped %d)" % (
              status.trained_groups, status.skipped_groups))
    for i in range(3):  # three steps of poison only: skipped, not counted toward the stop
        stub.Submit(pb.RolloutBatch(groups=[group("q%da" % i, True), group("q%db" % i, True)]),
                    timeout=10)
        wait_status(learner, stub, "poison-only step %d skipped" % i,
                    lambda s, i=i: s.skipped_groups >= 3 + 2 * i)
    check(proc.poll() is None, "3 skipped steps of poison in a row do not stop a learner "
          "whose --max_consecutive_skipped_steps is 2")

    def scrape():
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10)
        return text.read().decode()
    deadline = time.time() + 30
    while time.time() < deadline and metric(scrape(), "asympo_learner_quarantined_sources") != 1:
        time.sleep(0.05)
    check(metric(scrape(), "asympo_learner_quarantined_sources") == 1,
          "the source is quarantined after 7 poisoned groups")
    try:
        stub.Submit(pb.RolloutBatch(groups=[group("h1", False), group("h2", False)]), timeout=10)
        check(False, "the source is refused once it sent 7 poisoned groups")
    except grpc.RpcError as e:
        hint = dict(e.trailing_metadata() or ()).get("asympo-retry-after-ms", "0")
        check(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "is refused until" in e.details()
              and int(hint) > 3000 * 1000,
              "the source is refused for an hour: %s (hint %s ms)" % (e.details(), hint))
    text = scrape()
    check(metric(text, 'asympo_learner_poisoned_groups_total{source="anonymous"}') == 7,
          "7 poisoned groups counted by source")
    check(metric(text, 'asympo_learner_steps_skipped_total{reason="poisoned_groups"}') == 3,
          "3 steps skipped as poisoned_groups")
    check(metric(text, 'asympo_learner_refusals_total{code="RESOURCE_EXHAUSTED",cause="quarantined"}')
          in (None, 1), "the refusal is counted where refusals are")
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")


def readiness(learner):
    port, metrics_port = free_port(), free_port()
    proc = learner.start(port, ["--ready_stall_timeout=1s", "--fault_step_delay=5s"],
                         "127.0.0.1:%d" % metrics_port)

    def ready():
        try:
            r = urllib.request.urlopen("http://127.0.0.1:%d/ready" % metrics_port, timeout=10)
            return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except urllib.error.URLError as e:
            return None, str(e)

    def wait_ready(code, what, timeout=60):
        deadline = time.time() + timeout
        got = ready()
        while got[0] != code and time.time() < deadline:
            time.sleep(0.05)
            got = ready()
        check(got[0] == code, "%s (/ready: %s %s)" % (what, got[0], got[1].strip()))
        return got[1]

    stub = learner.stub_for(port)
    wait_ready(200, "ready once started")
    time.sleep(2)
    wait_ready(200, "idle with an empty queue for twice the stall timeout: still ready", 0)
    stub.Submit(batch(learner, "ready/a", 1, "a"), timeout=10)
    time.sleep(2)
    wait_ready(200, "one group, short of a step, for twice the stall timeout: still ready", 0)
    stub.Submit(batch(learner, "ready/b", 1, "b"), timeout=10)
    body = wait_ready(503, "a step stuck past --ready_stall_timeout: not ready", 5)
    check("training loop has not come round" in body, "the answer names the stuck loop: " + body)
    wait_status(learner, stub, "the slow step ends", lambda s: s.version >= 1)
    wait_ready(200, "ready again once the step is done", 10)
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "clean exit")


def main():
    scenario, proto_dir, binary, work = sys.argv[1:5]
    scenarios = {"kill_restart": kill_restart, "skipped_steps": skipped_steps,
                 "retry_after_deadline": retry_after_deadline,
                 "retry_after_restart": retry_after_restart, "skipped_in_a_row": skipped_in_a_row,
                 "stop_during_start": stop_during_start, "poisoned": poisoned,
                 "readiness": readiness}
    check(scenario in scenarios, "scenario %s is one of %s" % (scenario, sorted(scenarios)))
    scenarios[scenario](Learner(proto_dir, binary, work))


if __name__ == "__main__":
    main()
