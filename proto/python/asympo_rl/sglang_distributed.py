"""SGLangDistributed: the learner's versions into SGLang through SGLang's own
update_weights_from_distributed, for an SGLang server (HTTP) or an
in-process sglang.Engine, with no code of ours inside SGLang.

SGLang receives weights over a torch.distributed group that it forms itself
(init_weights_update_group: a TCPStore rendezvous at master_address:
master_port, its tensor-parallel workers at ranks rank_offset + tp_rank),
one broadcast per tensor from rank 0, in the order of the names it was
given (update_weights_from_distributed(names, dtypes, shapes, ...)). The
learner's weight group broadcasts whole, checked buckets over a store it
serves itself. This adapter joins the two on the engine's node: it is a
member of the learner's group (a WeightGroupReceiver: NCCL into its GPU,
each bucket's CRC-32C checked, deltas where the group sends them) and rank
0 of SGLang's group, and hands each tensor on as its bucket arrives:

    receiver = asympo_rl.WeightGroupReceiver("learner:50051", "sglang-0", backend="nccl",
                                             device="cuda:0")
    adapter = SGLangDistributed("http://127.0.0.1:30000", receiver, master_port=29600)
    while True:
        version = adapter.load(timeout_s=60)   # pause, receive + relay, flush, continue

The first load opens SGLang's group (init_weights_update_group, world size
1 + the server's tensor-parallel size) before it takes a version, so that
the learner's broadcasts never wait on it; each load then takes the group's
next version and calls update_weights_from_distributed(names, dtypes,
shapes, group_name, flush_cache=False, weight_version) on a thread while
this process broadcasts the version's tensors, bucket by bucket, then
flush_cache, between pause_generation and continue_generation. Only
checked bytes reach SGLang; SGLang's side of the relay has no checksum (its
API carries none), so the relay runs on the engine's node (NVLink, or
loopback with Gloo).

Checked against SGLang's sources of 0.5.x (python/sglang/srt/entrypoints/
engine.py, http_server.py, managers/io_struct.py); SGLang is not needed to
import this module."""
import datetime
import inspect
import json
import threading
import urllib.request

from .engines import EngineError, _HTTP, _SGLang

GROUP_NAME = "asympo_weights"

_GLOO_DTYPES = {}  # torch dtype -> whether this torch's Gloo broadcasts it


def gloo_broadcasts(dtype):
    """Whether this torch's Gloo broadcasts tensors of `dtype` (torch 1.x's
    has no bfloat16): tried once, in a group of one."""
    if dtype not in _GLOO_DTYPES:
        import torch
        import torch.distributed as dist
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, opts)
        try:
            pg.broadcast([torch.zeros(1, dtype=dtype)], dist.BroadcastOptions()).wait()
            _GLOO_DTYPES[dtype] = True
        except RuntimeError:
            _GLOO_DTYPES[dtype] = False
    return _GLOO_DTYPES[dtype]


