"""WeightSubscriber: the learner's policy weights, verified, with Hugging
Face names.

    sub = WeightSubscriber("learner:50051", receiver_id="vllm-0")
    for snap in sub.snapshots():          # blocks; one verified snapshot per new version
        engine.load_weights(snap.tensors())   # (name, tensor) pairs, HF names
        sub.report(snap.version)              # what the engine now samples with

It follows the WeightBroadcast protocol (docs/protocol.md) as the C++
receiver does: Register (with the model signature the learner's
GetStatus reports, unless one is given), Subscribe, FetchSnapshot over gRPC
chunks, a CRC-32C check of every bucket, ReportVersion. When the learner
goes away it registers again with backoff. A version number names weights
only within one learner process (its incarnation, SnapshotManifest.
incarnation): an announcement of another incarnation is fetched whatever
its number (a learner restarted from an older checkpoint, or one that
trained a different version of the same number), unless it is the same
bytes (every bucket's size and CRC-32C) under the same number; within one
incarnation only newer versions are. A corrupt or incomplete transfer is
reported to the learner and skipped: the caller keeps its weights and gets
the next version. With deltas (the default, when numpy is importable) the
newest snapshot yielded is kept as the base of the next fetch, which then
carries only what changed when the learner holds a delta from it; the
version is rebuilt, checked against the same CRCs, and fetched whole when
that fails (counted in delta_fallbacks).

Tensors come as torch tensors when torch is importable, numpy arrays
otherwise (bfloat16 becomes float32 with numpy, which has no bfloat16)."""
import json
import logging
import os
import random
import shutil
import time

import grpc

from ._stubs import learner_pb2, learner_pb2_grpc, weight_broadcast_pb2 as wb, weight_broadcast_pb2_grpc
from . import delta
from .crc32c import crc32c
from .errors import RefusedError, WeightsError
from .snapshot_fetch import DeltaError, delta_base, fetch_buckets  # noqa: F401 (DeltaError: the package's)

log = logging.getLogger("asympo_rl.weights")


# asympo.v1.DType -> (safetensors name, bytes per element)
DTYPES = {wb.DTYPE_F32: ("F32", 4), wb.DTYPE_BF16: ("BF16", 2), wb.DTYPE_F16: ("F16", 2)}
_DTYPE_BY_NAME = {"float32": wb.DTYPE_F32, "bfloat16": wb.DTYPE_BF16, "float16": wb.DTYPE_F16,
                  "F32": wb.DTYPE_F32, "BF16": wb.DTYPE_BF16, "F16": wb.DTYPE_F16}


def model_signature(tensors):
    """The signature the learner checks at Register: tensors is a sequence
    of (name, dtype, shape) in the model's parameter order, dtype one of
    "float32", "bfloat16", "float16" (or an asympo.v1 DType)."""
    crc, n = 0, 0
    for name, dtype, shape in tensors:
        code = _DTYPE_BY_NAME.get(dtype, dtype)
        line = "%s:%d:%s\n" % (name, int(code), "".join("%d," % d for d in shape))
        crc = crc32c(line.encode(), crc)
        n += 1
    return "%d-%08x" % (n, crc)


def _backend(name):
    if name in ("torch", None):
        try:
            import torch
            return "torch", torch
        except ImportError:
            if name == "torch":
                raise
    import numpy
    return "numpy", numpy


