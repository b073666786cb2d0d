"""The Python client package (proto/python, installed with pip by the ctest
fixture PythonPackage.install) against real asympo-learner processes.

client:  status and limits; local validation gives the learner's own
         message; a client started before the learner waits for it; a full
         queue is waited out through the retry hint; a reply lost after the
         learner accepted (--fault_submit_reply_delay) is retried with the
         same batch id and trained once; SubmitStream.
weights: every snapshot arrives verified, with the learner's names, shapes
         and bytes (checked against its export); a corrupt transfer is
         skipped and reported; a learner restarted from an older
         checkpoint is followed back; write_hf_directory swaps a link.
example: the external generator example (PyTorch sampler, the subscriber's
         weights, its own reward, the client's submissions) makes the
         learner's reward rise.
retry_policy: the client's Submit retry policy (asympo_rl.client.decide_submit)
         for every gRPC status code, the same as docs/protocol.md's table
         ("Retries") and the C++ tools'; the hint and the backoff; which
         error each decision raises. No learner.
policy_lag: the policy versions a client stamps on its responses (an
         explicit one, the weight subscriber's, each response's own), the
         learner's own message for versions out of order, and a learner
         with --max_policy_lag refusing a too old batch (dropped, not
         retried) and one from the future, counted in its status.
restart: a subscriber that holds version 5 when the learner is killed
         (newest checkpoint 4) and that registers again only after the
         restarted learner trained another version 5: it fetches it (a
         version names weights only within one incarnation), and it is
         not counted in sync before; a restart from the checkpoint of the
         very bytes it holds is not fetched again.
broken_fetch: a fetch broken off by the learner's death keeps none of the
         version's buffers once it returns.
deltas_recovery: delta versions for a subscriber that misses a version, a
         late joiner, and both across a restart: whole where the base is
         lacking, then deltas, ending on the export's bytes.
default_channel: a plain grpcio channel (4 MiB receive limit) fetches a
         snapshot larger than 4 MiB with max_chunk_bytes 0.
tls:     against a learner with TLS and a principals file (certificates
         made by tests/testing/make_certs.sh): the client and the
         subscriber with a token of the right roles; a wrong token and a
         missing role are final errors, not retried.

    python3 python_package_test.py SCENARIO PKG_DIR LEARNER_BINARY EXAMPLE WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import weakref
import time

from learner_client import check, free_port

SCENARIO, PKG, LEARNER, EXAMPLE, WORK = sys.argv[1:6]
sys.path.insert(0, PKG)
import asympo_rl  # noqa: E402

TINY = ["--model=tiny", "--tiny_vocab_size=16", "--threads=1"]


STARTS = [0]


def start_learner(port, extra, name="learner"):
    STARTS[0] += 1
    log = open(os.path.join(WORK, "%s-%d-%d.log" % (name, port, STARTS[0])), "w")
    return subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % port, "--metrics_address="] + TINY + extra,
                            stdout=log, stderr=subprocess.STDOUT)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    check(proc.wait(timeout=60) == 0, "the learner exits cleanly")


def groups(n, tag, responses=3):
    return [asympo_rl.group([1, 4, 8 + g % 4, 3], [([8 + (g + r) % 4, 2], float(r == 0))
                                                    for r in range(responses)], prompt_id="%s%d" % (tag, g))
            for g in range(n)]


def scenario_client():
    port = free_port()
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="pkg-test", timeout=5,
                                     retry_deadline=60)
    proc = None

    def late_start():
        # Room for 4 groups, 4 per step: 3 queued groups never train, so
        # a batch of 2 more never fits (the queue stays full for it).
        time.sleep(1.0)
        return start_learner(port, ["--prompts_per_step=4", "--queue_capacity=4",
                                    "--max_groups_per_batch=4", "--full_queue_timeout=300ms",
                                    "--retry_after=200ms"])
    holder = {}
    t = threading.Thread(target=lambda: holder.setdefault("p", late_start()))
    t.start()
    status = client.status(timeout=60)
    t.join()
    proc = holder["p"]
    check(status.limits.vocab_size == 16 and status.queue_capacity_groups == 4,
          "status() waited for a learner started after the client, and reads its limits")
    check(re.fullmatch(r"[0-9]+-[0-9a-f]{8}", status.model_signature) is not None,
          "the status carries the model signature %r" % status.model_signature)

    raw = asympo_rl.LearnerClient("127.0.0.1:%d" % port, validate=False)

    def refused_alike(batch, what, words):
        """`batch` refused before sending, and by the learner, with the same message."""
        messages = []
        for sender, who in ((client, "before sending"), (raw, "by the learner")):
            try:
                sender.submit(batch)
                check(False, "%s is refused %s" % (what, who))
            except asympo_rl.InvalidBatchError as e:
                messages.append(str(e))
        check(messages[0] in messages[1] and words in messages[0],
              "%s: the local message is the learner's: %s" % (what, messages[0]))

    bad = groups(1, "bad")
    bad[0].responses[1].tokens[0] = 99
    refused_alike(bad, "a token outside the vocabulary", "outside the vocabulary")
    huge = groups(1, "huge")
    huge[0].responses[0].reward = 3e38
    refused_alike(huge, "a reward beyond max_abs_reward", "max_abs_reward 1e+06")
    masked = groups(1, "masked")
    masked[0].responses[2].loss_mask.extend([False] * len(masked[0].responses[2].tokens))
    refused_alike(masked, "a loss mask with no generated token", "response 2: loss_mask marks none of its")
    check(client.status().accepted_batches == 0, "nothing of the invalid batches was queued")

    r = client.submit(groups(3, "a"))
    check(r.accepted_groups == 3 and not r.duplicate, "3 groups accepted: no room for 2 more")
    t0 = time.time()
    holder = {}
    t = threading.Thread(target=lambda: holder.setdefault("r", client.submit(groups(2, "b"))))
    t.start()
    time.sleep(1.0)
    check(t.is_alive(), "a submit into the full queue is retried through RESOURCE_EXHAUSTED")
    stop(proc)  # a learner with room takes over the port
    proc = start_learner(port, ["--prompts_per_step=2", "--queue_capacity=8",
                                "--max_groups_per_batch=8"])
    t.join(60)
    check("r" in holder and holder["r"].accepted_groups == 2,
          "the held submit went through once the learner came back (%.1f s, %d attempts)"
          % (time.time() - t0, holder["r"].attempts if "r" in holder else -1))
    stop(proc)

    proc = start_learner(port, ["--prompts_per_step=2", "--fault_submit_reply_delay=2s"])
    quick = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="pkg-test", timeout=1.0,
                                    retry_deadline=30)
    r = quick.submit(groups(3, "c"))
    check(r.duplicate and r.attempts >= 2,
          "a reply lost past the deadline is retried with the same id: a duplicate (%d attempts)"
          % r.attempts)
    st = quick.status()
    check(st.accepted_groups == 3 and st.duplicate_batches >= 1,
          "the learner accepted the 3 groups once (accepted %d, duplicates %d)"
          % (st.accepted_groups, st.duplicate_batches))
    stop(proc)

    proc = start_learner(port, ["--prompts_per_step=2"])
    s = client.submit_stream([groups(2, "s%d" % i) for i in range(5)])
    check(s.accepted_batches == 5 and s.accepted_groups == 10 and s.duplicate_batches == 0,
          "SubmitStream: 5 batches, 10 groups")
    stop(proc)


def tensors_of(path):
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def scenario_weights():
    port = free_port()
    ckpt, export = os.path.join(WORK, "ckpt"), os.path.join(WORK, "export")
    flags = ["--prompts_per_step=2", "--checkpoint_every=1", "--keep_checkpoints=0",
             "--checkpoint_dir=" + ckpt, "--fault_corrupt_broadcast_versions=3"]
    proc = start_learner(port, flags + ["--export_dir=" + export])
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="w")
    sub = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="pkg-test-weights")

    seen = []

    def feed():  # one step at a time, once the subscriber has had (or failed) the last version
        for v in range(1, 6):
            deadline = time.time() + 60
            while len(seen) + sub.failures < v and time.time() < deadline:
                time.sleep(0.02)
            client.submit(groups(2, "w%d" % v))
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    snapshots = sub.snapshots()
    for snap in snapshots:
        seen.append(snap)
        sub.report(snap.version)
        if snap.version >= 5:
            break
    versions = [s.version for s in seen]
    check(versions == [0, 1, 2, 4, 5],
          "versions %s: each verified, the corrupt version 3 skipped" % versions)
    check(sub.failures == 1, "the corrupt transfer was counted (%d)" % sub.failures)
    stop(proc)
    exported = tensors_of(os.path.join(export, "model.safetensors"))
    last = dict(seen[-1].tensors("numpy"))
    check(sorted(exported) == sorted(last), "the snapshot has the export's %d Hugging Face names"
          % len(exported))
    check(all(exported[k][1] == list(last[k].shape) and exported[k][2] == last[k].astype("<f4").tobytes()
              for k in exported), "every tensor has the export's shape and bytes")
    torch_ok = True
    try:
        import torch  # noqa: F401
        t = dict(seen[-1].tensors("torch"))
        torch_ok = all(t[k].numpy().tobytes() == exported[k][2] for k in exported)
    except ImportError:
        pass
    check(torch_ok, "torch tensors carry the same bytes")

    # The same subscriber, still iterating, follows a learner restarted from
    # an older checkpoint (version 2) back from 5.
    for d in os.listdir(ckpt):
        if d.startswith("ckpt-") and int(d[5:]) > 2:
            shutil.rmtree(os.path.join(ckpt, d))
    proc = start_learner(port, flags)
    back = next(snapshots)
    check(back.version == 2, "the subscriber registered again and followed the learner back to "
          "version 2 from 5")
    link = os.path.join(WORK, "hf", "policy")
    first = asympo_rl.write_hf_directory(seen[-1], link, {"model_type": "qwen3"})
    second = asympo_rl.write_hf_directory(back, link, {"model_type": "qwen3"})
    check(os.path.islink(link) and os.path.realpath(link) == second and os.path.isdir(first),
          "write_hf_directory points the link at the newest version")
    check(sorted(tensors_of(os.path.join(link, "model.safetensors"))) == sorted(exported)
          and json.load(open(os.path.join(link, "config.json")))["model_type"] == "qwen3",
          "the directory holds model.safetensors and config.json")
    stop(proc)


def raw_tensors(snap):
    return {t.name: bytes(snap.buckets[t.bucket][t.offset:t.offset + t.size_bytes])
            for t in snap.manifest.tensors}


def check_delta_apply():
    """asympo_rl's delta reader on records written by hand (tests/fuzz/make_seeds.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
    from make_seeds import delta_record
    from asympo_rl import delta
    base = bytes(range(256)) * 2
    want = bytearray(base)
    for i, v in ((0, b"\x01\x02"), (200, b"\x03\x04"), (255, b"\x05\x06")):
        want[2 * i:2 * i + 2] = v
    gaps = delta_record(2, 2, 256, [0, 200, 255], b"\x01\x02\x03\x04\x05\x06")
    bitmap = delta_record(2, 1, 256, [0, 200, 255], b"\x01\x02\x03\x04\x05\x06")
    out = bytearray(len(base))
    check(delta.apply(base, gaps, out, "t") == want and delta.apply(base, bitmap, out, "t") == want,
          "a gaps record and a bitmap record rebuild the same bucket")
    halves = delta_record(2, 2, 128, [0], b"\x01\x02") + delta_record(2, 1, 128, [72, 127],
                                                                       b"\x03\x04\x05\x06")
    check(delta.apply(base, halves, bytearray(len(base)), "t") == want,
          "two records, each covering its half")
    every3 = list(range(1, 256, 3))  # every gap in one byte
    values = b"".join(bytes([i, 255 - i]) for i in every3)
    short_gaps = delta.apply(base, delta_record(2, 2, 256, every3, values), bytearray(len(base)), "t")
    check(short_gaps == delta.apply(base, delta_record(2, 1, 256, every3, values), bytearray(len(base)), "t")
          and short_gaps[2:4] == bytes([1, 254]), "gaps of one byte each rebuild what the bitmap does")
    check_refused(delta, base, delta_record(2, 2, 256, every3 + [256], values + b"zz", index=bytes(
        [1] + [2] * len(every3))), "one-byte gaps past the end")
    for bad, why in ((gaps[:-1], "a truncated record"), (gaps + b"x", "a byte past the records"),
                     (delta_record(2, 2, 300, [299], b"zz"), "a record past the bucket"),
                     (delta_record(2, 2, 256, [4, 9], b"qqrr", index=b"\x04\x04\x04"),
                      "more gaps than changed words"),
                     (delta_record(2, 1, 256, [4, 9], b"qqrr")[:-4] + b"qq", "too few values"),
                     (b"ASD9" + gaps[4:], "another magic")):
        check_refused(delta, base, bad, why)
    check_delta_apply_xor(delta, base, delta_record)
    check_delta_apply_memory(delta)


