"""asympo-submit against a real asympo-learner.

jsonl: a JSONL file with two bad rows (broken JSON, a token outside the
vocabulary) is sent in windows of 3 good rows: the bad rows are named by file
and line and not sent, every good row is, and the exit status is 1. After the
rows are fixed, a rerun sends only the two fixed rows (exit 0). A rerun of the
first file without the state file is a new run: the same windows by content,
under ids with another random part, sent again. Rows of text are
tokenized with --tokenizer (a tokenizer.json); without it they are bad rows.
Rows may carry first_policy_version/last_policy_version; versions out of order
or negative are bad rows, and a versioned group's lag reaches GetStatus once
trained. --check_only sends nothing.

deleted_rows: a bad row deleted instead of fixed shifts every later line; the
rerun sends nothing again (windows are keyed by their rows' content, not
their lines), and rows inserted anywhere are sent once.

kill_restart: a learner with checkpoints is killed with SIGKILL after
asympo-submit finished, with groups trained after its last checkpoint and one
still queued; asympo-submit had not confirmed them as recorded (exit 3). The
learner restarts from its checkpoint; a rerun sends again every window not
confirmed, with its batch id: the recorded ones are duplicates, the lost ones
are queued, and every group is trained exactly once in the restored history.

last_groups: 5 groups in steps of 4: the last one is trained as a short
step after --partial_step_after, so the run ends confirmed (exit 0). The
batch ids carry the run's random part (run_nonce), kept in the state file;
without a state file (--state=none) they are the content's alone, and a
rerun's windows are duplicates.

restart_mid_run: the same kill while asympo-submit waits for the last
windows to be recorded; the learner restarts on the same address and the
running asympo-submit sees the new incarnation, sends again what was not
confirmed, and confirms it.

    python3 submit_tool_test.py SCENARIO SUBMIT_BINARY LEARNER_BINARY TOKENIZER_JSON WORK_DIR"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from learner_client import check, free_port, generate_stubs, grpc

SCENARIO, SUBMIT, LEARNER, TOKENIZER, WORK = sys.argv[1:6]
PORT = 0
pb2 = pb2_grpc = None


def row(i, token=None):
    return json.dumps({"prompt_id": "q%d" % i, "prompt_tokens": [1, 4, 8 + i % 4, 3],
                       "responses": [{"tokens": [token if token is not None and r == 1 else 8 + (i + r) % 4, 2],
                                      "reward": float(r == 0), "finish_reason": "stop"} for r in range(3)]})


def write(path, lines):
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def submit(path, *extra):
    """Runs asympo-submit; the learners of these tests train every group
    (--prompts_per_step=1) but write no checkpoint, unless extra says so."""
    out = subprocess.run([SUBMIT, "--learner=127.0.0.1:%d" % PORT, "--input=" + path,
                          "--groups_per_batch=3", "--progress_every=0", "--confirm=trained",
                          "--confirm_timeout=60s"] + list(extra),
                         capture_output=True, text=True, timeout=180)
    print(out.stderr, out.stdout)
    summary = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    return out.returncode, summary, out.stderr


def start_learner(name, *extra, port=None):
    """Starts a learner on `port` (default: a free one), which PORT then names."""
    global PORT
    PORT = port or free_port()
    log = open(os.path.join(WORK, name + ".log"), "w")
    proc = subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % PORT, "--metrics_address=",
                             "--model=tiny", "--tiny_vocab_size=300", "--queue_capacity=64",
                             "--threads=1"] + list(extra), stdout=log, stderr=subprocess.STDOUT)
    stub = pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % PORT))
    return proc, stub


def status_of(stub):
    return stub.GetStatus(pb2.GetStatusRequest(), timeout=30, wait_for_ready=True)


def wait_status(stub, what, cond, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = status_of(stub)
        if cond(status):
            return status
        time.sleep(0.05)
    check(False, what + " (last status: %s)" % str(status).replace("\n", " "))


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "the learner exits cleanly")


def jsonl():
    proc, stub = start_learner("learner", "--prompts_per_step=1")
    path = os.path.join(WORK, "rows.jsonl")
    lines = [row(i) for i in range(1, 14)]
    good = list(lines)
    lines[3] = '{"prompt_id": "q4", "prompt_tokens": [1, 2'  # line 4: broken JSON
    lines[6] = row(7, token=999)                             # line 7: outside the vocabulary
    write(path, lines)

    rc, s, err = submit(path, "--check_only")
    check(rc == 1 and s.get("groups_sent") == 0 and s.get("bad_rows") == 2, "--check_only: 2 bad rows, nothing sent")
    rc, s, err = submit(path)
    check(rc == 1, "exit status 1 with bad rows")
    check("rows.jsonl:4: " in err and "rows.jsonl:7: " in err, "both bad rows named by file and line")
    check("rows.jsonl:7: group 0 (prompt_id \"q7\") response 1: response token 0 is 999, outside the "
          "vocabulary [0, 300)" in err, "the rule is the learner's message")
    check("rows.jsonl:4: not valid JSON: parse error at line 1, column 43" in err, "broken JSON named")
    check(s["groups_sent"] == 11 and s["bad_rows"] == 2 and s["windows_confirmed"] == 4 and
          s["windows_unconfirmed"] == 0, "the 11 good rows sent in 4 windows, trained: %s" % s)
    check(status_of(stub).accepted_groups == 11, "the learner accepted 11 groups")
    first = window_ids(path + ".submitted")

    write(path, good)
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 2 and s["skipped_confirmed"] == 11,
          "after the fix, a rerun sends the 2 fixed rows: %s" % s)
    # Without its state file a rerun is a new run: the same 4 windows by
    # content, under ids with another random part (run_nonce), sent again.
    os.remove(path + ".submitted")
    write(path, lines)
    rc, s, err = submit(path)
    check(rc == 1 and s["duplicates"] == 0 and s["groups_sent"] == 11,
          "without the state file, the first file's windows are sent again: %s" % s)
    again = window_ids(path + ".submitted")
    check(len(again) == 4 and not set(again) & set(first) and
          [i.rsplit("/", 1)[1] for i in again] == [i.rsplit("/", 1)[1] for i in first],
          "the same 4 windows by content, under new ids: %s %s" % (first, again))
    status = status_of(stub)
    check(status.accepted_groups == 24 and status.duplicate_batches == 0,
          "24 groups accepted, no duplicates (%d, %d)" % (status.accepted_groups,
                                                          status.duplicate_batches))
    text = os.path.join(WORK, "text.jsonl")
    write(text, [json.dumps({"prompt": "hello", "responses": [{"text": "a", "reward": 1}] * 2})])
    rc, s, err = submit(text)
    check(rc == 1 and "text.jsonl:1: the prompt gives \"prompt\": tokenizing it needs --tokenizer" in err,
          "text without --tokenizer is named")
    rc, s, err = submit(text, "--tokenizer=" + TOKENIZER)
    check(rc == 0 and s["groups_sent"] == 1, "with --tokenizer the text row is tokenized and sent: %s" % s)
    check(status_of(stub).accepted_groups == 25, "the learner accepted it")
    versions = os.path.join(WORK, "versions.jsonl")
    versioned = [json.loads(row(20)), json.loads(row(23))]
    for g in versioned:
        for r in g["responses"]:
            r["first_policy_version"], r["last_policy_version"] = 0, 0
    backwards = json.loads(row(21))
    backwards["responses"][2].update(first_policy_version=3, last_policy_version=1)
    negative = json.loads(row(22))
    negative["responses"][0]["first_policy_version"] = -1
    write(versions, [json.dumps(r) for r in versioned + [backwards, negative]])
    rc, s, err = submit(versions, "--groups_per_batch=1")
    check(rc == 1 and s["groups_sent"] == 2 and s["bad_rows"] == 2, "the versioned rows sent: %s" % s)
    check("versions.jsonl:3: group 0 (prompt_id \"q21\") response 2: last_policy_version 1 is below "
          "first_policy_version 3" in err, "versions out of order named by the learner's rule")
    check("versions.jsonl:4: " in err and "first_policy_version is not a non-negative integer" in err,
          "a negative version named")
    status = status_of(stub)
    check([l.trained_groups for l in status.source_policy_lags] == [2],
          "the versioned groups' lag is counted once trained: %s" % status.source_policy_lags)
    rc, s, err = submit(os.path.join(WORK, "missing.jsonl"))
    check(rc == 2 and "cannot read --input" in err, "a missing file: exit 2, named")
    stop(proc)


def deleted_rows():
    proc, stub = start_learner("learner", "--prompts_per_step=1")
    path = os.path.join(WORK, "rows.jsonl")
    lines = [row(i) for i in range(1, 14)]
    lines[1] = row(2, token=999)  # line 2: bad
    write(path, lines)
    rc, s, err = submit(path)
    check(rc == 1 and s["groups_sent"] == 12 and s["bad_rows"] == 1, "12 good rows sent: %s" % s)
    del lines[1]  # deleted, not fixed: every later row moves up a line
    write(path, lines)
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 0 and s["skipped_confirmed"] == 12,
          "the rerun sends nothing again: %s" % s)
    status = status_of(stub)
    check(status.accepted_groups == 12 and status.duplicate_batches == 0,
          "no group queued twice (%d accepted, %d duplicates)" % (status.accepted_groups,
                                                                  status.duplicate_batches))
    lines = [row(30)] + lines[:5] + [row(31)] + lines[5:]
    write(path, lines)
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 2 and s["skipped_confirmed"] == 12,
          "2 rows inserted: only they are sent: %s" % s)
    check(status_of(stub).accepted_groups == 14, "the learner queued 14 groups in all")
    stop(proc)


def window_ids(state_path):
    """The batch ids of the windows in asympo-submit's state file, in order."""
    lines = [json.loads(l) for l in open(state_path).read().splitlines()]
    return [l["window"] for l in lines if "window" in l]


