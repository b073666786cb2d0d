"""The Python client package (asympo_rl.LearnerClient, installed by the ctest
fixture PythonPackage.install) against real asympo-learner processes: the
retry deadline, local validation, fairness under backpressure, sessions and
recovery after a learner restart.

deadline:   an address nothing listens on, retry_deadline=2 and timeout=60:
            status(), submit() (with and without validation) and
            submit_stream() give up within 3.5 s with LearnerUnavailableError
            naming the target, the attempts and the seconds waited.
validation: every batch rule, one fault at a time (tokens out of the
            vocabulary, one-byte and multi-byte, negative; too many tokens;
            empty prompts and responses; group sizes; non-finite and too
            large rewards; behavior log-probs count, sign and finiteness, and
            missing for grpo; policy versions out of order; batch_id, source
            and prompt_id bytes; no groups, too many): the client refuses it
            before sending, with the same message from the vectorised check
            and the rule by rule one (numpy hidden), and the learner, sent
            the same batch unchecked, refuses it with a message that contains
            the client's. Valid batches with multi-byte tokens pass both.
fairness:   8 threads of one client submitting into a full learner: the
            longest wait is at most 3 times the median wait (waiters are
            served in arrival order).
session:    two clients with the same session= (a generator restarted)
            never make the same batch id: the second one's new batches are
            all queued, none answered as a duplicate; a batch sent again
            with its recorded id is; ids longer than the learner's
            max_batch_id_bytes are refused before sending.
recovery:   the recovery rule against a learner with checkpoints killed
            with SIGKILL and restarted on its directory: the client keeps
            the batches checkpoint 6 does not record (among them 2 trained
            by step 7, 1 queued when killed), sends them again when the
            first reply names the new incarnation, and every one of the 20
            batch ids is trained exactly once (version 10 of 2-group steps,
            the final checkpoint's batches, the step log).
recorded_after_idle: batches answered after a checkpoint taken with an
            empty queue stay unconfirmed (recorded_through_version <=
            trained_through_version).
confirm_options: confirm_at="trained" for a learner without checkpoints;
            a submit confirms on its own every confirm_every seconds; at
            max_unconfirmed a submit waits, then raises LearnerBusyError
            without sending.

    python3 python_client_scenarios_test.py SCENARIO PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from learner_client import check, free_port

SCENARIO, PKG, LEARNER, WORK = sys.argv[1:5]
sys.path.insert(0, PKG)
import asympo_rl  # noqa: E402


class Learner:
    """One asympo-learner process on `port` (tiny model, 16 tokens), its log
    under WORK."""
    starts = 0

    def __init__(self, port, *flags):
        Learner.starts += 1
        self.port = port
        self.log = os.path.join(WORK, "learner-%d.log" % Learner.starts)
        self.proc = subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % port, "--metrics_address=",
                                      "--model=tiny", "--tiny_vocab_size=16", "--threads=1"] + list(flags),
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        if sig == signal.SIGTERM:
            check(code == 0, "the learner exits cleanly (%s)" % self.log)


def groups(n, tag, responses=2, length=2):
    """n prompt groups of `responses` responses of `length` tokens; their
    bytes differ with `tag`."""
    seed = sum(map(ord, tag))
    return [asympo_rl.group([1, 2 + (seed + g) % 14], [([(seed + g + r + i) % 16 for i in range(length)],
                                                         float(r % 2)) for r in range(responses)],
                            prompt_id="%s-%d" % (tag, g))
            for g in range(n)]


def gives_up_in_time(what, call, target, bound):
    t0 = time.monotonic()
    try:
        call()
        check(False, "%s: no learner, yet it returned" % what)
    except asympo_rl.LearnerUnavailableError as e:
        took, msg = time.monotonic() - t0, str(e)
        check(took < bound, "%s gives up after %.2f s (under %.1f s): %s" % (what, took, bound, msg))
        check(target in msg and "attempt" in msg and " s " in msg,
              "%s: the error names the target, the attempts and the seconds waited" % what)
        check(e.attempts >= 1, "%s: the error carries its attempts (%d)" % (what, e.attempts))


def scenario_deadline():
    target = "127.0.0.1:%d" % free_port()  # nothing listens there
    checked = asympo_rl.LearnerClient(target, source="deadline", timeout=60, retry_deadline=2)
    raw = asympo_rl.LearnerClient(target, source="deadline", timeout=60, retry_deadline=2, validate=False)
    gives_up_in_time("status()", checked.status, target, 3.5)
    gives_up_in_time("submit() with validation", lambda: checked.submit(groups(1, "v")), target, 3.5)
    gives_up_in_time("submit()", lambda: raw.submit(groups(1, "r")), target, 3.5)
    gives_up_in_time("submit_stream()", lambda: raw.submit_stream([groups(1, "s%d" % i) for i in range(3)]),
                     target, 3.5)


def faulty_batches(vocab):
    """(what, groups or RolloutBatch, batch_id): one broken rule each."""
    R = asympo_rl.client.rollout_pb2

    def with_fault(fault, n=2, length=3, tag="f"):
        gs = groups(n, tag, responses=3, length=length)
        for g in gs:  # multi-byte tokens and behavior log-probs everywhere
            g.prompt_tokens.extend([vocab - 1, 200])
            for r in g.responses:
                r.tokens.extend([vocab - 2, 130])
                r.behavior_logprobs.extend([-0.25] * len(r.tokens))
        fault(gs)
        return gs

    def response(g, j):
        return lambda gs: gs[g].responses[j]
    cases = [
        ("response token = vocab", lambda gs: gs[1].responses[2].tokens.__setitem__(1, vocab)),
        ("response token far out", lambda gs: gs[0].responses[0].tokens.__setitem__(4, 1 << 30)),
        ("negative response token", lambda gs: gs[1].responses[0].tokens.__setitem__(0, -1)),
        ("prompt token = vocab", lambda gs: gs[1].prompt_tokens.__setitem__(2, vocab)),
        ("negative prompt token", lambda gs: gs[0].prompt_tokens.__setitem__(0, -7)),
        ("too many response tokens", lambda gs: (gs[1].responses[1].tokens.extend([3] * 8),
                                                 gs[1].responses[1].behavior_logprobs.extend([-1.0] * 8))),
        ("too many prompt tokens", lambda gs: gs[0].prompt_tokens.extend([3] * 8)),
        ("empty response", lambda gs: (gs[1].responses[1].ClearField("tokens"),
                                       gs[1].responses[1].ClearField("behavior_logprobs"))),
        ("empty prompt", lambda gs: gs[1].ClearField("prompt_tokens")),
        ("group of 1", lambda gs: [gs[1].responses.pop() for _ in range(2)]),
        ("group of 5", lambda gs: gs[0].responses.extend([gs[0].responses[0]] * 2)),
        ("NaN reward", lambda gs: setattr(response(1, 2)(gs), "reward", float("nan"))),
        ("infinite reward", lambda gs: setattr(response(0, 1)(gs), "reward", float("-inf"))),
        ("reward over max_abs_reward", lambda gs: setattr(response(1, 0)(gs), "reward", 2e6)),
        ("log-probs count", lambda gs: response(1, 1)(gs).behavior_logprobs.append(-1.0)),
        ("positive log-prob", lambda gs: response(0, 2)(gs).behavior_logprobs.__setitem__(3, 0.5)),
        ("NaN log-prob", lambda gs: response(1, 2)(gs).behavior_logprobs.__setitem__(0, float("nan"))),
        ("-inf log-prob", lambda gs: response(1, 0)(gs).behavior_logprobs.__setitem__(1, float("-inf"))),
        ("last version alone", lambda gs: setattr(response(1, 1)(gs), "last_policy_version", 3)),
        ("last version below first", lambda gs: (setattr(response(0, 0)(gs), "first_policy_version", 5),
                                                 setattr(response(0, 0)(gs), "last_policy_version", 4))),
        ("escapes in the prompt_id", lambda gs: (setattr(gs[0], "prompt_id", 'a\t"q"\\\' \u00e91\u00e9g\n'),
                                                 [gs[0].responses.pop() for _ in range(2)])),
        ("prompt_id of 257 bytes", lambda gs: setattr(gs[1], "prompt_id", "\u00e9" * 128 + "x")),
        ("two faults: the first one named", lambda gs: (setattr(response(1, 0)(gs), "reward", 2e6),
                                                        gs[0].responses[1].tokens.__setitem__(0, vocab))),
    ]
    out = [(what, with_fault(fault, tag=what), None) for what, fault in cases]
    out.append(("no groups", R.RolloutBatch(source="scenarios"), None))
    out.append(("5 groups", with_fault(lambda gs: None, n=5), None))
    out.append(("batch_id of 129 bytes", with_fault(lambda gs: None), "b" * 129))
    out.append(("source of 129 bytes", R.RolloutBatch(source="s" * 129, groups=with_fault(lambda gs: None)),
                None))
    return out


def local_message(client, batch, batch_id, numpy_hidden):
    """The client's own refusal of `batch` (None: it passed)."""
    from asympo_rl import validation
    saved = getattr(validation, "np", None)
    validation.np = None if numpy_hidden else saved
    try:
        client.make_batch(batch, batch_id) if isinstance(batch, list) else validation.validate_batch(
            batch, client.status())
        return None
    except asympo_rl.InvalidBatchError as e:
        return str(e)
    finally:
        validation.np = saved


