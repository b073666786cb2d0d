"""WeightGroupReceiver: the learner's weights over a collective group
(torch.distributed, Gloo or NCCL), bucket by bucket, for engine workers.

    with WeightGroupReceiver("learner:50051", worker_id="vllm-0-tp0") as rx:
        for update in rx.updates():              # blocks; one per new version
            for name, tensor in update:          # as each bucket arrives
                model.load_weights([(name, tensor)])
            # update.version is now held: the next Next reports it

It follows the WeightGroup protocol (proto/asympo/v1/weight_group.proto,
docs/protocol.md "Weight group"): Join until a generation is formed; build
a c10d process group (ProcessGroupGloo or ProcessGroupNCCL) whose store is
the learner's, reached through the Store RPC (GroupStore); then Next, and
on RECEIVE take part in one broadcast (root: the learner, rank 0) of each
bucket of the manifest, in index order, each a 1-D uint8 tensor of the
bucket's size (none for an empty bucket). Every member takes part in
every broadcast of its generation, so a version the receiver holds
already is received and dropped, and an update the caller stops
iterating is received to its end (drained) before the next Next.

Each bucket lands in a buffer of its own on `device`; the receiver keeps
no bucket once its tensors are handed out (they are views of it), so it
holds at most one bucket at a time and never the whole model twice. A
bucket's CRC-32C is checked before its tensors are yielded. When a
bucket's CRC does not match, or the collective fails, the rest of that
version comes over gRPC (WeightBroadcast.FetchSnapshot, each bucket
checked), the broadcasts still being received while the group stands;
the next Next reports a CRC mismatch (received_ok false), and a failed
group is left and joined again. A version the learner no longer holds
when that fetch starts (NOT_FOUND: a newer one replaced it, or the
learner restarted) is skipped: iterating its update raises WeightsError,
and the engine, holding part of it, gets the next version whole.

With deltas=True (and numpy importable) the
receiver keeps the version the engine holds, bucket by bucket in host
memory, and asks for deltas (GroupNextRequest.accepts_delta): when every
member holds the version the learner's latest is a delta from, the group
broadcasts only what changed, and each bucket is rebuilt from the copy
and checked against its CRC-32C before its tensors are yielded; one that
does not rebuild comes over gRPC whole (fallbacks), like a bucket whose
CRC does not match. That costs a copy of the model in host memory per
worker (and with NCCL a copy to the host of each bucket received), and
the rebuild runs in numpy: off by default, as on loopback it costs more
time than the bytes it saves (docs/benchmarks.md, "Delta versions over the
weight group").

Gloo does not see a learner that dies in the middle of a bucket (its
receivers wait for the whole collective timeout): a Gloo member waits in
slices of probe_s and asks the learner between them whether its
generation stands, and gives the collective up when the learner ended it
(a restart) or has not answered for unreachable_s (no fallback fetch
then: there is no one to fetch from). asympo_rl.group_collective.

With NCCL, a collective that times out is in the hands of PyTorch's NCCL
watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING), which may end the process
rather than raise; a worker started again joins again.

Not thread-safe: one thread drives a receiver. Torch is required."""
import datetime
import random
import time
import traceback

import grpc
import torch
import torch.distributed as dist

from ._stubs import learner_pb2, learner_pb2_grpc, weight_broadcast_pb2 as wb, weight_broadcast_pb2_grpc
from . import delta
from .crc32c import crc32c
from .errors import RefusedError, WeightsError
from .weights import WeightSubscriber, check_manifest

try:
    from .v1 import weight_group_pb2 as wg, weight_group_pb2_grpc
except ImportError as e:  # pragma: no cover
    raise ImportError("asympo_rl's WeightGroup stubs are missing (%s): install the package again "
                      "from the repository's proto/python" % e) from e
from .group_collective import LearnerGone, Watch, drop_ended, give_up  # noqa: E402
from .group_store import _RPC_GRACE_S, GroupStore, GroupStoreError  # noqa: E402
from .weight_update import WeightUpdate, _GroupFailed  # noqa: E402

__all__ = ["WeightGroupReceiver", "WeightUpdate", "GroupStore", "GroupStoreError", "bucket_crc32c"]

_MAX_POLL_MS = 60000         # Join and Next's
# Join's codes that no retry can pass: another model or backend, credentials
# the learner refuses, a learner without --weight_group, a bad worker_id or
# one bound to another principal, another process joining under the same
# worker_id (ABORTED, once _MAX_REPLACED takeovers in a row were retried).
_FINAL = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED,
          grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED,
          grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED)