def check_refused(delta, base, bad, why):
    untouched = bytearray(b"\xee" * len(base))
    try:
        delta.apply(base, bad, untouched, "bucket 0")
        check(False, "%s was refused" % why)
    except asympo_rl.WeightsError as e:
        check("bucket 0" in str(e), "%s is refused, naming the bucket (%s)" % (why, e))
    check(untouched == b"\xee" * len(base), "%s left the output untouched" % why)


def check_delta_apply_xor(delta, base, delta_record):
    """"ASD2" records (XOR planes: low bytes, the high-byte bitmap, the high
    bytes) as the learner writes them for bfloat16 buckets."""
    from make_seeds import xor_record
    words = [int.from_bytes(base[2 * i:2 * i + 2], "little") for i in range(256)]
    xors = {0: 0x0001, 7: 0x0180, 200: 0x8000, 255: 0x00FF}
    want = bytearray(base)
    for i, x in xors.items():
        want[2 * i:2 * i + 2] = (words[i] ^ x).to_bytes(2, "little")
    at, xs = sorted(xors), [xors[i] for i in sorted(xors)]
    for kind in (1, 2):
        out = bytearray(len(base))
        check(delta.apply(base, xor_record(kind, 256, at, xs), out, "t") == want,
              "an \"ASD2\" record with a %s index rebuilds the bucket" % ("bitmap", "gaps")[kind - 1])
    mixed = xor_record(2, 128, at[:2], xs[:2]) + delta_record(2, 1, 128, [72, 127],
                                                              bytes(want[400:402] + want[510:512]))
    check(delta.apply(base, mixed, bytearray(len(base)), "t") == want, "an \"ASD2\" record, then an \"ASD1\"")
    good = xor_record(2, 256, at, xs)
    flags = len(good) - 2 - 1  # the high-byte bitmap (one byte), then 2 high bytes
    for bad, why in ((good[:flags] + bytes([good[flags] ^ 1]) + good[flags + 1:], "a high-byte bitmap off by one"),
                     (good[:6] + b"\x02" + good[7:], "an unknown value coding"),
                     (good[:4] + b"\x04" + good[5:], "4-byte words in XOR planes")):
        check_refused(delta, base, bad, why)