def scenario_validation():
    port = free_port()
    learner = Learner(port, "--tiny_vocab_size=300", "--max_prompt_tokens=8", "--max_response_tokens=8",
                      "--max_group_size=4", "--max_groups_per_batch=4", "--prompts_per_step=64",
                      "--queue_capacity=64")
    target = "127.0.0.1:%d" % port
    client = asympo_rl.LearnerClient(target, source="scenarios", retry_deadline=60)
    raw = asympo_rl.LearnerClient(target, source="scenarios", retry_deadline=60, validate=False)
    vocab = client.status().limits.vocab_size
    check(vocab == 300, "the learner's vocabulary is 300 (two-byte tokens)")
    for what, batch, batch_id in faulty_batches(vocab):
        fast, slow = (local_message(client, batch, batch_id, hidden) for hidden in (False, True))
        check(fast is not None and fast == slow, "%s: refused before sending: %s" % (what, fast))
        try:
            raw.submit(batch, batch_id=batch_id)
            check(False, "%s: the learner refuses it too" % what)
        except asympo_rl.InvalidBatchError as e:
            check(fast in str(e), "%s: the learner's message contains the client's" % what)
    valid = faulty_batches(vocab)[-1][1].groups  # the source's fault alone: these groups are valid
    for hidden in (False, True):
        check(local_message(client, list(valid), None, hidden) is None,
              "valid groups with multi-byte tokens pass (numpy %s)" % ("hidden" if hidden else "used"))
    check(client.submit(list(valid)).accepted_groups == 2, "and the learner takes them")
    valid[1].responses[2].first_policy_version = 200  # multi-byte varints after the tokens
    valid[1].responses[2].last_policy_version = 1 << 40
    for hidden in (False, True):
        check(local_message(client, list(valid), None, hidden) is None,
              "and with policy versions 200 and 2^40 (numpy %s)" % ("hidden" if hidden else "used"))
    from asympo_rl import validation
    batch = client.make_batch(list(valid), "b/1")
    check(validation.BatchOfGroups(list(valid), "scenarios", "b/1").SerializeToString() ==
          batch.SerializeToString(), "a batch serialized from its groups: the RolloutBatch's bytes")
    valid[0].responses[1].first_policy_version = 7  # first alone: not stamped either
    stamped = asympo_rl.client.rollout_pb2.RolloutBatch(source="scenarios", batch_id="b/2", groups=valid)
    asympo_rl.stamp_policy_version(stamped.groups, 1 << 33)
    check(validation.BatchOfGroups(list(valid), "scenarios", "b/2", stamp=1 << 33).SerializeToString() ==
          stamped.SerializeToString(), "a version stamped in the bytes: the stamped RolloutBatch's bytes")
    check(validation._elements_valid(client.make_batch(list(valid)).SerializeToString(), vocab),
          "the vectorised check reads such a batch through (no fallback to the rules one by one)")
    st = client.status()
    check(st.accepted_batches == 1, "nothing but the valid batch was queued (%d)" % st.accepted_batches)
    grpo = asympo_rl.client.learner_pb2.LearnerStatus()
    grpo.CopyFrom(st)
    grpo.wants_behavior_logprobs = True
    missing = groups(2, "m")
    for hidden in (False, True):
        saved = getattr(validation, "np", None)
        validation.np = None if hidden else saved
        try:
            validation.validate_batch(asympo_rl.client.rollout_pb2.RolloutBatch(groups=missing), grpo)
            check(False, "log-probs missing for grpo: refused")
        except asympo_rl.InvalidBatchError as e:
            check("behavior_logprobs missing" in str(e), "log-probs missing for grpo: %s" % e)
        finally:
            validation.np = saved
    learner.stop()


