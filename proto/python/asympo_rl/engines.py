"""Adapters that load a Snapshot into an inference engine, and the vLLM
worker extension they call.

Every adapter's load(snapshot) makes the same four steps, and resumes
generation whatever happens in between (a failed load included):

    1. pause (or drain) generation   the engine's own call, when it has one
    2. load the weights              bucket by bucket, or from a directory
    3. flush the cache               KV / prefix cache computed with old weights
    4. resume generation             also after a failure in 1-3

A call that fails (raises, answers success false, answers HTTP 4xx/5xx, or
reset_prefix_cache answering False) raises EngineError naming the engine,
the call and its reply. Then report what the engine holds:
subscriber.report(snapshot.version) after a load, nothing after an
EngineError (the engine may hold part of the new version: load it again).

Targets: the engine calls below, by their public names, as the current
sources of vLLM and SGLang (2025-2026) spell them; older releases lack some
(the pause calls above all): the in-process adapters skip a pause the
engine does not have; give the server adapters pause=False /
pause_mode=None for a server without one.

vLLM, V1 engine (the default), any tensor / data parallel size
(worker_extension_cls: vLLM 0.8 and later):
  `LLM(..., worker_extension_cls="asympo_rl.engines.VLLMWorkerExtension")`,
  then VLLMFromTensors(llm):
    llm.pause_generation(mode="wait")            AsyncLLM (recent); older
        ones take wait_for_inflight_requests=True. vllm.LLM has none: its
        generation runs only inside generate(), so a load() between two
        generate() calls is drained already.
    llm.collective_rpc("asympo_load_bucket", args=(tensors, bucket_bytes))
        per bucket: every worker runs VLLMWorkerExtension.asympo_load_bucket,
        which hands (Hugging Face name, tensor) pairs to
        model_runner.model.load_weights (vLLM maps HF names, fuses and shards
        them itself). The arguments are bytes and lists, which vLLM's msgpack
        transport carries without VLLM_ALLOW_INSECURE_SERIALIZATION.
    llm.reset_prefix_cache()                     False (blocks still in use) fails
    llm.resume_generation()                      AsyncLLM
  VLLMFromDisk(llm, link, config) (vLLM started with model=link): the same,
  with write_hf_directory(snapshot, link, config) and
  llm.collective_rpc("reload_weights") (Worker.reload_weights re-reads the
  model path, i.e. the link, now pointing at the new version) as step 2.
  VLLMFromGroup(llm, target, worker_id) (the learner's weight group,
  WeightGroupReceiver): load(timeout_s) pauses, then
    llm.collective_rpc("asympo_join_weight_group",
        args=(target, worker_id, backend), kwargs=...)   first load only:
        each worker becomes a member of the group (worker_id-<rank>)
    llm.collective_rpc("asympo_receive_group_update", args=(timeout_s, reload))
        every worker takes part in the broadcasts and hands each bucket's
        tensors to load_weights as it arrives; answers the version, or
        None when none came (then no cache reset)
  and resets the prefix cache and resumes as above.
  The extension's methods are prefixed asympo_: vLLM refuses an extension
  whose names clash with the worker's (current workers have their own
  update_weights, for vLLM's weight transfer engines).
vLLM server (`vllm serve link`, VLLM_SERVER_DEV_MODE=1 for the endpoints
  that reach the workers), VLLMServer(url, link, config):
    POST /pause?mode=wait                        (recent; pause=False before)
    write_hf_directory(snapshot, link, config)
    POST /collective_rpc {"method": "reload_weights"}
    POST /reset_prefix_cache
    POST /resume
  (The server does not report whether the prefix cache was reset; it is
  empty anyway once the paused engine has drained.)
SGLang (`sglang.Engine`), SGLangInProcess(engine):
    engine.pause_generation(mode="abort") when the Engine has it (the sync
        Engine's generate() blocks, so a load() between calls is drained)
    engine.update_weights_from_tensor(named_tensors=..., flush_cache=False)
        per bucket -> (success, message); or, with link=,
        write_hf_directory + engine.update_weights_from_disk(model_path=link)
        -> (success, message, num_paused_requests)
    engine.flush_cache()                         .success false fails
    engine.continue_generation()
  SGLangFromGroup(engine, receiver): a WeightGroupReceiver in this process
    receives each version; per bucket update_weights_from_tensor as above
    (SGLang's update_weights_from_distributed wants one broadcast per
    tensor over its own rendezvous, which the learner's group is not).
SGLang server (HTTP), SGLangServer(url, link, config):
    POST /pause_generation {"mode": "abort"}     (abort: in-flight requests
        return to their callers as aborted; "retract" and "in_place" keep
        requests queued, and SGLang then refuses to flush the cache)
    write_hf_directory(snapshot, link, config)
    POST /update_weights_from_disk {"model_path": link}  {"success": ...}
    POST /flush_cache                            200, or 400 when requests remain
    POST /continue_generation

aload(snapshot) is load() for engines whose calls are coroutines (vLLM's
AsyncLLM); load() refuses such an engine. The group adapters take a
timeout instead of a snapshot, and return the version loaded (or None).

vLLM and SGLang need a GPU and are not installed where this package is
tested: tests/integration/python_engines_test.py runs every adapter against
stand-ins that record the calls (a real HTTP server for SGLangServer) and
the worker extension on a real snapshot of a real learner, and the group
adapters on a real learner's weight group (Gloo)."""
import inspect
import json
import os
import urllib.error
import urllib.request

