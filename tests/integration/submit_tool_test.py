"""asympo-submit against a real asympo-learner.

A JSONL file with two bad rows (broken JSON, a token outside the vocabulary)
is sent in windows of 3 lines: the bad rows are named by file and line, their
windows are not sent, the rest is, and the exit status is 1. After the rows
are fixed, a rerun sends only the two windows it had not confirmed (exit 0).
A rerun without the state file sends every window again: each is answered as
a duplicate and nothing is trained twice. Rows of text are tokenized with
--tokenizer (a tokenizer.json); without it they are bad rows. Rows may carry
first_policy_version/last_policy_version; versions out of order or negative
are bad rows, and a versioned group's lag reaches GetStatus once trained.
--check_only sends nothing.

    python3 submit_tool_test.py SUBMIT_BINARY LEARNER_BINARY TOKENIZER_JSON WORK_DIR"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from learner_client import check, free_port, generate_stubs, grpc

SUBMIT, LEARNER, TOKENIZER, WORK = sys.argv[1:5]


def row(i, token=None):
    return json.dumps({"prompt_id": "q%d" % i, "prompt_tokens": [1, 4, 8 + i % 4, 3],
                       "responses": [{"tokens": [token if token is not None and r == 1 else 8 + (i + r) % 4, 2],
                                      "reward": float(r == 0), "finish_reason": "stop"} for r in range(3)]})


def submit(path, *extra):
    out = subprocess.run([SUBMIT, "--learner=127.0.0.1:%d" % PORT, "--input=" + path,
                          "--groups_per_batch=3", "--progress_every=0"] + list(extra),
                         capture_output=True, text=True, timeout=120)
    print(out.stderr, out.stdout)
    summary = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    return out.returncode, summary, out.stderr


def main():
    global PORT
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
    pb2, pb2_grpc, _ = generate_stubs(proto, os.path.join(WORK, "stubs"))
    PORT = free_port()
    log = open(os.path.join(WORK, "learner.log"), "w")
    proc = subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % PORT, "--metrics_address=",
                             "--model=tiny", "--tiny_vocab_size=300", "--prompts_per_step=2",
                             "--queue_capacity=64", "--threads=1"], stdout=log, stderr=subprocess.STDOUT)
    stub = pb2_grpc.LearnerStub(grpc.insecure_channel("127.0.0.1:%d" % PORT))
    path = os.path.join(WORK, "rows.jsonl")
    lines = [row(i) for i in range(1, 14)]
    good = list(lines)
    lines[3] = '{"prompt_id": "q4", "prompt_tokens": [1, 2'  # line 4: broken JSON
    lines[6] = row(7, token=999)                             # line 7: outside the vocabulary
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")

    rc, s, err = submit(path, "--check_only")
    check(rc == 1 and s.get("groups_sent") == 0 and s.get("bad_rows") == 2, "--check_only: 2 bad rows, nothing sent")
    rc, s, err = submit(path)
    check(rc == 1, "exit status 1 with bad rows")
    check("rows.jsonl:4: " in err and "rows.jsonl:7: " in err, "both bad rows named by file and line")
    check("rows.jsonl:7: group 0 (prompt_id \"q7\") response 1: response token 0 is 999, outside the "
          "vocabulary [0, 300)" in err, "the rule is the learner's message")
    check("rows.jsonl:4: not valid JSON: parse error at line 1, column 43" in err, "broken JSON named")
    check(s["groups_sent"] == 7 and s["bad_rows"] == 2, "the 7 rows of good windows sent: %s" % s)
    status = stub.GetStatus(pb2.GetStatusRequest(), timeout=10)
    check(status.accepted_groups == 7, "the learner accepted 7 groups")

    with open(path, "w") as f:
        f.write("\n".join(good) + "\n")
    rc, s, err = submit(path)
    check(rc == 0 and s["groups_sent"] == 6 and s["skipped_confirmed"] == 7,
          "after the fix, a rerun sends the 2 windows it had not confirmed: %s" % s)
    os.remove(path + ".submitted")
    rc, s, err = submit(path)
    check(rc == 0 and s["duplicates"] == 5, "without the state file every window is a duplicate: %s" % s)
    status = stub.GetStatus(pb2.GetStatusRequest(), timeout=10)
    check(status.accepted_groups == 13 and status.duplicate_batches == 5,
          "13 groups accepted once each, 5 duplicates (%d, %d)" % (status.accepted_groups,
                                                                    status.duplicate_batches))
    text = os.path.join(WORK, "text.jsonl")
    with open(text, "w") as f:
        f.write(json.dumps({"prompt": "hello", "responses": [{"text": "a", "reward": 1}] * 2}) + "\n")
    rc, s, err = submit(text)
    check(rc == 1 and "text.jsonl:1: the prompt gives \"prompt\": tokenizing it needs --tokenizer" in err,
          "text without --tokenizer is named")
    rc, s, err = submit(text, "--tokenizer=" + TOKENIZER)
    check(rc == 0 and s["groups_sent"] == 1, "with --tokenizer the text row is tokenized and sent: %s" % s)
    status = stub.GetStatus(pb2.GetStatusRequest(), timeout=10)
    check(status.accepted_groups == 14, "the learner accepted it (%d groups in all)" % status.accepted_groups)
    versions = os.path.join(WORK, "versions.jsonl")
    versioned = [json.loads(row(20)), json.loads(row(23))]  # a training step's worth
    for g in versioned:
        for r in g["responses"]:
            r["first_policy_version"], r["last_policy_version"] = 0, 0
    backwards = json.loads(row(21))
    backwards["responses"][2].update(first_policy_version=3, last_policy_version=1)
    negative = json.loads(row(22))
    negative["responses"][0]["first_policy_version"] = -1
    with open(versions, "w") as f:
        f.write("\n".join(json.dumps(r) for r in versioned + [backwards, negative]) + "\n")
    rc, s, err = submit(versions, "--groups_per_batch=1")
    check(rc == 1 and s["groups_sent"] == 2 and s["bad_rows"] == 2, "the versioned rows sent: %s" % s)
    check("versions.jsonl:3: group 0 (prompt_id \"q21\") response 2: last_policy_version 1 is below "
          "first_policy_version 3" in err, "versions out of order named by the learner's rule")
    check("versions.jsonl:4: " in err and "first_policy_version is not a non-negative integer" in err,
          "a negative version named")
    for _ in range(300):
        status = stub.GetStatus(pb2.GetStatusRequest(), timeout=10)
        if any(l.trained_groups > 0 for l in status.source_policy_lags):
            break
        time.sleep(0.1)
    check([l.trained_groups for l in status.source_policy_lags] == [2],
          "the versioned groups' lag is counted once trained: %s" % status.source_policy_lags)
    rc, s, err = submit(os.path.join(WORK, "missing.jsonl"))
    check(rc == 2 and "cannot read --input" in err, "a missing file: exit 2, named")
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "the learner exits cleanly")


if __name__ == "__main__":
    main()