def scenario_fairness():
    """8 threads of one client, 6 batches each, into a learner with room for
    2 groups that trains 2 at a time and refuses at once when full (hint
    50 ms): no submit may wait more than 3 times the median wait (the old
    per-thread backoffs: 6 to 14 times)."""
    port = free_port()
    learner = Learner(port, "--queue_capacity=2", "--prompts_per_step=2", "--max_groups_per_batch=2",
                      "--full_queue_timeout=0s", "--retry_after=50ms")
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="fair", retry_deadline=300,
                                     min_backoff=0.05, max_backoff=2.0)
    client.status()
    waits, lock = [], threading.Lock()

    def run(t):
        for i in range(6):
            gs = groups(1, "t%d-%d" % (t, i), responses=4, length=128)
            t0 = time.monotonic()
            r = client.submit(gs)
            with lock:
                waits.append((time.monotonic() - t0, r.attempts))
    workers = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    ws = sorted(w for w, _ in waits)
    median = ws[len(ws) // 2]
    check(len(ws) == 48, "48 submits accepted in %.1f s" % (time.monotonic() - t0))
    check(ws[-1] <= 3 * median, "no submit waited more than 3 x the median wait: median %.2f s, 90th "
          "percentile %.2f s, longest %.2f s, most attempts %d" % (median, ws[43], ws[-1],
                                                                  max(a for _, a in waits)))
    learner.stop()


def scenario_session():
    """Two clients given the same session= (a generator and its restart)."""
    port = free_port()
    learner = Learner(port, "--prompts_per_step=64", "--queue_capacity=64")
    target = "127.0.0.1:%d" % port
    first = asympo_rl.LearnerClient(target, source="gen", session="run-7", retry_deadline=60)
    ids = [first.submit(groups(1, "a%d" % i)).batch_id for i in range(4)]
    again = asympo_rl.LearnerClient(target, source="gen", session="run-7", retry_deadline=60)
    results = [again.submit(groups(1, "b%d" % i)) for i in range(4)]
    check(all(i.startswith("gen/run-7/") for i in ids + [r.batch_id for r in results]),
          "ids name the source and the session: %s, %s" % (ids[0], results[0].batch_id))
    check(not set(ids) & {r.batch_id for r in results}, "a second client of the session reuses no id")
    local = {first.new_batch_id() for _ in range(1000)} | {again.new_batch_id() for _ in range(1000)}
    check(len(local) == 2000, "2000 ids of the two clients, all different")
    check(not any(r.duplicate for r in results), "the second client's new batches are not duplicates")
    st = again.status()
    check(st.accepted_batches == 8 and st.duplicate_batches == 0 and st.queue_depth_groups == 8,
          "the learner queued all 8 batches (accepted %d, duplicates %d, queued %d groups)"
          % (st.accepted_batches, st.duplicate_batches, st.queue_depth_groups))
    r = again.submit(groups(1, "a0"), batch_id=ids[0])
    check(r.duplicate, "a batch sent again with its recorded id is a duplicate")
    s = again.submit_stream([groups(2, "s%d" % i) for i in range(3)])
    kept = [b for b, _, _ in again.unconfirmed()]
    check(s.accepted_batches == 3 and s.accepted_groups == 6 and s.duplicate_batches == 0 and len(kept) == 8
          and s.learner_incarnation == st.incarnation,
          "a stream of 3 new batches is queued and kept unconfirmed with the others (%d kept)" % len(kept))
    try:
        asympo_rl.LearnerClient(target, source="gen", session="s" * 110).submit(groups(1, "c"))
        check(False, "ids over max_batch_id_bytes are refused")
    except asympo_rl.InvalidBatchError as e:
        check("max_batch_id_bytes" in str(e) and "session" in str(e),
              "ids over max_batch_id_bytes are refused, naming the limit and the session: %s" % e)
    learner.stop()


def wait_status(client, what, cond, seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        st = client.status()
        if cond(st):
            return st
        if time.monotonic() > deadline:
            check(False, "%s within %d s (version %d, queue %d)" % (what, seconds, st.version,
                                                                    st.queue_depth_groups))
        time.sleep(0.1)


def newest_checkpoint(ckpt):
    import json
    newest = max(d for d in os.listdir(ckpt) if d.startswith("ckpt-"))
    with open(os.path.join(ckpt, newest, "meta.json")) as f:
        return json.load(f)


def scenario_recovery():
    """A learner with checkpoints, killed (SIGKILL) with batches trained
    after its last checkpoint and one queued, restarted on its directory."""
    port, ckpt = free_port(), os.path.join(WORK, "ckpt")
    flags = ["--prompts_per_step=2", "--checkpoint_every=3", "--keep_checkpoints=0", "--queue_capacity=64",
             "--checkpoint_dir=" + ckpt, "--step_csv=" + os.path.join(WORK, "steps.csv")]
    learner = Learner(port, *flags)
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="rec", session="s", retry_deadline=120)
    sent = [client.submit(groups(1, "old%d" % i)).batch_id for i in range(15)]
    wait_status(client, "7 steps, checkpoint 6", lambda s: s.version >= 7 and s.checkpoint_version == 6)
    left = client.confirm()
    check(3 <= left and [b for b, _, _ in client.unconfirmed()] == sent[-left:],
          "checkpoint 6 confirms the oldest batches; the newest %d stay unconfirmed (recorded through %d), "
          "among them the 2 trained by step 7 and the 1 queued"
          % (left, client.status().recorded_through_version))
    first = client.status().incarnation
    learner.stop(signal.SIGKILL)
    learner = Learner(port, *flags)
    new = [client.submit(groups(1, "new%d" % i)) for i in range(5)]
    sent += [r.batch_id for r in new]
    check(new[0].learner_incarnation not in ("", first), "the reply names the new incarnation")
    check(all(inc == new[0].learner_incarnation for _, inc, _ in client.unconfirmed()),
          "the first reply from the restarted learner had the %d unconfirmed batches sent again" % left)
    kept = {b for b, _, _ in client.unconfirmed()}
    check(kept <= set(sent[12:]), "those checkpoint 6 records, answered as recorded duplicates, are "
          "confirmed at once: %d kept, all among the 3 it lacks and the 5 new ones" % len(kept))
    st = wait_status(client, "the restarted learner trains all 20 groups", lambda s: s.version >= 10 and
                     s.queue_depth_groups == 0)
    check(st.version == 10 and st.resumed_from_version == 6,
          "version 10 from checkpoint 6: 20 groups in 2-group steps, none lost, none twice "
          "(duplicates: %d)" % st.duplicate_batches)
    check(client.confirm() >= 0, "confirm() after the restart")
    learner.stop()
    meta = newest_checkpoint(ckpt)
    trained = {b["id"]: b for b in meta["batches"]}
    check(meta["version"] == 10 and all(b in trained and trained[b]["trained"] == [0] for b in sent),
          "the final checkpoint (version %d) records each of the 20 batch ids trained once"
          % meta["version"])
    rows = {}
    with open(os.path.join(WORK, "steps.csv")) as f:
        for line in f.read().splitlines()[1:]:
            rows[int(line.split(",")[2])] = line  # the restarted learner rewrites versions 7 on
    check(sorted(rows) == list(range(1, 11)), "the step log's surviving history: versions 1-10")


def scenario_recorded_after_idle():
    """Batches answered after a checkpoint taken with an empty queue are not
    recorded: recorded_through_version must not cover them (R <= T; the
    learner of afa79a9 kept R 7 > T 6 here, so the 3 batches, confirmed,
    were lost by a kill)."""
    port = free_port()
    learner = Learner(port, "--prompts_per_step=2", "--checkpoint_every=3", "--queue_capacity=64",
                      "--checkpoint_dir=" + os.path.join(WORK, "ckpt"))
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="idle", retry_deadline=60)
    for i in range(12):
        client.submit(groups(1, "a%d" % i))
    wait_status(client, "checkpoint 6, queue empty", lambda s: s.checkpoint_version == 6 and
                s.queue_depth_groups == 0)
    check(client.confirm() == 0, "checkpoint 6 confirms the 12 batches")
    for i in range(3):
        client.submit(groups(1, "b%d" % i))
    st = wait_status(client, "step 7", lambda s: s.version >= 7)
    check(st.recorded_through_version <= st.trained_through_version,
          "recorded_through_version %d <= trained_through_version %d"
          % (st.recorded_through_version, st.trained_through_version))
    check(client.confirm() == 3, "the 3 batches answered after checkpoint 6 stay unconfirmed")
    learner.stop()


