#!/usr/bin/python3
"""Writes the seed inputs of tests/fuzz/corpus/: small, valid examples of what
each parser reads, plus a few that break one rule each, so that fuzzing
starts from the interesting parts of the format. Run it again after a
format change:

    /usr/bin/python3 tests/fuzz/make_seeds.py

Needs Debian's python3-grpc-tools (protoc for the messages). The seeds are
checked in; files named crash-* next to them are fuzzer findings, kept as
regression inputs, and are left alone.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def load_protos():
    out = tempfile.mkdtemp(prefix="asympo_seeds_")
    subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I" + os.path.join(ROOT, "proto"),
                           "--python_out=" + out, "asympo/v1/rollout.proto",
                           "asympo/v1/weight_broadcast.proto"])
    sys.path.insert(0, out)
    from asympo.v1 import rollout_pb2, weight_broadcast_pb2
    return rollout_pb2, weight_broadcast_pb2


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(CORPUS, target, "seed-" + name), "wb") as f:
        f.write(data)


def batches(rollout_pb2):
    def group(prompt_id, n, logprobs=False):
        g = rollout_pb2.PromptGroup(prompt_id=prompt_id, prompt_tokens=[1, 2, 3])
        for j in range(n):
            r = g.responses.add(tokens=[4 + j, 5, 6], reward=float(j % 2))
            if logprobs:
                r.behavior_logprobs.extend([-0.5, -1.0, -0.25])
        return g

    ok = rollout_pb2.RolloutBatch(groups=[group("p0", 2), group("p1", 4, True)], source="rollout-0",
                                  batch_id="rollout-0/00ab/17")
    write("batch_validation", "valid", ok.SerializeToString())
    write("batch_validation", "valid_logprobs",
          rollout_pb2.RolloutBatch(groups=[group("p", 3, True)]).SerializeToString())
    bad = rollout_pb2.RolloutBatch(groups=[group("nan", 2)])
    bad.groups[0].responses[1].reward = math.nan
    write("batch_validation", "nan_reward", bad.SerializeToString())
    write("batch_validation", "group_of_one",
          rollout_pb2.RolloutBatch(groups=[group("one", 1)]).SerializeToString())
    big = rollout_pb2.RolloutBatch(groups=[group("v", 2)])
    big.groups[0].prompt_tokens.append(100000)
    write("batch_validation", "outside_vocab", big.SerializeToString())


def manifests(wb):
    def manifest(specs, bucket_bytes):
        m = wb.SnapshotManifest(version=7, model_signature="2-0badcafe")
        used, sizes = 0, []
        for name, dtype, shape in specs:
            n = {wb.DTYPE_F32: 4, wb.DTYPE_BF16: 2, wb.DTYPE_F16: 2}[dtype]
            for d in shape:
                n *= d
            at = (used + 63) // 64 * 64
            if not sizes or (used > 0 and at + n > bucket_bytes):
                sizes.append(0)
                used, at = 0, 0
            m.tensors.add(name=name, dtype=dtype, shape=shape, bucket=len(sizes) - 1, offset=at,
                          size_bytes=n)
            used = at + n
            sizes[-1] = used
        for i, s in enumerate(sizes):
            m.buckets.add(index=i, size_bytes=s, crc32c=0x12345678 + i)
        m.total_bytes = sum(sizes)
        return m

    specs = [("embed.weight", wb.DTYPE_F32, [300, 16]), ("layers.0.norm", wb.DTYPE_BF16, [16]),
             ("layers.0.q", wb.DTYPE_F16, [16, 16]), ("lm_head.weight", wb.DTYPE_F32, [300, 16]),
             ("scalar", wb.DTYPE_F32, [])]
    write("snapshot_manifest", "two_buckets", manifest(specs, 20000).SerializeToString())
    write("snapshot_manifest", "one_bucket", manifest(specs, 1 << 20).SerializeToString())
    overlap = manifest(specs[:2], 1 << 20)
    overlap.tensors[1].offset = 0
    write("snapshot_manifest", "overlap", overlap.SerializeToString())
    # Bucket sizes whose sum wraps around 2^64 to total_bytes (fixed in
    # ValidateManifest; SnapshotManifestTest.ValidationRejectsBucketSizesThatWrapAround).
    wrap = wb.SnapshotManifest(version=1, total_bytes=0)
    wrap.buckets.add(index=0, size_bytes=1 << 63)
    wrap.buckets.add(index=1, size_bytes=1 << 63)
    write("snapshot_manifest", "wrapping_bucket_sizes", wrap.SerializeToString())


def chunks(wb):
    chunk = wb.WeightChunk(version=3, bucket=1, offset=65536, data=bytes(range(40))).SerializeToString()
    write("wire_format", "whole", b"\x00" + chunk)
    write("wire_format", "three_slices", b"\x02\x05\x0c" + chunk)
    write("wire_format", "data_only", b"\x00" + wb.WeightChunk(data=b"xyz").SerializeToString())
    write("wire_format", "unknown_fields", b"\x01\x03" + chunk + b"\x2a\x02hi\x31" + b"\x00" * 8)
    write("wire_format", "delta", b"\x01\x07" + wb.WeightChunk(
        version=4, bucket=2, offset=96, data=b"ASD1" + bytes(28), delta_bytes=1 << 20).SerializeToString())


def delta_record(word, kind, words, changed_at, values, index=None):
    """One "ASD1" record of a bucket's delta (docs/protocol.md, "Delta
    versions"): kind 1 a bitmap index, 2 gaps; `index` replaces the one
    `changed_at` makes."""
    if index is None:
        if kind == 1:
            bits = bytearray((words + 7) // 8)
            for i in changed_at:
                bits[i // 8] |= 1 << (i % 8)
            index = bytes(bits)
        else:
            out, last = bytearray(), 0
            for i in changed_at:
                gap = i - last
                while gap >= 0x80:
                    out.append((gap & 0x7F) | 0x80)
                    gap >>= 7
                out.append(gap)
                last = i + 1
            index = bytes(out)
    return (b"ASD1" + struct.pack("<BBHQQQ", word, kind, 0, words, len(changed_at), len(index))
            + index + values)


def xor_record(kind, words, changed_at, xors):
    """One "ASD2" record (2-byte words): the index of `changed_at` (kind 1 a
    bitmap, 2 gaps) and the changed words' XOR with the base, `xors`
    (ints below 65536), in planes."""
    index = delta_record(2, kind, words, changed_at, b"")[32:]
    lows = bytes(x & 0xFF for x in xors)
    flags = bytearray((len(xors) + 7) // 8)
    highs = bytearray()
    for k, x in enumerate(xors):
        if x >> 8:
            flags[k // 8] |= 1 << (k % 8)
            highs.append(x >> 8)
    planes = lows + bytes(flags) + bytes(highs)
    return (b"ASD2" + struct.pack("<BBBBQQQQ", 2, kind, 1, 0, words, len(changed_at), len(index),
                                  len(planes)) + index + planes)


def deltas():
    """Bucket deltas (weight_broadcaster/delta_codec.h) of the fuzz target's
    base: two bytes of bucket size, then the records."""
    record = delta_record

    def seed(name, size, *records):
        write("delta_codec", name, struct.pack("<H", size) + b"".join(records))

    seed("gaps", 64, record(2, 2, 32, [0, 5, 31], b"\x01\x02" * 3))
    seed("bitmap", 64, record(2, 1, 32, [1, 2, 3, 30], b"\xff\x00" * 4))
    seed("two_records", 128, record(4, 2, 16, [3], b"abcd"), record(4, 1, 16, [0, 15], b"wxyz" * 2))
    seed("unchanged", 48, record(8, 2, 6, [], b""))
    seed("far_gap", 4096, record(2, 2, 2048, [2047, ], b"zz"))
    seed("short_index", 64, record(2, 2, 32, [4, 9], b"qqrr", index=b"\x04"))
    seed("empty", 0)
    seed("xor_gaps", 64, xor_record(2, 32, [0, 5, 31], [0x0001, 0x0180, 0x8003]))
    seed("xor_bitmap", 64, xor_record(1, 32, [1, 2, 30], [0x0002, 0x0004, 0x7F00]))
    seed("xor_then_whole", 128, xor_record(2, 32, [3], [0x00FF]), record(2, 1, 32, [0, 31], b"wxyz"))


def safetensors():
    def file(entries, metadata=None, pad=True):
        header, data = {}, b""
        if metadata is not None:
            header["__metadata__"] = metadata
        for name, dtype, shape, raw in entries:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        text = json.dumps(header, separators=(",", ":")).encode()
        if pad:
            text += b" " * ((8 - len(text) % 8) % 8)
        return struct.pack("<Q", len(text)) + text + data

    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.0)
    write("safetensors_header", "two_tensors",
          file([("a", "F32", [2, 2], f32), ("b", "BF16", [3], b"\x80\x3f" * 3)], {"format": "pt"}))
    write("safetensors_header", "scalar_and_empty",
          file([("s", "I64", [], struct.pack("<q", 7)), ("e", "F16", [0, 4], b"")]))
    write("safetensors_header", "gap", file([("a", "F32", [2, 2], f32)]) + b"\x00")
    write("safetensors_header", "no_tensors", file([], {"k": "v"}))


def metas():
    meta = {"version": 12, "optimizer_steps": 12, "crc32c": 3735928559,
            "config": "--objective=asympo_stable\n--lr=0.0001\n",
            "batch_ids": ["rollout-0/00ab/0", "vllm \"3\"/\u00e9/17", ""]}
    write("checkpoint_meta", "learner", json.dumps(meta, indent=2) + "\n")
    write("checkpoint_meta", "minimal", '{"version":0,"optimizer_steps":0,"crc32c":0}')
    write("checkpoint_meta", "bad_ids", '{"version":1,"optimizer_steps":1,"crc32c":1,"batch_ids":[1]}')
    write("checkpoint_meta", "batches", json.dumps(
        {"version": 3, "optimizer_steps": 3, "crc32c": 7, "batches": [
            {"id": "a/1", "digest": "ab" * 32, "groups": 4, "trained": [0, 2]},
            {"id": "b/2", "digest": "", "groups": 1, "trained": [0]}]}))
    write("checkpoint_meta", "bad_batches", '{"version":1,"optimizer_steps":1,"crc32c":1,'
          '"batches":[{"id":"x","groups":2,"trained":[1,0]}]}')


def math_answers():
    cases = [("The answer is \\boxed{\\frac{1}{2}}.", "0.5"), ("so x = -3/4", "-0.75"),
             ("$\\boxed 12$.", "12"), ("pay 1,234,567 dollars", "1234567"),
             ("\\boxed{\\dfrac{\\sqrt3}2}", "\\frac{\\sqrt{3}}{2}"), ("30^\\circ", "30"),
             ("\\boxed{5\\text{ cm}}", "5"), ("\\boxed{3} and later \\boxed{4", "4"),
             ("123456789012345678901234567890123456789/3", "41152263004115226300411522630041152263")]
    for i, (response, reference) in enumerate(cases):
        write("math_verifier", "%02d" % i, response + "\0" + reference)


def main():
    rollout_pb2, wb = load_protos()
    batches(rollout_pb2)
    manifests(wb)
    chunks(wb)
    deltas()
    safetensors()
    metas()
    math_answers()
    tiny = os.path.join(ROOT, "tests", "common", "tokenizer", "reference", "tiny_tokenizer.json")
    with open(tiny, "rb") as f:
        write("tokenizer_json", "tiny_tokenizer.json", f.read())


if __name__ == "__main__":
    main()
