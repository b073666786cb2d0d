"""Reads a learner checkpoint directory (either layout) into whole numpy
arrays, independently of the C++ reader, for the integration tests:

    state = read_state(ckpt_dir)   # {"weight": {name: array}, "exp_avg": ..., "exp_avg_sq": ...}

The sharded layout: manifest.json names every file's pieces (a run of
elements [begin, end) of one parameter's flattened weight or moment); the
older layout: one state.safetensors. Every block CRC is not checked here
(the C++ reader does); the pieces must cover every parameter exactly."""
import json
import os
import struct

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "U8": np.uint8}


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def read_tensor(path, header, start, key):
    info = header[key]
    begin, end = info["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        return np.frombuffer(f.read(end - begin), dtype=DTYPES[info["dtype"]])


def read_state(ckpt):
    manifest_path = os.path.join(ckpt, "manifest.json")
    if not os.path.exists(manifest_path):
        return read_old(ckpt)
    with open(manifest_path) as f:
        m = json.load(f)
    state = {"weight": {}, "exp_avg": {}, "exp_avg_sq": {}}
    sizes = {p["name"]: int(np.prod(p["shape"])) if p["shape"] else 1 for p in m["params"]}
    filled = {}
    for entry in m["files"]:
        path = os.path.join(ckpt, entry["file"])
        header, start = safetensors_header(path)
        for piece in entry["pieces"]:
            kind, name = piece["kind"], piece["param"]
            whole = state[kind].setdefault(name, np.full(sizes[name], np.nan, dtype=np.float32))
            whole[piece["begin"]:piece["end"]] = read_tensor(path, header, start, piece["key"])
            filled[(kind, name)] = filled.get((kind, name), 0) + piece["end"] - piece["begin"]
    for p in m["params"]:
        kinds = ["weight"] + (["exp_avg", "exp_avg_sq"] if p["moments"] else [])
        for kind in kinds:
            assert filled.get((kind, p["name"])) == sizes[p["name"]], (ckpt, kind, p["name"])
    return state


def read_old(ckpt):
    path = os.path.join(ckpt, "state.safetensors")
    header, start = safetensors_header(path)
    names = [k for k in header if k != "__metadata__" and not k.startswith("__")]
    state = {"weight": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for k in names:
        state["weight"][k] = read_tensor(path, header, start, k).copy()
    return state


def equal_states(a, b):
    """The first difference between two states, or None when bit-equal."""
    for kind in ("weight", "exp_avg", "exp_avg_sq"):
        if sorted(a[kind]) != sorted(b[kind]):
            return "%s: parameters %s against %s" % (kind, sorted(a[kind])[:3], sorted(b[kind])[:3])
        for name in a[kind]:
            if not np.array_equal(a[kind][name].view(np.uint32), b[kind][name].view(np.uint32)):
                return "%s of %s differs" % (kind, name)
    return None