def check_delta_apply_memory(delta):
    """A 32 MiB bucket with every other word changed, in records of 1 MiB as
    the learner writes them, rebuilds holding about one record's positions
    at a time (8 bytes a changed word): not the whole bucket's (64 MiB)."""
    import struct
    import tracemalloc
    import numpy
    words, per = 16 << 20, 1 << 19
    base = numpy.arange(words, dtype=numpy.uint16)
    want = base ^ (numpy.arange(words) % 2).astype(numpy.uint16)
    changed = want != base
    records = []
    for s in range(0, words, per):
        m = changed[s:s + per]
        bits = numpy.packbits(m, bitorder="little").tobytes()
        records.append(struct.pack("<4sBBHQQQ", b"ASD1", 2, 1, 0, per, int(m.sum()), len(bits))
                       + bits + want[s:s + per][m].tobytes())
    d, out = b"".join(records), numpy.empty(2 * words, dtype=numpy.uint8)
    tracemalloc.start()
    delta.apply(base.view(numpy.uint8), d, out, "bucket 0")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    check(out.view(numpy.uint16).tolist() == want.tolist(), "the 32 MiB bucket is rebuilt")
    check(peak < 12 << 20, "its rebuild held %.1f MiB beside the bucket (one record's worth: 4 MiB)"
          % (peak / 2**20))