def recorded_ids(ckpt, version):
    """The batch ids a checkpoint records as trained (one group each here)."""
    meta = json.load(open(os.path.join(ckpt, "ckpt-%012d" % version, "meta.json")))
    if "batches" in meta:
        return [b["id"] for b in meta["batches"] if b.get("trained")]
    return meta["batch_ids"]


def kill_restart():
    ckpt = os.path.join(WORK, "ckpt")
    flags = ["--prompts_per_step=2", "--checkpoint_dir=" + ckpt, "--checkpoint_every=2"]
    proc, stub = start_learner("learner-1", *flags)
    path = os.path.join(WORK, "rows.jsonl")
    lines = [row(i) for i in range(1, 12)]
    write(path, lines)
    # One group a window: 11 windows, 5 steps, checkpoints at versions 2 and 4.
    rc, s, err = submit(path, "--groups_per_batch=1", "--confirm=recorded", "--confirm_timeout=0")
    check(rc == 3 and s["groups_sent"] == 11 and s["windows_unconfirmed"] > 0,
          "accepted, not yet confirmed as recorded: exit 3, named in the summary: %s" % s)
    unconfirmed = s["windows_unconfirmed"]
    wait_status(stub, "5 steps trained, 1 group queued",
                lambda st: st.version == 5 and st.queue_depth_groups == 1)
    check(os.path.isdir(os.path.join(ckpt, "ckpt-%012d" % 4)) and
          not os.path.isdir(os.path.join(ckpt, "ckpt-%012d" % 5)), "the newest checkpoint is version 4")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    recorded = recorded_ids(ckpt, 4)
    check(len(recorded) == 8, "the checkpoint records 8 trained windows: %s" % recorded)

    proc, stub = start_learner("learner-2", *flags)
    write(path, lines + [row(12)])
    rc, s, err = submit(path, "--groups_per_batch=1", "--confirm=recorded")
    check(rc == 0 and s["windows_unconfirmed"] == 0 and s["resent_windows"] == unconfirmed,
          "the rerun sends again every window not confirmed, and confirms them all: %s" % s)
    ids = window_ids(path + ".submitted")
    check(len(ids) == 12 and len(set(ids)) == 12, "12 windows, one per row")
    lost = 11 - len(recorded)
    status = status_of(stub)
    check(s["duplicates"] == unconfirmed - lost and status.duplicate_batches == unconfirmed - lost,
          "the recorded windows sent again are duplicates (%d)" % status.duplicate_batches)
    check(status.accepted_groups == lost + 1 and status.trained_groups == lost + 1,
          "the %d lost groups and the new one queued and trained once (%d, %d)" %
          (lost, status.accepted_groups, status.trained_groups))
    check(len(recorded) + status.trained_groups == 12, "every group trained once in the restored history")
    final = recorded_ids(ckpt, status.checkpoint_version)
    check(sorted(final) == sorted(ids), "the newest checkpoint records every window once")
    rc, s, err = submit(path, "--groups_per_batch=1", "--confirm=recorded")
    check(rc == 0 and s["groups_sent"] == 0 and s["skipped_confirmed"] == 12, "a third run sends nothing")
    stop(proc)