from .errors import AsympoError
from .weights import DTYPES, write_hf_directory


class EngineError(AsympoError):
    """An engine call failed: the message names the engine, the call, the
    snapshot's version and the engine's reply."""


def bucket_tensors_spec(snapshot):
    """Yields (tensors, data) per bucket of `snapshot`: tensors is a list of
    [name, dtype ("F32", "BF16", "F16"), shape, offset, size] of the tensors
    in that bucket, data the bucket's bytes."""
    per_bucket = [[] for _ in snapshot.buckets]
    for t in snapshot.manifest.tensors:
        per_bucket[t.bucket].append([t.name, DTYPES[t.dtype][0], list(t.shape), t.offset, t.size_bytes])
    for b, tensors in enumerate(per_bucket):
        if tensors:
            yield tensors, snapshot.buckets[b]


def tensors_from_bucket(tensors, data, device=None):
    """Returns [(name, torch tensor)] for one bucket (the pairs that
    bucket_tensors_spec yields), on `device` when given; without a device
    the tensors share the memory of `data` when it is a bytearray (else of
    one copy). ValueError names a tensor that does not fit the bucket."""
    import torch
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    buf = data if isinstance(data, bytearray) else bytearray(data)
    out = []
    for name, dtype, shape, offset, size in tensors:
        if dtype not in dtypes:
            raise ValueError("tensor %s: unknown dtype %r" % (name, dtype))
        n = 1
        for d in shape:
            n *= d
        item = 4 if dtype == "F32" else 2
        if n * item != size or offset < 0 or offset + size > len(buf):
            raise ValueError("tensor %s: shape %s of %s at %d+%d does not fit a bucket of %d bytes"
                             % (name, list(shape), dtype, offset, size, len(buf)))
        t = torch.frombuffer(buf, dtype=dtypes[dtype], count=n, offset=offset) if n else \
            torch.empty(0, dtype=dtypes[dtype])
        t = t.reshape(tuple(shape))
        out.append((name, t.to(device) if device is not None else t))
    return out