def scenario_deltas():
    """Delta versions through the Python subscriber: bfloat16 weights at lr
    1e-6 change in a few words per version; one subscriber rebuilds each
    version from the one before, byte-equal to one that fetches every version
    whole and, at the end, to the learner's export; a corrupt delta is
    fetched whole; keyframes come whole to everyone."""
    check_delta_apply()
    port = free_port()
    export = os.path.join(WORK, "export")
    proc = start_learner(port, ["--prompts_per_step=2", "--dtype=bfloat16", "--lr=1e-6",
                                "--delta_keyframe_every=4", "--fault_corrupt_delta_versions=3",
                                "--export_dir=" + export])
    whole = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="whole", deltas=False)
    fast = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="deltas")
    streams = {whole: whole.snapshots(), fast: fast.snapshots()}
    held = {}
    for v in range(0, 9):
        if v > 0:
            train_to(port, v, "d")
        got = {sub: next_within(stream, 60) for sub, stream in streams.items()}
        if held:
            # A subscriber lets a yielded version go once the next one came
            # (the caller decides how long it lives); with deltas it keeps it
            # as the next delta's base until then.
            check(held[whole]() is None and held[fast]() is None,
                  "version %d: neither subscriber still holds version %d" % (v, v - 1))
        held = {sub: weakref.ref(snap) for sub, snap in got.items() if snap is not None}
        check(all(g is not None and g.version == v for g in got.values()),
              "both subscribers hold version %d" % v)
        check(all(0 <= g.fetch_seconds < 60 for g in got.values()),
              "version %d's fetch took %s s" % (v, [round(g.fetch_seconds, 3) for g in got.values()]))
        check(got[fast].buckets == got[whole].buckets,
              "version %d: rebuilt%s, byte-equal to the whole fetch" % (
                  v, " from a delta" if got[fast].from_delta else " (whole)"))
        for sub in streams:
            sub.report(v)
    # Keyframes 0, 4 and 8; 3's delta was corrupt: 1, 2, 5, 6 and 7 came as deltas.
    check(fast.delta_versions == 5 and fast.delta_fallbacks == 1 and fast.failures == 0,
          "5 versions came as deltas, the corrupt one whole (%d, %d, %d)" % (
              fast.delta_versions, fast.delta_fallbacks, fast.failures))
    check(whole.delta_versions == 0, "the subscriber without deltas fetched every version whole")
    last = raw_tensors(got[fast])
    stop(proc)
    exported = tensors_of(os.path.join(export, "model.safetensors"))
    check(sorted(exported) == sorted(last) and all(exported[k][2] == last[k] for k in exported),
          "version 8 rebuilt from deltas holds the export's bytes")


def scenario_broken_fetch():
    """A fetch broken off by the learner's death keeps nothing of the
    version: its buffers go at once, not when Python's garbage collector
    next runs (the call's error holds the frames that hold them; at 1.2 GB a
    version, a killed learner left a subscriber holding three)."""
    import gc
    import tracemalloc
    import grpc
    from asympo_rl._stubs import weight_broadcast_pb2 as wb
    port = free_port()
    proc = start_learner(port, ["--tiny_vocab_size=4096", "--broadcast_chunk_kb=16",
                                "--fault_broadcast_chunk_delay=20ms"])
    sub = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="broken")
    sub.register()
    # The manifest as the subscriber's own stream announces it.
    m = next(iter(sub._stub.Subscribe(wb.SubscribeRequest(session_id=sub.session)))).manifest
    check(m.total_bytes >= 64 * 16384, "version %d is %d bytes: over a second to send" % (m.version, m.total_bytes))
    gc.disable()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    threading.Timer(0.5, proc.kill).start()
    try:
        sub.fetch(m)
        check(False, "the fetch broke off")
    except (grpc.RpcError, asympo_rl.WeightsError) as e:
        check(True, "the fetch broke off: %s" % str(e).splitlines()[0][:80])
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    gc.enable()
    proc.wait(timeout=30)
    check(held < m.total_bytes // 4, "after it, %d bytes are held of a %d-byte version" % (held, m.total_bytes))


def scenario_deltas_recovery():
    """Delta versions for a subscriber that misses a version, one that joins
    late, and both following a learner restarted from a checkpoint: where
    they lack the base they fetch the version whole, then deltas again, and
    both end on the restarted learner's exact weights (its export)."""
    port = free_port()
    export, target = os.path.join(WORK, "export"), "127.0.0.1:%d" % port
    flags = ["--prompts_per_step=2", "--dtype=bfloat16", "--lr=1e-6", "--checkpoint_every=2",
             "--keep_checkpoints=0", "--checkpoint_dir=" + os.path.join(WORK, "ckpt"),
             "--export_dir=" + export]
    proc = start_learner(port, flags)
    sub = asympo_rl.WeightSubscriber(target, receiver_id="behind")
    stream = sub.snapshots()

    def take(stream, sub, version, from_delta, what):
        snap = next_within(stream, 60)
        check(snap is not None and snap.version == version and snap.from_delta == from_delta,
              "%s: version %s, %s" % (what, snap and snap.version, "a delta" if snap and snap.from_delta
                                      else "whole"))
        sub.report(snap.version)
        return snap

    take(stream, sub, 0, False, "the first version")
    train_to(port, 1, "a")
    take(stream, sub, 1, True, "the next")
    # Versions 2 and 3 trained while the subscriber took nothing: 2 is
    # gone when it asks, and 3 is a delta from 2, which it never held.
    train_to(port, 3, "b")
    take(stream, sub, 3, False, "after a missed version")
    train_to(port, 4, "c")
    take(stream, sub, 4, True, "deltas again")
    late = asympo_rl.WeightSubscriber(target, receiver_id="late")
    late_stream = late.snapshots()
    got = take(late_stream, late, 4, False, "a late joiner's first")
    train_to(port, 5, "d")
    mine, theirs = take(stream, sub, 5, True, "the next"), take(late_stream, late, 5, True, "the late joiner's next")
    check(mine.buckets == theirs.buckets and got.buckets != mine.buckets, "both rebuilt the same version 5")
    proc.kill()
    proc.wait()
    # Restarted from checkpoint 4: a new incarnation's version 4, whole to
    # both (they hold the old one's 5), then its 5 as a delta.
    proc = start_learner(port, flags)
    for st, sb, who in ((stream, sub, "the subscriber"), (late_stream, late, "the late joiner")):
        take(st, sb, 4, False, "%s after the restart" % who)
    train_to(port, 5, "e", token=3)
    last = [take(st, sb, 5, True, "%s's next" % who)
            for st, sb, who in ((stream, sub, "the subscriber"), (late_stream, late, "the late joiner"))]
    check(all(s.incarnation == status_of(port).incarnation for s in last), "both hold the new incarnation")
    check(sub.delta_fallbacks == 0 and late.delta_fallbacks == 0 and sub.failures == 0,
          "no delta failed (%d, %d, %d)" % (sub.delta_fallbacks, late.delta_fallbacks, sub.failures))
    stop(proc)
    exported = tensors_of(os.path.join(export, "model.safetensors"))
    for snap, who in zip(last, ("the subscriber", "the late joiner")):
        raw = raw_tensors(snap)
        check(sorted(exported) == sorted(raw) and all(exported[k][2] == raw[k] for k in exported),
              "%s's version 5, rebuilt from a delta, holds the export's bytes" % who)


def status_of(port):
    return asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="probe").status(timeout=30)