# The learner marks a Join that a newer Join under the same worker_id took
# the place of (a retry of this worker's own, or a restarted worker): ABORTED
# with this trailing metadata. Retried, at most _MAX_REPLACED times in a row:
# beyond that, two live processes share the worker_id.
_ABORT_REASON_KEY, _JOIN_REPLACED = "asympo-abort-reason", "join_replaced"
_MAX_REPLACED = 3


def _join_replaced(e):
    """Whether RpcError `e` is a Join that a newer one replaced."""
    if e.code() != grpc.StatusCode.ABORTED:
        return False
    metadata = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return any(k == _ABORT_REASON_KEY and v == _JOIN_REPLACED for k, v in (metadata or ()))


class WeightGroupReceiver:
    """A member of the learner's weight group (see the module's docstring)."""

    def __init__(self, target, worker_id, backend="gloo", device="cpu", model_signature=None,
                 credentials=None, channel=None, gloo_address="127.0.0.1", held_version=0,
                 held_incarnation="", verify=True, join_wait_ms=10000, next_wait_ms=10000,
                 fetch_timeout=600.0, min_backoff=0.1, max_backoff=5.0, probe_s=1.0, unreachable_s=10.0,
                 deltas=None):
        """target: the learner's "host:port". worker_id: a stable name (at
        most 128 bytes), bound to this worker's principal from its first
        Join (another principal's is refused: RefusedError); joining again
        under it replaces the earlier member (a restarted worker).
        backend: "gloo" (tensors on the CPU) or "nccl" (device a CUDA
        device). model_signature: the engine model's
        (asympo_rl.model_signature); the learner refuses to let another
        model join (RefusedError); None: the learner's own, from GetStatus
        (which needs the role status). credentials: a
        grpc.ChannelCredentials (None: plaintext), or channel: a ready
        grpc.Channel. gloo_address: the address this worker's Gloo
        transport binds to and the others reach it at (loopback by
        default; the host's address for a multi-host group). held_version,
        held_incarnation: what the engine holds already (0 and "": nothing).
        verify: check the CRC-32C of buckets received on a GPU too (a copy
        to the host per bucket); buckets on the CPU are always checked.
        join_wait_ms, next_wait_ms: the long polls' length. probe_s,
        unreachable_s (Gloo): a collective that lasts over probe_s asks the
        learner every probe_s whether the generation stands, and is given
        up when the learner ended it or has not answered for unreachable_s
        (asympo_rl.group_collective says why). deltas: keep the held
        version's buckets in host memory and receive versions as their
        deltas when the group can (None: off; see the module's docstring)."""
        if backend not in ("gloo", "nccl"):
            raise ValueError("backend %r: gloo or nccl" % (backend,))
        if len(worker_id.encode()) > 128:
            raise ValueError("worker_id is %d bytes, more than 128" % len(worker_id.encode()))
        self.device = torch.device(device)
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("backend nccl needs a CUDA device, not %s" % self.device)
        if backend == "gloo":
            try:
                dist.ProcessGroupGloo.create_device(hostname=gloo_address)
            except RuntimeError as e:
                raise ValueError("gloo_address %r: %s" % (gloo_address, e)) from None
        self._own_channel = channel is None
        if channel is None:
            options = [("grpc.max_receive_message_length", 64 << 20),
                       ("grpc.max_send_message_length", 64 << 20)]
            channel = (grpc.secure_channel(target, credentials, options) if credentials is not None
                       else grpc.insecure_channel(target, options))
        self._channel = channel
        self._stub = weight_group_pb2_grpc.WeightGroupStub(channel)
        self._broadcast_stub = weight_broadcast_pb2_grpc.WeightBroadcastStub(channel)
        self.target, self.worker_id, self.backend = target, worker_id, backend
        self.signature, self.gloo_address, self.verify = model_signature, gloo_address, verify
        self.join_wait_ms = max(1, min(int(join_wait_ms), _MAX_POLL_MS))
        self.next_wait_ms = max(1, min(int(next_wait_ms), _MAX_POLL_MS))
        self.fetch_timeout, self.min_backoff, self.max_backoff = fetch_timeout, min_backoff, max_backoff
        self.probe_s, self.unreachable_s = probe_s, unreachable_s
        self.deltas = bool(deltas) and delta.available()
        self._base = None           # with deltas: the held version's buckets, on the host
        self._watch = None          # Gloo: waits for the collectives, asking the learner
        self.version, self.incarnation = held_version, held_incarnation
        self._holds = bool(held_version or held_incarnation)
        self._held_buckets = None   # (size, crc) of each bucket of the held version, when known
        self._report = None   # (received_version, received_ok) for the next Next, if any
        self._pg = self._store = self._token = None
        self.generation = self.rank = self.world_size = None
        self._current = None        # the WeightUpdate handed out last
        self._subscriber = None     # for the gRPC fallback
        self._backoff = min_backoff
        self._replaced = 0   # Joins in a row that a newer one under worker_id replaced
        # Counters: generations joined, versions that came broken over the
        # group (a CRC or the collective), versions completed over gRPC.
        self.joins = self.failures = self.fallbacks = 0
        self.delta_versions = 0     # versions rebuilt from their deltas
        # Collectives given up on because the learner had gone (probe_s).
        self.gave_up = 0

    def close(self):
        """Ends the current update (draining it), leaves the group and
        closes the channel it made."""
        if self._current is not None:
            self._current._finish()
        self._leave()
        # The held copy's buffers go now, while torch is whole: freed only
        # at the interpreter's exit, they may outlive what they need.
        self._base = None
        if self._own_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def holds(self):
        """Whether the engine holds a version (then `version`, `incarnation`)."""
        return self._holds

    def forget(self):
        """Forgets the version the engine holds: the next update is the
        group's latest, whatever its number."""
        self.version, self.incarnation, self._holds, self._held_buckets = 0, "", False, None
        self._base = None

    def updates(self, stop=None):
        """Yields a WeightUpdate per version to load, until stop() (optional)
        returns True between long polls. Each is ended (drained) when the
        next is asked for."""
        while True:
            update = self.next_update(stop=stop)
            if update is None:
                return
            yield update

    def next_update(self, timeout=None, stop=None):
        """The next WeightUpdate to load, or None after `timeout` seconds
        (None: no limit) or once stop() returns True. Ends the previous
        update first. RefusedError when the learner refuses this worker."""
        if self._current is not None:
            self._current._finish()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (stop and stop()):
            left = None if deadline is None else int((deadline - time.monotonic()) * 1000)
            if left is not None and left <= 0:
                return None
            if self._pg is None:
                self._join(left)
                continue
            manifest = self._ask(left)
            if manifest is None:
                continue
            update = self._accept(manifest)
            if update is not None:
                self._current = update
                return update
        return None

    # --- membership --------------------------------------------------------

    def _pause(self):
        time.sleep(random.uniform(self._backoff / 2, self._backoff))
        self._backoff = min(self._backoff * 2, self.max_backoff)

    def _refused(self, call, e):
        if e.code() in _FINAL:
            raise RefusedError("WeightGroup.%s (worker %s): %s" % (call, self.worker_id, e.details()),
                               e.code()) from None

    def _join(self, left_ms):
        """One Join long poll; on formed, builds the process group. Errors
        other than refusals back off and return (the caller asks again)."""
        wait = self.join_wait_ms if left_ms is None else max(1, min(self.join_wait_ms, left_ms))
        try:
            if not self.signature:
                # The learner refuses an empty signature: take its own.
                self.signature = learner_pb2_grpc.LearnerStub(self._channel).GetStatus(
                    learner_pb2.GetStatusRequest(), timeout=_RPC_GRACE_S, wait_for_ready=True).model_signature
            r = self._stub.Join(wg.JoinGroupRequest(worker_id=self.worker_id, model_signature=self.signature,
                                                    backend=self.backend, wait_ms=wait),
                                timeout=wait / 1000.0 + _RPC_GRACE_S, wait_for_ready=True)
        except grpc.RpcError as e:
            if _join_replaced(e) and self._replaced < _MAX_REPLACED:
                self._replaced += 1
                self._pause()
                return
            self._refused("Join", e)
            self._pause()
            return
        self._replaced = 0
        if not r.formed:
            return
        store = GroupStore(self._channel, r.member_token, datetime.timedelta(milliseconds=r.timeout_ms or 60000))
        try:
            self._pg = self._new_group(store, r)
        except RuntimeError:
            # The generation did not come together (a member missing, the
            # learner ended it): join the next one.
            self._pause()
            return
        self._store, self._token = store, r.member_token
        if self.backend == "gloo":
            self._watch = Watch(self._stub, r.member_token, self.probe_s, self.unreachable_s)
        self.generation, self.rank, self.world_size = r.generation, r.rank, r.world_size
        self.joins += 1
        self._backoff = self.min_backoff

    def _new_group(self, store, r):
        timeout = datetime.timedelta(milliseconds=r.timeout_ms or 60000)
        if self.backend == "gloo":
            opts = dist.ProcessGroupGloo._Options()
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=self.gloo_address)]
            opts._timeout = timeout
            return dist.ProcessGroupGloo(store, r.rank, r.world_size, opts)
        torch.cuda.set_device(self.device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, r.rank, r.world_size, opts)

    def _leave(self):
        """Drops the process group (its connections close) and the token."""
        self._pg = self._store = self._token = self._watch = None
        drop_ended()

    def _ask(self, left_ms):
        """One Next long poll: the manifest to receive, or None (WAIT, or
        REJOIN / a failed call, after which the group is left)."""
        wait = self.next_wait_ms if left_ms is None else max(1, min(self.next_wait_ms, left_ms))
        version, ok = self._report or (0, False)
        try:
            r = self._stub.Next(wg.GroupNextRequest(
                member_token=self._token, held_version=self.version, held_incarnation=self.incarnation,
                received=self._report is not None, received_version=version, received_ok=ok,
                wait_ms=wait, accepts_delta=self._base is not None), timeout=wait / 1000.0 + _RPC_GRACE_S)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                self._refused("Next", e)
            # An outage, a learner shutting down: join again.
            self._leave()
            self._pause()
            return None
        self._report = None  # each outcome is reported once
        self._backoff = self.min_backoff
        if r.action == wg.GroupNextResponse.ACTION_REJOIN:
            self._leave()
            return None
        if r.action == wg.GroupNextResponse.ACTION_RECEIVE:
            return r
        return None

    # --- versions ----------------------------------------------------------

    def _accept(self, r):
        """A WeightUpdate for RECEIVE answer `r` when the engine wants its
        version; else receives its broadcasts, drops them and returns None."""
        m = r.manifest
        if r.delta and (len(r.delta_bucket_bytes) != len(m.buckets) or any(
                d > delta.most_bytes(b.size_bytes) for d, b in zip(r.delta_bucket_bytes, m.buckets))):
            # No believable size for every broadcast: this member cannot take part.
            self._leave()
            return None
        update = WeightUpdate(self, m, r.delta_bucket_bytes if r.delta else None)
        try:
            check_manifest(m)
            if self.signature and m.model_signature != self.signature:
                raise WeightsError("version %d is of model %s, not %s" % (m.version, m.model_signature,
                                                                          self.signature))
        except WeightsError as e:
            update.error, update.ok = str(e), False
        else:
            if self._wanted(m):
                return update
        update._finish()
        return None

    def _wanted(self, m):
        if not self._holds:
            return True
        if m.incarnation != self.incarnation:
            if m.version == self.version and self._held_buckets == _buckets_of(m):
                # The same bytes from a restarted learner: hold them under
                # its incarnation, nothing to load.
                self.incarnation = m.incarnation
                return False
            return True
        return m.version > self.version

    def _settle(self, update):
        """Records an ended update: what the next Next reports, and what
        the engine holds when the update was iterated to its end."""
        m = update.manifest
        # received_ok speaks of the CRCs (the learner counts a false one as
        # receiver_crc); a failed collective it has seen itself.
        if update.crc_failed or not update.group_failed:
            self._report = (m.version, not update.crc_failed)
        if self._current is update:
            self._current = None
        if not update.ok:
            self.failures += 1
        if update.complete:
            if update.fetched:
                self.fallbacks += 1
            elif update.from_delta:
                self.delta_versions += 1
            self.version, self.incarnation, self._holds = m.version, m.incarnation, True
            self._held_buckets = _buckets_of(m)
            kept = update.kept
            self._base = kept if kept is not None and all(b is not None for b in kept) else None

    def _broadcast(self, size):
        """Receives one bucket's broadcast into a new buffer on the device;
        _GroupFailed (having left the group) when the collective fails. An
        empty bucket has no broadcast (every rank skips it)."""
        if self._pg is None:
            raise _GroupFailed("not in a group")
        buf = torch.empty(size, dtype=torch.uint8, device=self.device)
        if size == 0:
            return buf
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        work = self._pg.broadcast([buf], opts)
        try:
            if self._watch is None:
                work.wait()
            else:
                self._watch.wait(work)
        except RuntimeError as e:
            self._leave()
            raise _GroupFailed(str(e)) from None
        except LearnerGone as e:
            # Destroying the group would wait for the collective's timeout.
            give_up(self._pg, work)
            self.gave_up += 1
            self._leave()
            raise _GroupFailed(str(e), e.unreachable) from None
        return buf

    def _base_for(self, m):
        """The held version's buckets when `m` is a delta from them."""
        if (self._base is None or m.delta_base_version != self.version or m.incarnation != self.incarnation
                or len(self._base) != len(m.buckets)
                or any(len(b) != info.size_bytes for b, info in zip(self._base, m.buckets))):
            return None
        return self._base

    def _crc_matches(self, buf, info):
        if buf.device.type != "cpu":
            if not self.verify:
                return True
            buf = buf.cpu()
        return bucket_crc32c(buf.numpy()) == info.crc32c

    def _fetch(self, m, first):
        """Yields (index, buffer) of buckets first.. of version m over gRPC
        (WeightBroadcast.FetchSnapshot), one bucket held at a time, each
        checked. WeightsError when that fails, or NOT_FOUND says a newer
        version replaced it."""
        if self._subscriber is None:
            self._subscriber = WeightSubscriber(self.target, self.worker_id, model_signature=m.model_signature,
                                                channel=self._channel, fetch_timeout=self.fetch_timeout)
        sub = self._subscriber
        sub.signature, sub.version, sub.incarnation = m.model_signature, self.version, self.incarnation
        chunks = None
        try:
            sub.register()
            chunks = self._broadcast_stub.FetchSnapshot(
                wb.FetchSnapshotRequest(session_id=sub.session, version=m.version,
                                        incarnation=m.incarnation), timeout=self.fetch_timeout)
            yield from _assemble(m, first, chunks, self.device)
        except grpc.RpcError as e:
            # The error is the call, which this frame holds: without this the
            # bucket being assembled lives until the garbage collector runs.
            traceback.clear_frames(e.__traceback__)
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise WeightsError("version %d: the learner holds it no more (%s); skipped"
                                   % (m.version, e.details())) from None
            raise WeightsError("version %d: the gRPC fetch failed: %s: %s" % (m.version, e.code().name,
                                                                              e.details())) from None
        except RefusedError as e:
            raise WeightsError("version %d: the gRPC fetch was refused: %s" % (m.version, e)) from None
        finally:
            if chunks is not None:
                chunks.cancel()  # a fetch closed early stops streaming