class VLLMWorkerExtension:
    """Mixed into every vLLM worker by
    `worker_extension_cls="asympo_rl.engines.VLLMWorkerExtension"`; the
    driver calls its methods with llm.collective_rpc. `self` is the worker:
    self.model_runner.model is its shard of the model, self.device its GPU."""

    def asympo_load_bucket(self, tensors, data):
        """Loads one bucket (bucket_tensors_spec's pair) into this worker's
        model; returns the number of tensors handed to load_weights."""
        return self._asympo_load(tensors_from_bucket(tensors, data, getattr(self, "device", None)))

    def asympo_join_weight_group(self, target, worker_id, backend, tls_ca=None, token_file=None, **kw):
        """Makes this worker a member of the learner's weight group: a
        WeightGroupReceiver kept on the worker, named worker_id-<rank> (each
        worker of a tensor or pipeline parallel engine is a member of its
        own). backend "nccl" receives on the worker's GPU, "gloo" on the
        CPU. tls_ca, token_file: paths of the CA certificate and of a bearer
        token for a learner with TLS (credential objects do not cross
        collective_rpc). Other keywords go to WeightGroupReceiver (e.g.
        gloo_address, model_signature). Returns the member's worker_id."""
        from .weight_group import WeightGroupReceiver
        if getattr(self, "_asympo_group", None) is not None:
            self._asympo_group.close()
            self._asympo_group = None
        member = "%s-%d" % (worker_id, getattr(self, "rank", 0))
        kw.setdefault("device", getattr(self, "device", "cuda") if backend == "nccl" else "cpu")
        if tls_ca or token_file:
            kw["credentials"] = _credentials(tls_ca, token_file)
        self._asympo_group = WeightGroupReceiver(target, member, backend=backend, **kw)
        return member

    def asympo_receive_group_update(self, timeout_s=60.0, reload=False):
        """Receives the weight group's next version into this worker's
        model: each bucket's (name, tensor) pairs go to load_weights as the
        bucket arrives. Returns the version, or None when none began within
        timeout_s. A failed load_weights still receives the rest of the
        version's broadcasts (the group goes on) before raising. reload:
        forget the version this worker holds, so that the group's latest
        comes again (after a failed load left the engine's workers on
        different versions)."""
        group = getattr(self, "_asympo_group", None)
        if group is None:
            raise RuntimeError("this worker is in no weight group: call asympo_join_weight_group first")
        if reload:
            group.forget()
        update = group.next_update(timeout=timeout_s)
        if update is None:
            return None
        with update:
            for pairs in update.buckets():
                if pairs:
                    self._asympo_load(pairs)
        return update.version

    def _asympo_load(self, named_tensors):
        # The one load step of every source (buckets over RPC, the
        # learner's weight group): vLLM maps HF names onto its fused,
        # sharded parameters and copies each into place.
        self.model_runner.model.load_weights(weights=named_tensors)
        return len(named_tensors)


def _credentials(tls_ca, token_file):
    import grpc
    creds = grpc.ssl_channel_credentials(root_certificates=open(tls_ca, "rb").read() if tls_ca else None)
    if token_file:
        with open(token_file) as f:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(f.read().strip()))
    return creds


def _succeeded(reply):
    """False when an engine's reply says it failed: success false in a
    dict, an object or the first place of a tuple; a bare False."""
    if reply is False:
        return False
    if isinstance(reply, dict):
        return reply.get("success") is not False
    if isinstance(reply, (tuple, list)) and reply and isinstance(reply[0], bool):
        return reply[0]
    return getattr(reply, "success", True) is not False


def _shown(reply):
    text = repr(reply)
    if " object at 0x" in text:  # a reply object without a repr of its own
        text = "%s(%s)" % (type(reply).__name__, ", ".join(
            "%s=%r" % (k, getattr(reply, k)) for k in ("success", "message") if hasattr(reply, k)))
    return text


class _Adapter:
    """Runs pause, load, flush, resume; each engine call through _do."""
    engine = "engine"

    def load(self, snapshot):
        """Loads `snapshot`; EngineError when an engine call fails."""
        return self._sync(self._run(snapshot, False))

    async def aload(self, snapshot):
        """load() for an engine whose calls are coroutines (AsyncLLM)."""
        return await self._run(snapshot, True)

    @staticmethod
    def _sync(run):
        # The steps are one coroutine for load() and aload(). Here _do
        # awaits nothing, so a single send runs it to the end.
        try:
            run.send(None)
        except StopIteration as done:
            return done.value
        run.close()
        raise RuntimeError("load() was suspended: an engine call awaited")  # _do prevents it

    def _describe(self, source):
        """What a load is of, for the error messages."""
        return "version %d" % source.version

    async def _run(self, source, awaiting):
        self._awaiting, self._what = awaiting, self._describe(source)
        try:
            await self._pause()
            result = await self._load(source)
            await self._flush()
        except Exception as e:
            try:
                await self._resume()
            except EngineError as r:
                raise EngineError("%s; and then %s" % (e, r)) from e
            raise
        await self._resume()
        return result

    async def _do(self, call, fn, *args, **kwargs):
        """fn(*args, **kwargs): its reply, or EngineError naming `call`."""
        try:
            reply = fn(*args, **kwargs)
            if inspect.isawaitable(reply):
                if not self._awaiting:
                    if inspect.iscoroutine(reply):
                        reply.close()
                    raise TypeError("it returned a coroutine: call aload() (an async engine)")
                reply = await reply
        except EngineError:
            raise
        except Exception as e:
            raise EngineError("%s: %s failed for %s: %s: %s"
                              % (self.engine, call, self._what, type(e).__name__, e)) from e
        if not _succeeded(reply):
            raise EngineError("%s: %s failed for %s: the engine answered %s"
                              % (self.engine, call, self._what, _shown(reply)))
        return reply

    async def _pause(self):
        pass

    async def _flush(self):
        pass

    async def _resume(self):
        pass