def train_to(port, version, tag, token=8):
    """Submits one step's groups at a time until the learner is at `version`;
    `token` picks the responses (other tokens: other weights). A client of
    its own: one that saw an earlier incarnation would send its unconfirmed
    batches again (the recovery rule), and train past `version`."""
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="r-%s" % tag)
    deadline = time.time() + 120
    while status_of(port).version < version and time.time() < deadline:
        before = status_of(port).version
        client.submit([asympo_rl.group([1, 4, token, 3], [([token + r, 2], float(r == 0))
                                                        for r in range(3)],
                                       prompt_id="%s%d-%d" % (tag, before, g)) for g in range(2)])
        while status_of(port).version == before and time.time() < deadline:
            time.sleep(0.02)
    check(status_of(port).version == version, "the learner trained to version %d" % version)


def next_within(snapshots, seconds):
    """next(snapshots), or None when nothing comes within `seconds`."""
    got = []
    t = threading.Thread(target=lambda: got.append(next(snapshots)), daemon=True)
    t.start()
    t.join(seconds)
    return got[0] if got else None


def scenario_restart():
    port = free_port()
    ckpt = os.path.join(WORK, "ckpt")
    flags = ["--prompts_per_step=2", "--checkpoint_every=4", "--keep_checkpoints=0",
             "--checkpoint_dir=" + ckpt]
    proc = start_learner(port, flags)
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="r")
    sub = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="restart-sub")
    snapshots = sub.snapshots()
    train_to(port, 5, "first")
    held = None
    while held is None or held.version < 5:
        held = next_within(snapshots, 30)
        check(held is not None, "the subscriber follows the first learner")
        sub.report(held.version)
    old = dict(held.tensors("numpy"))
    first_incarnation = held.incarnation
    status = status_of(port)
    check((status.checkpoint_version, status.recorded_through_version,
           status.trained_through_version) == (4, 4, 5),
          "checkpoint 4 records every batch answered below version 4; all below 5 are trained")
    # A batch id names one payload: other groups under a known id are refused.
    client.submit(groups(1, "once"), batch_id="fixed-id")
    check(client.submit(groups(1, "once"), batch_id="fixed-id").duplicate, "the same payload is a duplicate")
    try:
        client.submit(groups(1, "other"), batch_id="fixed-id")
        check(False, "another payload under a known id is refused")
    except asympo_rl.RefusedError as e:
        check("ALREADY_EXISTS" in str(e) and "fixed-id" in str(e) and "another payload" in str(e),
              "another payload under a known id is refused with ALREADY_EXISTS: %s" % e)
    check(first_incarnation == status_of(port).incarnation and len(first_incarnation) == 16,
          "a snapshot names the learner's incarnation %r" % first_incarnation)
    proc.kill()
    proc.wait()
    # Restarted from version 4, it trains another version 5 before the
    # subscriber registers again.
    proc = start_learner(port, flags)
    status = status_of(port)
    check(status.version == 4 and status.resumed_from_version == 4 and
          status.incarnation != first_incarnation, "restarted from checkpoint 4, a new incarnation")
    check((status.checkpoint_version, status.recorded_through_version) == (4, 0),
          "nothing of the new incarnation is recorded yet")
    train_to(port, 5, "second", token=3)
    again = next_within(snapshots, 30)
    check(again is not None and again.version == 5 and again.incarnation == status.incarnation,
          "the subscriber fetched the restarted learner's version 5 (it held the first one's 5)")
    new = dict(again.tensors("numpy"))
    check(any(new[k].tobytes() != old[k].tobytes() for k in new), "and its weights differ")
    sub.report(again.version)
    # The learner counts it in sync only now: its versions-in-use gauge
    # and oldest version came from the reports.
    stop(proc)
    # A restart from a checkpoint of the weights it holds: nothing to fetch.
    for d in os.listdir(ckpt):
        if d.startswith("ckpt-") and int(d[5:]) != 4:
            shutil.rmtree(os.path.join(ckpt, d))
    proc = start_learner(port, flags)
    train_to(port, 5, "third", token=5)
    third = next_within(snapshots, 30)
    check(third is not None and third.version == 5 and third.incarnation != again.incarnation,
          "a third incarnation's other version 5 is fetched too")
    sub.report(third.version)
    proc.kill()
    proc.wait()
    quiet = ["--prompts_per_step=2", "--checkpoint_dir=" + ckpt, "--keep_checkpoints=0",
             "--checkpoint_every=1000"]
    proc = start_learner(port, quiet)
    check(status_of(port).version == 4, "the fourth start resumes at 4")
    back = next_within(snapshots, 30)
    check(back is not None and back.version == 4, "it follows the fourth incarnation back to 4")
    sub.report(4)
    failures = sub.failures
    # A fifth start from the same checkpoint publishes the very bytes it
    # holds under the same number: nothing is fetched, and it now holds
    # the fifth incarnation's version 4.
    proc.kill()
    proc.wait()
    proc = start_learner(port, quiet)
    fifth = status_of(port).incarnation
    nothing = next_within(snapshots, 5)
    check(nothing is None, "the same bytes under the same number were not fetched again")
    deadline = time.time() + 10
    while sub.incarnation != fifth and time.time() < deadline:
        time.sleep(0.05)
    check(sub.incarnation == fifth and sub.version == 4,
          "the subscriber holds the fifth incarnation's version 4")
    check(sub.failures == failures == 0, "no transfer failed")
    proc.kill()
    proc.wait()