def open_update_group(backend, master_address, master_port, world_size, group_name, timeout_s):
    """Rank 0 of a torch.distributed group formed as SGLang forms its weight
    update group: a TCPStore rendezvous at tcp://master_address:master_port
    (rank 0 hosts the store), the keys under group_name, a process group of
    its own beside any default one."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    timeout = datetime.timedelta(seconds=timeout_s)
    # The store c10d.rendezvous("tcp://...") would host, without its wait
    # for the other ranks: torch 1.x holds the GIL through that wait, which
    # stops every other thread of this process (the weight group's
    # receiver, the call that asks SGLang to join) until it times out. The
    # process group's own rendezvous below releases the GIL.
    size, rank = world_size, 0
    store = dist.TCPStore(master_address, master_port, world_size, True, timeout, wait_for_workers=False)
    store = c10d.PrefixStore(group_name, store)
    options = "backend_options" if "backend_options" in inspect.signature(c10d._new_process_group_helper).parameters \
        else "pg_options"
    made = c10d._new_process_group_helper(size, rank, [], c10d.Backend(backend), store, group_name=group_name,
                                          timeout=timeout, **{options: None})
    pg = made[0] if isinstance(made, tuple) else made  # torch 2 also returns its store
    world = getattr(c10d, "_world", None)  # torch 2: the groups' registry (destroy_process_group reads it)
    if world is not None:
        world.pg_group_ranks[pg] = {i: i for i in range(size)}
    return pg


def close_update_group(pg):
    import torch.distributed as dist
    try:
        dist.destroy_process_group(pg)
    except Exception:  # noqa: BLE001 - the group may be half gone already
        pass


class _InProcess:
    """SGLang's calls on an in-process sglang.Engine; keywords its method
    does not take (weight_version, on Engines that lack it) are left out."""

    def __init__(self, engine):
        self.engine = engine

    def call(self, name, **kw):
        fn = getattr(self.engine, name)
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # pragma: no cover - a builtin
            return fn(**kw)
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            kw = {k: v for k, v in kw.items() if k in params}
        return fn(**kw)


class _Server(_HTTP):
    """SGLang's calls as its HTTP server's endpoints (POST /<name>, the
    keywords as the JSON body)."""

    def __init__(self, url, timeout):
        self.url, self.timeout = url.rstrip("/"), timeout

    def call(self, name, **kw):
        return self._post("/" + name, kw)

    def info(self):
        """GET /get_server_info as a dict."""
        with urllib.request.urlopen(self.url + "/get_server_info", timeout=self.timeout) as r:
            return json.loads(r.read().decode())


class SGLangDistributed(_SGLang):
    """The module's docstring: relays the learner's weight group into
    SGLang's update_weights_from_distributed."""

    def __init__(self, engine, receiver, master_port, master_address="127.0.0.1", tp_size=None,
                 group_name=GROUP_NAME, pause_mode="abort", timeout_s=600.0):
        """engine: an sglang.Engine, or an SGLang server's URL
        ("http://host:port"). receiver: a WeightGroupReceiver in this
        process (backend "nccl" on this node's GPU for an NCCL update group,
        "gloo" for a CPU one). master_address, master_port: where this
        process hosts the update group's TCPStore (SGLang's workers connect
        to it). tp_size: SGLang's tensor-parallel size (None: asked from the
        server's /get_server_info, or the Engine's server_args)."""
        server = isinstance(engine, str)
        super().__init__(pause_mode if server or hasattr(engine, "pause_generation") else None)
        self.sgl = _Server(engine, timeout_s) if server else _InProcess(engine)
        self.receiver, self.tp_size, self.group_name = receiver, tp_size, group_name
        self.master_address, self.master_port, self.timeout_s = master_address, master_port, timeout_s
        self.backend = receiver.backend
        self.pg = None

    def load(self, timeout_s=60.0):
        """Receives the group's next version and relays it into SGLang; its
        number, or None when none came within timeout_s. EngineError (after
        continuing generation) when SGLang refused it or the relay failed:
        the update group is then closed and opened again on the next load."""
        if self.pg is None:  # before the version is taken: the learner's broadcasts never wait on it
            self._awaiting, self._what = False, "the update group"
            self._sync(self._open())
        update = self.receiver.next_update(timeout=timeout_s)
        if update is None:
            return None
        with update:  # whatever fails, the rest is received: the learner's group goes on
            self._check_dtypes(update)
            self._sync(self._run(update, False))
        return update.version

    async def aload(self, timeout_s=60.0):
        raise TypeError("SGLangDistributed: its calls are synchronous: call load()")

    def close(self):
        """Closes SGLang's update group (destroy_weights_update_group) and ours."""
        if self.pg is not None:
            try:
                self.sgl.call("destroy_weights_update_group", group_name=self.group_name)
            finally:
                close_update_group(self.pg)
                self.pg = None

    def _check_dtypes(self, update):
        """EngineError, before SGLang is asked for anything, when the update
        group's Gloo cannot broadcast a dtype of the version: SGLang's end
        would fail on it the same way."""
        if self.backend != "gloo":
            return
        import torch
        from .weight_update import _TORCH_DTYPES
        bad = sorted({str(_TORCH_DTYPES[t.dtype]).replace("torch.", "") for t in update.manifest.tensors
                      if not gloo_broadcasts(_TORCH_DTYPES[t.dtype])})
        if bad:
            raise EngineError("SGLang: version %d has %s tensors, which Gloo in torch %s cannot broadcast (SGLang's "
                              "end of the update group would fail on them too): run the update group on NCCL (a "
                              "receiver with backend 'nccl'), or have the learner publish float32 (--dtype=float32)"
                              % (update.version, " and ".join(bad), torch.__version__))

    def _describe(self, update):
        return "version %d" % update.version

    async def _pause(self):
        if self.pause_mode:
            await self._do("pause_generation", self.sgl.call, "pause_generation", mode=self.pause_mode)

    async def _flush(self):
        await self._do("flush_cache", self.sgl.call, "flush_cache")

    async def _resume(self):
        if self.pause_mode:
            await self._do("continue_generation", self.sgl.call, "continue_generation")

    def _tp(self):
        if self.tp_size is None:
            info = self.sgl.info() if isinstance(self.sgl, _Server) else None
            args = getattr(getattr(self.sgl, "engine", None), "server_args", None)
            self.tp_size = int((info or {}).get("tp_size") or getattr(args, "tp_size", 0) or 1)
        return self.tp_size

    async def _load(self, update):
        order = update.tensor_order()  # the order _broadcast sends them in
        from .weight_update import _TORCH_DTYPES
        dtypes = [str(_TORCH_DTYPES[t.dtype]).replace("torch.", "") for t in order]
        reply, relay = self._in_thread("update_weights_from_distributed", names=[t.name for t in order],
                                       dtypes=dtypes, shapes=[list(t.shape) for t in order],
                                       group_name=self.group_name, flush_cache=False,
                                       weight_version=str(update.version))
        try:
            self._broadcast(update)
        except Exception as e:  # noqa: BLE001 - SGLang's side may have failed first: say both
            relay.join(self.timeout_s)
            self._drop()
            raise EngineError("SGLang: relaying %s over the update group failed: %s: %s; SGLang answered %s"
                              % (self._what, type(e).__name__, e, reply or "nothing")) from e
        relay.join(self.timeout_s)
        if relay.is_alive():
            self._drop()
            raise EngineError("SGLang: update_weights_from_distributed did not return within %.0f s for %s"
                              % (self.timeout_s, self._what))
        if reply.get("error") is not None:  # no answer: SGLang's end is in an unknown state
            self._drop()
            raise reply["error"]
        # An answer of success false came after every broadcast: the group stands.
        await self._do("update_weights_from_distributed", lambda: reply["value"])

    def _broadcast(self, update):
        """Each tensor of the version, in bucket order, as its bucket arrives
        (checked), from rank 0 of the update group."""
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        opts.timeout = datetime.timedelta(seconds=self.timeout_s)
        for pairs in update.buckets():
            for _, tensor in pairs:
                self.pg.broadcast([tensor.contiguous()], opts).wait()

    def _in_thread(self, name, **kw):
        """Calls SGLang's `name` on a thread (it returns once the broadcasts
        are done); the reply in the dict, under value or error."""
        reply = {}

        def run():
            try:
                reply["value"] = self.sgl.call(name, **kw)
            except Exception as e:  # noqa: BLE001 - reported by the caller
                reply["error"] = EngineError("SGLang: %s failed for %s: %s: %s" % (name, self._what,
                                                                                   type(e).__name__, e))
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return reply, t

    async def _open(self):
        world = 1 + self._tp()
        reply, t = self._in_thread("init_weights_update_group", master_address=self.master_address,
                                   master_port=self.master_port, rank_offset=1, world_size=world,
                                   group_name=self.group_name, backend=self.backend)
        try:
            self.pg = open_update_group(self.backend, self.master_address, self.master_port, world,
                                        self.group_name, self.timeout_s)
        except Exception as e:  # noqa: BLE001
            t.join(5)
            raise EngineError("SGLang: the update group at %s:%d (%d ranks) did not form: %s: %s; SGLang answered "
                              "%s" % (self.master_address, self.master_port, world, type(e).__name__, e,
                                      reply or "nothing")) from e
        t.join(self.timeout_s)
        if reply.get("error") is not None:
            self._drop()
            raise reply["error"]
        await self._do("init_weights_update_group", lambda: reply.get("value"))

    def _drop(self):
        """After a relay that broke off: both ends of the update group go
        (close(), SGLang's errors ignored: it may be in trouble already),
        and the next load opens it again."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort
            pass


__all__ = ["SGLangDistributed", "open_update_group", "GROUP_NAME"]
