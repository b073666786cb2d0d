"""GroupStore: the c10d store of one generation of the learner's weight
group, each operation a WeightGroup.Store RPC (proto/asympo/v1/
weight_group.proto). c10d's process groups rendezvous over it."""
import datetime
import time

import grpc
import torch.distributed as dist

from .v1 import weight_group_pb2 as wg, weight_group_pb2_grpc

# What c10d's own stores raise on a timeout (torch 2.x); RuntimeError before.
_StoreTimeout = getattr(dist, "DistStoreError", RuntimeError)
_MAX_STORE_WAIT_MS = 30000   # GroupStoreRequest.wait_ms's limit
_RPC_GRACE_S = 30.0          # beyond a long poll's wait, before the call gives up


def _as_bytes(v):
    """A store value as bytes: c10d passes bytes (or, torch 1.13's
    compare_set, a list of ints), Python callers often str."""
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def _ms(delta):
    """A timedelta (or seconds) in whole ms; None for no limit (0)."""
    s = delta.total_seconds() if isinstance(delta, datetime.timedelta) else float(delta)
    return None if s <= 0 else max(1, int(s * 1000))


class GroupStoreError(RuntimeError):
    """A Store RPC failed: the message names the operation, the keys, the
    gRPC code and the learner's reply."""


class GroupStore(dist.Store):
    """The c10d store of one generation of the learner's weight group, a
    torch.distributed.Store whose every operation is a WeightGroup.Store
    RPC naming `member_token`; c10d's process groups (ProcessGroupGloo,
    ProcessGroupNCCL) rendezvous over it. The learner keeps the keys, with
    c10d HashStore's semantics: get and wait wait until the keys are set,
    up to this store's timeout (then _StoreTimeout: torch's DistStoreError,
    RuntimeError on torch 1.x); add stores the sum as decimal text and
    returns it; compare_set sets when the key holds `expected` (or is unset
    and expected is empty) and returns what the key holds after.

    The methods are those c10d calls on a Python store: set, get, add,
    compare_set, check, wait, getNumKeys and deleteKey (also under the
    names Python callers use, num_keys and delete_key), clone. A failed RPC
    raises GroupStoreError. Thread-safe (the stub is)."""

    def __init__(self, channel, member_token, timeout=datetime.timedelta(minutes=5), poll_ms=10000):
        """channel: a grpc.Channel to the learner. timeout: how long get
        and wait wait (timedelta; zero: no limit). poll_ms: the longest
        single wait asked of the learner (at most 30000)."""
        super().__init__()
        self._channel, self.member_token = channel, member_token
        self._stub = weight_group_pb2_grpc.WeightGroupStub(channel)
        self.poll_ms = max(1, min(int(poll_ms), _MAX_STORE_WAIT_MS))
        self.set_timeout(timeout)

    def _call(self, op, keys, wait_ms=0, **fields):
        req = wg.GroupStoreRequest(member_token=self.member_token, op=op, keys=keys, wait_ms=wait_ms, **fields)
        try:
            return self._stub.Store(req, timeout=wait_ms / 1000.0 + _RPC_GRACE_S)
        except grpc.RpcError as e:
            raise GroupStoreError("GroupStore %s %s (member %s): %s: %s" % (
                wg.GroupStoreRequest.Op.Name(op), list(keys), self.member_token, e.code().name,
                e.details())) from None

    def _waiting(self, op, keys, timeout=None):
        """Asks op (GET or WAIT) in polls of at most poll_ms until the keys
        are set; _StoreTimeout after `timeout` (default: the store's)."""
        limit = _ms(self.timeout if timeout is None else timeout)
        deadline = None if limit is None else time.monotonic() + limit / 1000.0
        while True:
            wait = self.poll_ms
            if deadline is not None:
                wait = min(wait, max(1, int((deadline - time.monotonic()) * 1000)))
            r = self._call(op, keys, wait_ms=wait)
            if r.ready:
                return r
            if deadline is not None and time.monotonic() >= deadline:
                raise _StoreTimeout("GroupStore (member %s): %s not set within %d ms (timeout)"
                                    % (self.member_token, list(keys), limit))

    def set(self, key, value):
        self._call(wg.GroupStoreRequest.OP_SET, [key], value=_as_bytes(value))

    def get(self, key):
        return self._waiting(wg.GroupStoreRequest.OP_GET, [key]).value

    def add(self, key, amount):
        return self._call(wg.GroupStoreRequest.OP_ADD, [key], amount=int(amount)).number

    def compare_set(self, key, expected, desired):
        return self._call(wg.GroupStoreRequest.OP_COMPARE_SET, [key], expected=_as_bytes(expected),
                          value=_as_bytes(desired)).value

    def check(self, keys):
        return self._call(wg.GroupStoreRequest.OP_CHECK, list(keys)).ready

    def wait(self, keys, timeout=None):
        self._waiting(wg.GroupStoreRequest.OP_WAIT, list(keys), timeout)

    def num_keys(self):
        return self._call(wg.GroupStoreRequest.OP_NUM_KEYS, []).number

    def delete_key(self, key):
        r = self._call(wg.GroupStoreRequest.OP_DELETE, [key])
        return r.ready or r.number > 0

    # The names c10d's Python-store trampoline calls (torch 1.13 and 2.x).
    getNumKeys = num_keys
    deleteKey = delete_key

    def clone(self):
        return GroupStore(self._channel, self.member_token, self.timeout, self.poll_ms)