def scenario_default_channel():
    port = free_port()
    proc = start_learner(port, ["--tiny_vocab_size=40000"])
    import grpc
    target = "127.0.0.1:%d" % port
    sub = asympo_rl.WeightSubscriber(target, receiver_id="plain", channel=grpc.insecure_channel(target))
    snap = next_within(sub.snapshots(), 60)
    check(snap is not None and snap.manifest.total_bytes > (4 << 20),
          "a %d-byte snapshot fetched through a default grpcio channel with max_chunk_bytes 0"
          % (snap.manifest.total_bytes if snap else 0))
    check(sub.failures == 0, "no transfer failed")
    stop(proc)


def scenario_example():
    port = free_port()
    export = os.path.join(WORK, "export")
    # The model's config.json, as an engine would have it: the learner's export.
    proc = start_learner(free_port(), ["--export_dir=" + export, "--max_steps=0"])
    time.sleep(3)
    stop(proc)
    proc = start_learner(port, ["--prompts_per_step=8", "--lr=5e-4", "--queue_capacity=16",
                                "--max_groups_per_batch=16", "--objective=asympo_stable"])
    time.sleep(1)
    check(proc.poll() is None, "the learner is up")
    out = subprocess.run([sys.executable, EXAMPLE, "--learner=127.0.0.1:%d" % port,
                          "--config=" + os.path.join(export, "config.json"), "--rounds=400",
                          "--log_every=50", "--weights_dir=" + os.path.join(WORK, "hf", "policy")],
                         env=dict(os.environ, PYTHONPATH=PKG), capture_output=True, text=True, timeout=900)
    print(out.stdout[-3000:], out.stderr[-3000:])
    check(out.returncode == 0, "the example generator ran to the end")
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    check(summary["last_reward"] > summary["first_reward"] + 0.3,
          "the reward rose: %.3f -> %.3f over %d rounds (%s s)" % (
              summary["first_reward"], summary["last_reward"], summary["rounds"], summary["seconds"]))
    check(summary["last_version"] and summary["last_version"] > 100, "it sampled with fresh weights")
    stop(proc)


def scenario_tls():
    import hashlib
    import grpc
    certs = os.path.join(WORK, "certs")
    subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing",
                    "make_certs.sh"), certs], check=True, stdout=subprocess.DEVNULL)
    principals = os.path.join(WORK, "principals.json")
    with open(principals, "w") as f:
        json.dump({"principals": [
            {"name": "gen", "token_sha256": hashlib.sha256(b"gen-token").hexdigest(),
             "roles": ["submit", "status", "read_weights"]},
            {"name": "dash", "token_sha256": hashlib.sha256(b"dash-token").hexdigest(),
             "roles": ["status"]}]}, f)
    port = free_port()
    proc = start_learner(port, ["--tls_cert=" + os.path.join(certs, "server.pem"),
                                "--tls_key=" + os.path.join(certs, "server.key"),
                                "--auth_file=" + principals, "--prompts_per_step=2"])
    with open(os.path.join(certs, "ca.pem"), "rb") as f:
        ca = f.read()

    def creds(token):
        return grpc.composite_channel_credentials(grpc.ssl_channel_credentials(ca),
                                                  grpc.access_token_call_credentials(token))
    target = "127.0.0.1:%d" % port
    client = asympo_rl.LearnerClient(target, source="tls", credentials=creds("gen-token"))
    r = client.submit(groups(2, "t"))
    check(r.accepted_groups == 2, "a batch over TLS with a token is accepted")
    # Those two groups make one step, so the learner has published version 0 or,
    # once the step is done, version 1: the subscriber gets whichever is newest.
    sub = asympo_rl.WeightSubscriber(target, "tls-sub", credentials=creds("gen-token"))
    snap = next(sub.snapshots())
    check(snap.version in (0, 1) and len(snap.names()) > 0,
          "the subscriber fetches verified weights over TLS (version %d, %d tensors)"
          % (snap.version, len(snap.names())))
    sub.close()
    try:
        next(asympo_rl.WeightSubscriber(target, "dash-sub", credentials=creds("dash-token"),
                                        model_signature="x").snapshots())
        check(False, "a subscriber without the role read_weights is refused")
    except asympo_rl.RefusedError as e:
        check("PERMISSION_DENIED" in str(e) or "lacks the role" in str(e),
              "a subscriber without the role read_weights is refused: %s" % e)
    for token, what in [("nope", "UNAUTHENTICATED"), ("dash-token", "PERMISSION_DENIED")]:
        t0 = time.time()
        try:
            asympo_rl.LearnerClient(target, source="tls", credentials=creds(token),
                                    retry_deadline=30).submit(groups(1, "x"))
            check(False, "a submit with %s is refused" % token)
        except asympo_rl.RefusedError as e:
            check(what in str(e) and time.time() - t0 < 10,
                  "a submit with %s is refused at once, not retried: %s" % (token, e))
    stop(proc)