def scenario_confirm_options():
    """confirm_at='trained' for a learner without checkpoints, and the
    max_unconfirmed bound."""
    port = free_port()
    learner = Learner(port, "--prompts_per_step=2", "--queue_capacity=64")
    target = "127.0.0.1:%d" % port
    by_training = asympo_rl.LearnerClient(target, source="t", confirm_at="trained", retry_deadline=60)
    by_record = asympo_rl.LearnerClient(target, source="r", retry_deadline=60)
    for i in range(2):
        by_training.submit(groups(1, "t%d" % i))
        by_record.submit(groups(1, "r%d" % i))
    wait_status(by_record, "2 steps", lambda s: s.version >= 2)
    check(by_training.confirm() == 0, "confirm_at='trained': trained batches are confirmed")
    check(by_record.confirm() == 2, "confirm_at='recorded': a learner without checkpoints confirms none")
    # A caller that never calls confirm(): submits confirm on their own.
    auto = asympo_rl.LearnerClient(target, source="a", confirm_at="trained", confirm_every=0.2,
                                   retry_deadline=60)
    first = [auto.submit(groups(1, "a%d" % i)).batch_id for i in range(2)]
    wait_status(by_record, "the third step", lambda s: s.version >= 3)  # not auto's status()
    time.sleep(0.3)
    auto.submit(groups(1, "a2"))
    kept = [b for b, _, _ in auto.unconfirmed()]
    check(not set(first) & set(kept) and len(kept) == 1,
          "a submit after confirm_every confirmed the trained batches on its own: %s" % kept)
    stop_training = Learner(free_port(), "--prompts_per_step=64", "--queue_capacity=64")
    target = "127.0.0.1:%d" % stop_training.port
    asympo_rl.LearnerClient(target, retry_deadline=60).status()  # started
    bounded = asympo_rl.LearnerClient(target, source="b", max_unconfirmed=2, retry_deadline=2)
    for i in range(2):
        bounded.submit(groups(1, "b%d" % i))
    t0 = time.monotonic()
    try:
        bounded.submit(groups(1, "b2"))
        check(False, "a third batch waits for room among max_unconfirmed=2")
    except asympo_rl.LearnerBusyError as e:
        check("max_unconfirmed 2" in str(e) and time.monotonic() - t0 < 4,
              "at max_unconfirmed the submit waits up to retry_deadline, then: %s" % e)
    check(bounded.status().accepted_batches == 2, "the third batch was not sent")
    stop_training.stop()
    learner.stop()


def main():
    shutil.rmtree(WORK, ignore_errors=True)  # a checkpoint of an earlier run would be resumed
    os.makedirs(WORK)
    {"deadline": scenario_deadline, "validation": scenario_validation,
     "fairness": scenario_fairness, "session": scenario_session,
     "recovery": scenario_recovery, "confirm_options": scenario_confirm_options,
     "recorded_after_idle": scenario_recorded_after_idle}[SCENARIO]()


if __name__ == "__main__":
    main()