class _VLLM(_Adapter):
    engine = "vLLM"

    def __init__(self, llm, pause=True):
        """pause: call llm.pause_generation / resume_generation around each
        load when the engine has them (AsyncLLM); False when the caller
        drains generation itself."""
        self.llm = llm
        self.pause = pause and hasattr(llm, "pause_generation") and hasattr(llm, "resume_generation")

    async def _pause(self):
        if self.pause:
            params = inspect.signature(self.llm.pause_generation).parameters
            # "wait": requests in flight finish with the weights they began
            # with; no new one is scheduled until resume_generation.
            kwargs = {"mode": "wait"} if "mode" in params else {"wait_for_inflight_requests": True}
            await self._do("pause_generation(%s)" % kwargs, self.llm.pause_generation, **kwargs)

    async def _rpc(self, method, args=(), kwargs=None):
        call = "collective_rpc(%r)" % method
        if kwargs:
            replies = await self._do(call, self.llm.collective_rpc, method, args=args, kwargs=kwargs)
        else:
            replies = await self._do(call, self.llm.collective_rpc, method, args=args)
        return call, list(replies) if replies is not None else []

    async def _flush(self):
        await self._do("reset_prefix_cache", self.llm.reset_prefix_cache)

    async def _resume(self):
        if self.pause:
            await self._do("resume_generation", self.llm.resume_generation)


class VLLMFromTensors(_VLLM):
    """Loads each snapshot into every worker of a vLLM engine started with
    worker_extension_cls="asympo_rl.engines.VLLMWorkerExtension", one
    collective_rpc per bucket."""

    async def _load(self, snapshot):
        for tensors, data in bucket_tensors_spec(snapshot):
            call, replies = await self._rpc("asympo_load_bucket", (tensors, data))
            wrong = [r for r in replies if r != len(tensors)]
            if not replies or wrong:
                raise EngineError("vLLM: %s failed for version %d: workers answered %r, not %d tensors "
                                  "each (is the engine started with %s?)"
                                  % (call, snapshot.version, replies, len(tensors), _EXTENSION))


_EXTENSION = 'worker_extension_cls="asympo_rl.engines.VLLMWorkerExtension"'


class VLLMFromGroup(_VLLM):
    """Loads the versions the learner's weight group broadcasts
    (WeightGroupReceiver) into a vLLM engine started with
    worker_extension_cls="asympo_rl.engines.VLLMWorkerExtension": every
    worker is a member of the group and receives the buckets itself (on its
    GPU with NCCL), handing each bucket's tensors to load_weights as it
    arrives. load(timeout_s) pauses generation, has every worker receive
    the group's next version (asympo_receive_group_update; the first load
    joins them, asympo_join_weight_group), resets the prefix cache and
    resumes; it returns the version, or None when none came within
    timeout_s (then nothing is loaded nor reset).

    The group broadcasts once every member is asking, and waits for the
    slowest up to the learner's --weight_group_ready_timeout: call load()
    again at once after each, between batches of generation, so that the
    workers keep asking. After a failed load the workers may hold
    different versions: the next load has each forget its own, so that
    all of them receive the group's latest."""

    def __init__(self, llm, target, worker_id, backend="nccl", pause=True, **receiver_kw):
        """target: the learner's "host:port". worker_id: this engine's name
        in the group (its workers add their rank). backend: "nccl" or
        "gloo". receiver_kw: asympo_join_weight_group's keywords (tls_ca,
        token_file, gloo_address, model_signature, ...), plain values."""
        super().__init__(llm, pause)
        self.target, self.worker_id, self.backend, self.receiver_kw = target, worker_id, backend, receiver_kw
        self.members = None  # the workers' names in the group, once joined
        self._loaded = self._reload = False

    def load(self, timeout_s=60.0):
        """Receives and loads the group's next version; its number, or None."""
        return self._sync(self._run(timeout_s, False))

    async def aload(self, timeout_s=60.0):
        return await self._run(timeout_s, True)

    def _describe(self, timeout_s):
        return "the weight group's next version"

    async def _load(self, timeout_s):
        self._loaded = False
        if self.members is None:
            call, replies = await self._rpc("asympo_join_weight_group", (self.target, self.worker_id, self.backend),
                                            self.receiver_kw)
            if not replies or not all(isinstance(r, str) for r in replies):
                raise EngineError("vLLM: %s failed: workers answered %r, not their names in the group (is the "
                                  "engine started with %s?)" % (call, replies, _EXTENSION))
            self.members = replies
        reload, self._reload = self._reload, True  # until the workers agree again
        call, replies = await self._rpc("asympo_receive_group_update", (timeout_s, reload))
        if not replies or len(set(replies)) != 1 or not (replies[0] is None or isinstance(replies[0], int)):
            raise EngineError("vLLM: %s failed for %s: workers answered %r, not one version (or None) for all"
                              % (call, self._what, replies))
        self._reload = reload and replies[0] is None  # a reload that found nothing is asked again
        if replies[0] is not None:
            self._what, self._loaded = "version %d" % replies[0], True
        return replies[0]

    async def _flush(self):
        if self._loaded:
            await super()._flush()