def scenario_retry_policy():
    import grpc
    from asympo_rl import client as c
    C = grpc.StatusCode
    # Every code (RESOURCE_EXHAUSTED twice: without and with the hint), as
    # tests/common/submit_retry_test.cc has it for the C++ tools.
    table = {"OK": "accepted", "CANCELLED": "retry", "UNKNOWN": "retry",
             "INVALID_ARGUMENT": "drop_batch", "DEADLINE_EXCEEDED": "retry", "NOT_FOUND": "fatal",
             "ALREADY_EXISTS": "fatal", "PERMISSION_DENIED": "fatal",
             "RESOURCE_EXHAUSTED": "drop_batch", "FAILED_PRECONDITION": "drop_batch",
             "ABORTED": "retry", "OUT_OF_RANGE": "drop_batch", "UNIMPLEMENTED": "fatal",
             "INTERNAL": "retry", "UNAVAILABLE": "retry", "DATA_LOSS": "fatal",
             "UNAUTHENTICATED": "fatal"}
    check(sorted(table) == sorted(code.name for code in C), "the table names every gRPC code")
    for code in C:
        check(c.decide_submit(code, False) == table[code.name], "%s: %s" % (code.name, table[code.name]))
        hinted = "retry" if code == C.RESOURCE_EXHAUSTED else table[code.name]
        check(c.decide_submit(code, True) == hinted, "%s with the hint: %s" % (code.name, hinted))
        status = "fatal" if table[code.name] == "drop_batch" else table[code.name]
        check(c.decide_get_status(code, False) == status, "GetStatus %s: %s" % (code.name, status))
    check(c.decide_submit(C.FAILED_PRECONDITION, False) == c.DROP_BATCH,
          "FAILED_PRECONDITION drops the batch (it used to raise RefusedError)")

    # docs/protocol.md says the same, row by row.
    doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                            "protocol.md")).read()
    section = doc[doc.index("## Retries"):]
    section = section[:section.index("\n## ")]
    documented = {}
    for line in section.splitlines():
        m = re.match(r"^\| `([A-Z_]+)`( with [^|]*| without it)? \| ([a-z_]+) \|", line)
        if m:
            documented[(m.group(1), bool(m.group(2) and "with " in m.group(2)))] = m.group(3)
    check(len(documented) == 18, "docs/protocol.md's table has 18 rows (%d)" % len(documented))
    for code in C:
        check(documented.get((code.name, False)) == table[code.name],
              "docs/protocol.md agrees on %s" % code.name)
    check(documented.get(("RESOURCE_EXHAUSTED", True)) == "retry",
          "docs/protocol.md: RESOURCE_EXHAUSTED with the hint is retried")

    class Error(grpc.RpcError):
        def __init__(self, code, hint=None):
            self._code, self._hint = code, hint

        def code(self):
            return self._code

        def details(self):
            return "scripted"

        def trailing_metadata(self):
            return () if self._hint is None else ((c.RETRY_AFTER_KEY, self._hint),)

    check(c.retry_hint(Error(C.RESOURCE_EXHAUSTED, "250")) == 0.25, "the hint in seconds")
    check(c.retry_hint(Error(C.RESOURCE_EXHAUSTED, "x")) == 1.0, "an unreadable hint: 1 s")
    check(c.retry_hint(Error(C.RESOURCE_EXHAUSTED, "-5")) == 1.0, "a negative hint: 1 s")
    check(c.retry_hint(Error(C.RESOURCE_EXHAUSTED, "999999")) == 60.0, "a hint: at most 60 s")
    check(c.retry_hint(Error(C.RESOURCE_EXHAUSTED)) is None, "no hint")
    check(c.retry_hint(Error(C.UNAVAILABLE, "250")) is None, "only RESOURCE_EXHAUSTED has a hint")

    client = asympo_rl.LearnerClient("127.0.0.1:1", source="policy", min_backoff=0.1,
                                     max_backoff=0.35, validate=False)
    slept = []
    real_sleep = c.time.sleep
    c.time.sleep = slept.append
    try:
        backoff = c._Backoff(client)
        for _ in range(4):
            backoff.wait(Error(C.UNAVAILABLE), "t")
        backoff.wait(Error(C.RESOURCE_EXHAUSTED, "300"), "t")
    finally:
        c.time.sleep = real_sleep
    for got, base in zip(slept, [0.1, 0.2, 0.35, 0.35, 0.3]):
        check(base <= got <= base * 1.2 + 1e-9, "waited %.3f s for %.2f s plus jitter" % (got, base))
    for code, error in [(C.INVALID_ARGUMENT, asympo_rl.InvalidBatchError),
                        (C.FAILED_PRECONDITION, asympo_rl.InvalidBatchError),
                        (C.RESOURCE_EXHAUSTED, asympo_rl.InvalidBatchError),
                        (C.UNAUTHENTICATED, asympo_rl.RefusedError),
                        (C.NOT_FOUND, asympo_rl.RefusedError)]:
        try:
            client._raise_if_final(Error(code), "batch b")
            check(False, "%s raises %s" % (code.name, error.__name__))
        except error:
            check(True, "%s raises %s" % (code.name, error.__name__))
    for code, hint in [(C.UNAVAILABLE, None), (C.RESOURCE_EXHAUSTED, "100"), (C.CANCELLED, None)]:
        client._raise_if_final(Error(code, hint), "batch b")  # retried: no error
    check(True, "retried codes raise nothing")
    client.close()