class Snapshot:
    """One verified version: its manifest and its buckets' bytes."""

    def __init__(self, manifest, buckets, from_delta=False):
        self.manifest, self.buckets = manifest, buckets
        self.from_delta = from_delta  # rebuilt from a delta against the version held
        # WeightSubscriber.snapshots(): seconds from its announcement to the
        # verified snapshot (the fetch and its checks, a delta's rebuild).
        self.fetch_seconds = None

    @property
    def version(self):
        return self.manifest.version

    @property
    def incarnation(self):
        """The learner process that made it (LearnerStatus.incarnation)."""
        return self.manifest.incarnation

    def names(self):
        return [t.name for t in self.manifest.tensors]

    def tensors(self, backend=None):
        """Yields (Hugging Face name, tensor) in the manifest's order, each
        with its shape and dtype. backend: "torch", "numpy" or None (torch
        when importable). The tensors are copies, safe to keep."""
        kind, lib = _backend(backend)
        for t in self.manifest.tensors:
            raw = memoryview(self.buckets[t.bucket])[t.offset:t.offset + t.size_bytes]
            shape = tuple(t.shape)
            if kind == "torch":
                dt = {wb.DTYPE_F32: lib.float32, wb.DTYPE_BF16: lib.bfloat16,
                      wb.DTYPE_F16: lib.float16}[t.dtype]
                out = lib.frombuffer(bytearray(raw), dtype=dt) if t.size_bytes else lib.empty(0, dtype=dt)
                yield t.name, out.reshape(shape)
            else:
                if t.dtype == wb.DTYPE_BF16:
                    u16 = lib.frombuffer(raw, dtype="<u2").astype(lib.uint32) << 16
                    yield t.name, u16.view(lib.float32).reshape(shape)
                else:
                    dt = "<f4" if t.dtype == wb.DTYPE_F32 else "<f2"
                    yield t.name, lib.frombuffer(raw, dtype=dt).copy().reshape(shape)

    def state_dict(self, backend=None):
        return dict(self.tensors(backend))


def check_manifest(m):
    """Raises WeightsError unless every tensor lies inside its bucket with
    the size its shape and dtype give."""
    sizes = {}
    for b in m.buckets:
        if b.index in sizes or b.index != len(sizes):
            raise WeightsError("version %d: bucket indices are not 0..%d in order" % (m.version,
                                                                                    len(m.buckets) - 1))
        sizes[b.index] = b.size_bytes
    if sum(sizes.values()) != m.total_bytes:
        raise WeightsError("version %d: buckets sum to %d bytes, total_bytes says %d"
                           % (m.version, sum(sizes.values()), m.total_bytes))
    for t in m.tensors:
        if t.dtype not in DTYPES:
            raise WeightsError("version %d: tensor %s has unknown dtype %d" % (m.version, t.name, t.dtype))
        n = 1
        for d in t.shape:
            if d < 0:
                raise WeightsError("version %d: tensor %s has a negative dimension" % (m.version, t.name))
            n *= d
        if n * DTYPES[t.dtype][1] != t.size_bytes:
            raise WeightsError("version %d: tensor %s: shape %s of %s is not %d bytes"
                               % (m.version, t.name, list(t.shape), DTYPES[t.dtype][0], t.size_bytes))
        if t.bucket not in sizes or t.offset + t.size_bytes > sizes[t.bucket]:
            raise WeightsError("version %d: tensor %s lies outside bucket %d" % (m.version, t.name,
                                                                                t.bucket))