def restart_mid_run():
    ckpt = os.path.join(WORK, "ckpt")
    flags = ["--prompts_per_step=2", "--checkpoint_dir=" + ckpt]
    proc, stub = start_learner("learner-1", "--checkpoint_every=2", *flags)
    path = os.path.join(WORK, "rows.jsonl")
    write(path, [row(i) for i in range(1, 11)])
    # 10 windows, 5 steps, checkpoints at versions 2 and 4: the last 2
    # windows wait for a checkpoint that this learner will not write.
    tool = subprocess.Popen([SUBMIT, "--learner=127.0.0.1:%d" % PORT, "--input=" + path,
                             "--groups_per_batch=1", "--progress_every=0", "--confirm=recorded",
                             "--confirm_timeout=120s"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_status(stub, "5 steps trained", lambda st: st.version == 5)
    check(tool.poll() is None, "asympo-submit waits for the last windows to be recorded")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    recorded = recorded_ids(ckpt, 4)
    check(len(recorded) == 8, "the newest checkpoint records 8 windows")
    proc, stub = start_learner("learner-2", "--checkpoint_every=1", *flags, port=PORT)
    tool_out, tool_err = tool.communicate(timeout=180)
    print(tool_err, tool_out)
    s = json.loads(tool_out.strip().splitlines()[-1])
    check(tool.returncode == 0 and s["windows_unconfirmed"] == 0 and s["resent_windows"] >= 2 and
          "the learner restarted" in tool_err,
          "the run sees the restart, sends again what was not confirmed, and confirms it: %s" % s)
    status = status_of(stub)
    check(status.accepted_groups == 2 and status.trained_groups == 2 and
          status.duplicate_batches == s["resent_windows"] - 2,
          "the 2 lost groups trained again, once; the recorded ones sent again are duplicates")
    ids = window_ids(path + ".submitted")
    check(sorted(recorded_ids(ckpt, status.checkpoint_version)) == sorted(ids),
          "the newest checkpoint records every window once")
    stop(proc)


def last_groups():
    proc, stub = start_learner("learner", "--prompts_per_step=4", "--partial_step_after=1s")
    path = os.path.join(WORK, "rows.jsonl")
    write(path, [row(i) for i in range(1, 6)])
    start = time.time()
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 5 and s["windows_confirmed"] == 2,
          "5 groups in steps of 4: the last one trained as a short step, all confirmed: %s" % s)
    check(time.time() - start >= 1, "the short step waited --partial_step_after")
    status = status_of(stub)
    check(status.version == 2 and status.trained_groups == 5, "a full step and a short one")
    state = [json.loads(l) for l in open(path + ".submitted").read().splitlines()]
    nonces = [l["run_nonce"] for l in state if "run_nonce" in l]
    ids = window_ids(path + ".submitted")
    check(len(nonces) == 1 and len(nonces[0]) == 12 and
          all(i.startswith("asympo-submit/rows.jsonl/%s/" % nonces[0]) for i in ids),
          "the ids carry the run's random part, kept in the state file: %s %s" % (nonces, ids))
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 0 and s["skipped_confirmed"] == 5,
          "a rerun with the state file sends nothing: %s" % s)
    # --state=none: no random part, the content alone: a rerun is duplicates.
    other = os.path.join(WORK, "other.jsonl")
    write(other, [row(i) for i in range(10, 14)])
    rc, s, err = submit(other, "--state=none")
    check(rc == 0 and s["groups_sent"] == 4, "sent without a state file: %s" % s)
    # (Answered at the version that trained them: not confirmed again.)
    rc, s, err = submit(other, "--state=none", "--confirm_timeout=0s")
    check(s["duplicates"] == 2 and status_of(stub).accepted_groups == 9,
          "again: duplicates by content, nothing queued: %s" % s)
    stop(proc)


def main():
    global pb2, pb2_grpc
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
    pb2, pb2_grpc, _ = generate_stubs(proto, os.path.join(WORK, "stubs"))
    {"jsonl": jsonl, "deleted_rows": deleted_rows, "kill_restart": kill_restart,
     "restart_mid_run": restart_mid_run, "last_groups": last_groups}[SCENARIO]()


if __name__ == "__main__":
    main()