def scenario_policy_lag():
    r = asympo_rl.response([5], 1.0, first_policy_version=3)
    check(r.first_policy_version == 3 and r.last_policy_version == 3, "last defaults to first")
    check(not asympo_rl.response([5], 1.0).HasField("first_policy_version"), "unset by default")
    g = asympo_rl.group([1, 2], [([5], 1.0), {"tokens": [6], "reward": 0.0, "first_policy_version": 4,
                                              "last_policy_version": 6}], policy_version=5)
    check([(x.first_policy_version, x.last_policy_version) for x in g.responses] == [(5, 5), (4, 6)],
          "group(policy_version=) stamps only the responses without versions")
    gen, ins = asympo_rl.generated, asympo_rl.inserted
    turns = asympo_rl.multi_turn_response([gen([9, 10], [-1.0, -2.0]), ins([11, 4]), gen([2], [-0.5])], 0.0)
    check(list(turns.tokens) == [9, 10, 11, 4, 2] and list(turns.loss_mask) == [True, True, False, False, True]
          and list(turns.behavior_logprobs) == [-1.0, -2.0, -0.5],
          "multi_turn_response: the segments' tokens, a loss mask of the inserted ones, log-probs of the "
          "generated ones")
    check(not asympo_rl.multi_turn_response([gen([9]), gen([10])], 1.0).loss_mask,
          "no loss mask when every segment was generated")
    for segments, words in (([ins([3])], "at least one generated"), ([gen([])], "no tokens"),
                            ([gen([3], [-1.0]), gen([4])], "some generated segments only")):
        try:
            asympo_rl.multi_turn_response(segments, 1.0)
            check(False, "refused: %s" % words)
        except asympo_rl.InvalidBatchError as e:
            check(words in str(e), "multi_turn_response refuses it: %s" % e)

    port = free_port()
    proc = start_learner(port, ["--prompts_per_step=2", "--max_policy_lag=1"])

    class Subscriber:  # what LearnerClient reads of a WeightSubscriber
        version = None
    sub = Subscriber()
    client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="lag", timeout=5,
                                     retry_deadline=30, weights=sub)
    batch = client.make_batch(groups(2, "u"))
    check(not batch.groups[0].responses[0].HasField("first_policy_version"),
          "a subscriber that holds no version stamps nothing")

    def wait_version(v):
        deadline = time.time() + 60
        while client.status().version < v and time.time() < deadline:
            time.sleep(0.05)
        check(client.status().version >= v, "the learner reached version %d" % v)

    bad = groups(1, "bad")
    bad[0].responses[1].first_policy_version = 2
    bad[0].responses[1].last_policy_version = 1
    raw = asympo_rl.LearnerClient("127.0.0.1:%d" % port, validate=False)
    messages = []
    for sender, who in ((client, "before sending"), (raw, "by the learner")):
        try:
            sender.submit(bad)
            check(False, "versions out of order are refused %s" % who)
        except asympo_rl.InvalidBatchError as e:
            messages.append(str(e))
    check(messages[0] in messages[1] and "last_policy_version 1 is below first_policy_version 2"
          in messages[0], "the local message is the learner's: %s" % messages[0])

    first = groups(2, "a")
    first[0].responses[1].CopyFrom(asympo_rl.multi_turn_response([gen([9, 10]), ins([11, 4]), gen([2])], 0.0))
    check(client.submit(first, policy_version=0).accepted_groups == 2,
          "version 0 accepted, a multi-turn response among its groups")
    wait_version(1)
    sub.version = 1
    sent = client.make_batch(groups(2, "b"))
    check(sent.groups[1].responses[2].first_policy_version == 1, "the subscriber's version stamped")
    check(client.submit(sent).accepted_groups == 2, "the subscriber's version 1 accepted")
    wait_version(2)
    t0 = time.time()
    try:
        client.submit(groups(2, "old"), policy_version=0)
        check(False, "a group 2 versions behind is refused")
    except asympo_rl.InvalidBatchError as e:
        check("more than its --max_policy_lag 1" in str(e) and time.time() - t0 < 5,
              "refused at once and dropped, not retried: %s" % e)
    try:
        client.submit(groups(2, "future"), policy_version=99)
        check(False, "a version from the future is refused")
    except asympo_rl.InvalidBatchError as e:
        check("newer than the learner's version" in str(e), "from the future: %s" % e)
    deadline = time.time() + 60
    st = client.status()
    while st.trained_groups < 4 and time.time() < deadline:  # step 2 counted
        time.sleep(0.05)
        st = client.status()
    # From the future (another incarnation's versions): stale, as lag.
    check(st.max_policy_lag == 1 and st.rejected_lag_batches == 2 and st.rejected_invalid_batches == 1,
          "the status counts the refusals apart (lag %d, invalid %d)"
          % (st.rejected_lag_batches, st.rejected_invalid_batches))
    lags = {s.source: s for s in st.source_policy_lags}
    check(lags["anonymous"].trained_groups == 4 and lags["anonymous"].max_lag == 0,
          "both steps trained fresh groups: %s" % lags["anonymous"])
    stop(proc)


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    {"client": scenario_client, "weights": scenario_weights, "example": scenario_example,
     "tls": scenario_tls, "retry_policy": scenario_retry_policy,
     "policy_lag": scenario_policy_lag, "restart": scenario_restart,
     "default_channel": scenario_default_channel, "deltas": scenario_deltas,
     "broken_fetch": scenario_broken_fetch, "deltas_recovery": scenario_deltas_recovery}[SCENARIO]()


if __name__ == "__main__":
    main()