class WeightSubscriber:
    """A receiver of the learner's snapshots over gRPC."""

    def __init__(self, target, receiver_id, model_signature=None, credentials=None, current_version=None,
                 max_chunk_bytes=0, fetch_timeout=600.0, min_backoff=0.1, max_backoff=5.0,
                 channel=None, deltas=True):
        """receiver_id: a stable name (at most 128 bytes), for the learner's
        metrics. model_signature: the engine model's signature
        (model_signature()); None takes the learner's own from GetStatus.
        current_version: the version the engine holds already (None: none,
        so the learner's current one is fetched first). deltas: keep the
        newest snapshot yielded as the base of the next fetch, which then
        carries only what changed (docs/protocol.md, "Delta versions"; needs
        numpy; one more snapshot of memory)."""
        if len(receiver_id.encode()) > 128:
            raise ValueError("receiver_id is %d bytes, more than 128" % len(receiver_id.encode()))
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if channel is None:
            channel = (grpc.secure_channel(target, credentials, options) if credentials is not None
                       else grpc.insecure_channel(target, options))
        self._channel = channel
        self._stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(channel)
        self._learner = learner_pb2_grpc.LearnerStub(channel)
        self.target, self.receiver_id, self.signature = target, receiver_id, model_signature
        self.version, self.max_chunk_bytes = current_version, max_chunk_bytes
        self.incarnation = ""  # of self.version: the learner process that made it
        self._held = None      # (version, incarnation, buckets) of the newest fetched
        self.fetch_timeout, self.min_backoff, self.max_backoff = fetch_timeout, min_backoff, max_backoff
        self.session = None
        self.failures = 0  # transfers that failed verification or broke off
        self.deltas = deltas and delta.available()
        self._base = None          # the newest Snapshot yielded, for deltas
        self.delta_versions = 0    # versions rebuilt from a delta
        self.delta_fallbacks = 0   # deltas that failed, fetched whole instead

    def close(self):
        self._channel.close()

    def register(self, timeout=30.0):
        """Registers (once the learner is reachable) and returns its
        RegisterResponse. RefusedError when the signatures differ."""
        signature = self.signature
        if signature is None:
            status = self._learner.GetStatus(learner_pb2.GetStatusRequest(), timeout=timeout,
                                             wait_for_ready=True)
            signature = status.model_signature
        try:
            r = self._stub.Register(wb.RegisterRequest(
                receiver_id=self.receiver_id, transports=[wb.TRANSPORT_GRPC], model_signature=signature,
                current_version=self.version or 0, current_incarnation=self.incarnation),
                timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise RefusedError("Register: " + e.details(), e.code()) from None
            raise
        self.session = r.session_id
        return r

    def fetch(self, manifest, base=None):
        """Fetches and verifies one announced snapshot, as a delta against
        `base` (a Snapshot held) when the manifest's delta is from it.
        WeightsError for a bad transfer (DeltaError when a delta did not
        rebuild the version: fetch it whole); grpc.RpcError NOT_FOUND when a
        newer one replaced it (or the learner restarted: its incarnation's
        is gone)."""
        check_manifest(manifest)
        base = delta_base(manifest, base) if self.deltas else None
        buckets, rebuilt = fetch_buckets(self._stub, self.session, manifest, base,
                                         self.max_chunk_bytes, self.fetch_timeout)
        return Snapshot(manifest, buckets, from_delta=rebuilt)

    def report(self, version, error=""):
        """Tells the learner which version the engine samples with now (the
        newest snapshot yielded, when it has that version)."""
        if not error:
            if self._held is not None and self._held[0] == version:
                self.incarnation = self._held[1]
            self.version = version
        try:
            held = (self.version or 0) if error else version  # a failure keeps what it had
            self._stub.ReportVersion(wb.ReportVersionRequest(
                session_id=self.session or "", version=held, error=error,
                incarnation=self.incarnation), timeout=10)
        except grpc.RpcError:
            pass  # informational; the next registration reports again

    def snapshots(self, stop=None):
        """Yields every new verified Snapshot, registering again whenever the
        learner goes away, until `stop()` (optional) returns True between
        events. The caller reports what it loaded with report()."""
        backoff = self.min_backoff
        while not (stop and stop()):
            try:
                self.register()
                backoff = self.min_backoff
                first = True
                for ann in self._stub.Subscribe(wb.SubscribeRequest(session_id=self.session,
                                                                     after_version=0)):
                    m = ann.manifest
                    follow = self._wanted(m, first)
                    first = False
                    if follow:
                        started = time.monotonic()
                        snap = self._try_fetch(m)
                        if snap is not None:
                            snap.fetch_seconds = time.monotonic() - started
                            self._held = (m.version, m.incarnation, _buckets_of(m))
                            if self.deltas:
                                self._base = snap
                            yield snap
                            # Not held here while the next one is fetched: the
                            # caller decides how long the old one lives.
                            del snap
                    if stop and stop():
                        return
            except grpc.RpcError as e:
                # Another model, or credentials the learner refuses: no
                # retry can pass (the rest are outages: register again).
                if e.code() in (grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED):
                    raise RefusedError("Register: " + e.details(), e.code()) from None
            except RefusedError:
                raise
            time.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(backoff * 2, self.max_backoff)

    def _wanted(self, m, first):
        """Whether announcement `m` is worth fetching, given what is held."""
        held = self._held or (None if self.version is None else (self.version, self.incarnation, None))
        if held is None:
            return True
        version, incarnation, buckets = held
        if m.incarnation != incarnation:
            if m.version == version and buckets == _buckets_of(m):
                # The same bytes from a restarted learner: nothing to fetch,
                # but it now holds this incarnation's version.
                self._held = (version, m.incarnation, buckets)
                if self.version == version:
                    self.report(version)
                return False
            return True
        # Same incarnation (or a learner without incarnations): forwards
        # only, but the first announcement of a registration even backwards.
        return m.version != version if first else m.version > version

    def _fetch_or_whole(self, manifest):
        """A delta when it rebuilds the version, else the whole version."""
        try:
            snap = self.fetch(manifest, self._base)
        except DeltaError as e:
            self.delta_fallbacks += 1
            log.warning("%s; fetching it whole", e)
            return self.fetch(manifest)
        if snap.from_delta:
            self.delta_versions += 1
        return snap

    def _try_fetch(self, manifest):
        try:
            return self._fetch_or_whole(manifest)
        except WeightsError as e:
            self.failures += 1
            self.report(self.version or 0, str(e))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: a newer one replaced it
                self.failures += 1
                raise
        return None


def _buckets_of(manifest):
    return [(b.size_bytes, b.crc32c) for b in manifest.buckets]


def safetensors_chunks(snapshot, prefix=""):
    """The snapshot as a safetensors file's byte chunks (header length,
    header, each tensor's bytes as the snapshot holds them), every tensor
    named `prefix` + its name."""
    header, pieces, offset = {}, [], 0
    for t in snapshot.manifest.tensors:
        header[prefix + t.name] = {"dtype": DTYPES[t.dtype][0], "shape": list(t.shape),
                                   "data_offsets": [offset, offset + t.size_bytes]}
        pieces.append(memoryview(snapshot.buckets[t.bucket])[t.offset:t.offset + t.size_bytes])
        offset += t.size_bytes
    header["__metadata__"] = {"format": "pt", "asympo_version": str(snapshot.version)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little"), text] + pieces


def _write_synced(path, chunks):
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())


def write_version_directory(version, path, files, keep, writer):
    """Writes `files` (name -> a list of byte chunks, or a path to copy)
    into <path>.v<version>/, fsynced, then publish_version_directory: the
    common part of write_hf_directory and lora.write_peft_directory
    (`writer`, named when `path` exists and is not their link)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.islink(path):
        raise ValueError("%s exists and is not a link written by %s" % (path, writer))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    final = "%s.v%d" % (path, version)
    tmp = "%s.tmp-%d" % (final, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name, data in files.items():
        if isinstance(data, list):
            _write_synced(os.path.join(tmp, name), data)
        else:
            shutil.copyfile(data, os.path.join(tmp, name))
    return publish_version_directory(tmp, final, path, keep)


def write_hf_directory(snapshot, path, config, extra_files=None, keep=2):
    """Writes `snapshot` as a Hugging Face model directory and points `path`
    at it atomically: the files go to <path>.v<version>/ (model.safetensors,
    config.json from the dict `config`, and `extra_files`, a dict of name ->
    bytes or a path to copy, for the tokenizer files), are fsynced, then the
    symbolic link `path` is replaced in one rename. An engine that reloads
    from `path` never sees a half-written model. The newest `keep`
    versions are kept. Returns the version directory."""
    files = {"model.safetensors": safetensors_chunks(snapshot),
             "config.json": [json.dumps(config, indent=2).encode() + b"\n"]}
    for name, data in (extra_files or {}).items():
        files[name] = [data] if isinstance(data, (bytes, bytearray)) else data
    return write_version_directory(snapshot.version, path, files, keep, "write_hf_directory")


def publish_version_directory(tmp, final, path, keep):
    """Renames the written directory `tmp` to `final` (<path>.v<version>),
    points the symbolic link `path` at it in one rename, fsyncs the parent
    and removes all but the newest `keep` versions (write_version_directory's
    last step). Returns `final`."""
    parent = os.path.dirname(path)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    link = "%s.link-%d" % (path, os.getpid())
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.basename(final), link)
    os.replace(link, path)
    fd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    prefix = os.path.basename(path) + ".v"
    versions = sorted((int(n[len(prefix):]), n) for n in os.listdir(parent)
                      if n.startswith(prefix) and n[len(prefix):].isdigit())
    for _, n in versions[:-keep] if keep > 0 else []:
        if os.path.join(parent, n) != final:
            shutil.rmtree(os.path.join(parent, n), ignore_errors=True)
    return final