class VLLMFromDisk(_VLLM):
    """Writes each snapshot to `link` (the model path vLLM was started with)
    and has every worker reload it (Worker.reload_weights)."""

    def __init__(self, llm, link, config, extra_files=None, pause=True):
        super().__init__(llm, pause)
        self.link, self.config, self.extra = link, config, extra_files
        started = _started_on(llm)
        if started is not None and os.path.abspath(started) != os.path.abspath(link):
            raise ValueError("vLLM was started on %s, not on the link %s: reload_weights re-reads "
                             "the path it was started on" % (started, link))

    async def _load(self, snapshot):
        write_hf_directory(snapshot, self.link, self.config, self.extra)
        await self._rpc("reload_weights")


def _started_on(llm):
    """The model path of a vLLM LLM or AsyncLLM, None when not found."""
    for path in (("llm_engine", "model_config", "model"), ("model_config", "model")):
        obj = llm
        for name in path:
            obj = getattr(obj, name, None)
        if isinstance(obj, str):
            return obj
    return None


class _SGLang(_Adapter):
    engine = "SGLang"

    def __init__(self, pause_mode):
        if pause_mode not in ("abort", "retract", "in_place", None):
            raise ValueError("pause_mode %r: one of abort, retract, in_place or None" % (pause_mode,))
        self.pause_mode = pause_mode


class SGLangInProcess(_SGLang):
    """Loads each snapshot into an in-process `sglang.Engine`: from tensors,
    bucket by bucket, or (link= and config= given) from a directory."""

    def __init__(self, engine, link=None, config=None, extra_files=None, pause_mode="abort"):
        super().__init__(pause_mode if hasattr(engine, "pause_generation") else None)
        if (link is None) != (config is None):
            raise ValueError("SGLangInProcess: give both link and config (from disk) or neither")
        self.sgl, self.link, self.config, self.extra = engine, link, config, extra_files

    async def _pause(self):
        if self.pause_mode:
            await self._do("pause_generation(mode=%r)" % self.pause_mode, self.sgl.pause_generation,
                           mode=self.pause_mode)

    async def _load(self, snapshot):
        if self.link is not None:
            write_hf_directory(snapshot, self.link, self.config, self.extra)
            await self._do("update_weights_from_disk(%r)" % self.link, self.sgl.update_weights_from_disk,
                           model_path=self.link)
            return
        for tensors, data in bucket_tensors_spec(snapshot):
            # flush_cache=False: the flush is its own step, whose reply is
            # checked (inside the update call a failed flush is an assert).
            await self._do("update_weights_from_tensor", self.sgl.update_weights_from_tensor,
                           named_tensors=tensors_from_bucket(tensors, bytearray(data)), flush_cache=False)

    async def _flush(self):
        await self._do("flush_cache", self.sgl.flush_cache)

    async def _resume(self):
        if self.pause_mode:
            await self._do("continue_generation", self.sgl.continue_generation)