def bucket_crc32c(data):
    """CRC-32C of one bucket's bytes (the manifest's BucketInfo.crc32c)."""
    return crc32c(data)


def _assemble(m, first, chunks, device):
    """(index, buffer on device) of each bucket first.. from the chunks of
    a FetchSnapshot stream, each checked against the manifest; one bucket
    held at a time."""
    def done(index, buf, filled):
        info = m.buckets[index]
        if filled != info.size_bytes:
            raise WeightsError("version %d: bucket %d ended at %d of %d bytes"
                               % (m.version, index, filled, info.size_bytes))
        crc = bucket_crc32c(buf)
        if crc != info.crc32c:
            raise WeightsError("version %d: bucket %d fetched over gRPC has CRC-32C %08x, the manifest "
                               "says %08x" % (m.version, index, crc, info.crc32c))
        if not buf:
            return index, torch.empty(0, dtype=torch.uint8, device=device)
        return index, torch.frombuffer(buf, dtype=torch.uint8).to(device)

    expect, buf, filled = first, None, 0
    for c in chunks:
        if c.version != m.version or c.bucket >= len(m.buckets):
            raise WeightsError("version %d: a chunk of version %d, bucket %d does not belong"
                               % (m.version, c.version, c.bucket))
        if c.bucket < first:
            continue
        if buf is not None and c.bucket != expect:
            out, buf = done(expect, buf, filled), None
            expect += 1
            yield out
            del out
        while buf is None and expect < c.bucket:  # buckets without a chunk: empty ones
            yield done(expect, bytearray(), 0)
            expect += 1
        if c.bucket != expect:
            raise WeightsError("version %d: bucket %d came out of order" % (m.version, c.bucket))
        if buf is None:
            buf, filled = bytearray(m.buckets[expect].size_bytes), 0
        if c.offset != filled or c.offset + len(c.data) > len(buf):
            raise WeightsError("version %d: bucket %d chunk at %d is out of order or too long"
                               % (m.version, c.bucket, c.offset))
        buf[c.offset:c.offset + len(c.data)] = c.data
        filled += len(c.data)
    if buf is not None:
        out, buf = done(expect, buf, filled), None
        expect += 1
        yield out
        del out
    while expect < len(m.buckets):  # the stream ended early, or trailing empty buckets
        yield done(expect, bytearray(), 0)
        expect += 1


def _buckets_of(m):
    return [(b.size_bytes, b.crc32c) for b in m.buckets]