class SGLangFromGroup(SGLangInProcess):
    """Loads the versions the learner's weight group broadcasts into an
    in-process `sglang.Engine`: `receiver` (a WeightGroupReceiver in this
    process, which is the group's member) receives each version bucket by
    bucket, and each bucket's tensors go to
    engine.update_weights_from_tensor(named_tensors, flush_cache=False) as
    the bucket arrives; then flush_cache, with pause_generation /
    continue_generation around it as SGLangInProcess does. load(timeout_s)
    first waits up to timeout_s for the group's next version (generation
    goes on meanwhile) and returns it, or None.

    For SGLang's own update_weights_from_distributed (an SGLang server
    included), see asympo_rl.sglang_distributed.SGLangDistributed; here
    the tensors are handed over in process (for a GPU receiver, on the
    engine's GPU: backend "nccl", device "cuda:N")."""

    def __init__(self, engine, receiver, pause_mode="abort"):
        _SGLang.__init__(self, pause_mode if hasattr(engine, "pause_generation") else None)
        self.sgl, self.receiver, self.link = engine, receiver, None

    def load(self, timeout_s=60.0):
        """Receives and loads the group's next version; its number, or None.
        WeightsError (after resuming) when the version could not be
        completed: the engine holds part of it, and the next load brings a
        whole version."""
        update = self.receiver.next_update(timeout=timeout_s)
        if update is None:
            return None
        with update:  # whatever fails, the rest is received: the group goes on
            self._sync(self._run(update, False))
        return update.version

    async def aload(self, timeout_s=60.0):
        raise TypeError("SGLangFromGroup: sglang.Engine's calls are synchronous: call load()")

    async def _load(self, update):
        for pairs in update.buckets():
            if pairs:
                await self._do("update_weights_from_tensor", self.sgl.update_weights_from_tensor,
                               named_tensors=pairs, flush_cache=False)


class _HTTP:
    """POSTs to self.url with JSON bodies."""

    def _post(self, path, body=None):
        """The reply as a dict (a reply that is not a JSON object as
        {"message": text}). HTTP errors raise with their status and body."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            raise RuntimeError("HTTP %d %s" % (e.code, e.read().decode(errors="replace").strip())) from None
        try:
            reply = json.loads(text)
        except ValueError:
            reply = None
        return reply if isinstance(reply, dict) else {"message": text}

    async def _call(self, path, body=None):
        return await self._do("POST " + path, self._post, path, body)


class VLLMServer(_HTTP, _Adapter):
    """Writes each snapshot to `link` and has a vLLM server (`vllm serve
    link`, with VLLM_SERVER_DEV_MODE=1 for its /collective_rpc and
    /reset_prefix_cache) reload it."""
    engine = "vLLM server"

    def __init__(self, url, link, config, extra_files=None, pause=True, timeout=600.0):
        """pause: POST /pause?mode=wait and /resume around each load; False
        for a server without them (older vLLM)."""
        self.url, self.link, self.config = url.rstrip("/"), link, config
        self.extra, self.pause, self.timeout = extra_files, pause, timeout

    async def _pause(self):
        if self.pause:
            # Older servers know wait_for_inflight_requests only; newer ones
            # take mode=wait (and accept the older name).
            await self._call("/pause?mode=wait&wait_for_inflight_requests=true")

    async def _load(self, snapshot):
        write_hf_directory(snapshot, self.link, self.config, self.extra)
        await self._call("/collective_rpc", {"method": "reload_weights"})

    async def _flush(self):
        await self._call("/reset_prefix_cache")

    async def _resume(self):
        if self.pause:
            await self._call("/resume")


class SGLangServer(_HTTP, _SGLang):
    """Writes each snapshot to `link` and has an SGLang server (HTTP) load
    it from there; the server was started with --model-path link."""

    def __init__(self, url, link, config, extra_files=None, pause_mode="abort", timeout=600.0):
        super().__init__(pause_mode)
        self.url, self.link, self.config = url.rstrip("/"), link, config
        self.extra, self.timeout = extra_files, timeout

    async def _pause(self):
        if self.pause_mode:
            await self._call("/pause_generation", {"mode": self.pause_mode})

    async def _load(self, snapshot):
        write_hf_directory(snapshot, self.link, self.config, self.extra)
        await self._call("/update_weights_from_disk", {"model_path": self.link})

    async def _flush(self):
        await self._call("/flush_cache")

    async def _resume(self):
        if self.pause_mode:
            await self._call("/continue_generation")
