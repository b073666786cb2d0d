"""Low-rank adapters: a learner started with --lora_rank publishes versions
that hold its adapters alone (model.layers.<i>.<module>.lora_A.weight, of
shape (r, in), and lora_B.weight, (out, r), for every adapted projection).
write_peft_directory writes one as a PEFT adapter directory, and the
adapters below load each version into a running engine through the
engine's own LoRA API, beside its base model, under a name of its own.

Every adapter's load(snapshot):

    1. writes the version's adapter directory (write_peft_directory)
    2. has the engine load it under a fresh name, <prefix>-v<version>
    3. makes that name the one to generate with (.lora_name; for vLLM in
       this process also .lora_request)
    4. has the engine unload the previous adapter

Generate with the adapter's current name: a request names its adapter, so
requests that began with the previous version finish with it, and new ones
take the new version, without a pause. No cache is flushed: both engines
key the prefix cache by the adapter a request names (vLLM by its
lora_name, older releases by its lora_int_id; SGLang by the lora_id it
draws for each load), so blocks computed with the previous adapter are
never reused by the new name's requests. This is why every load takes a
name the engine has not seen from this object (a version loaded again
gets a suffix, <prefix>-v<version>-<n>): vLLM's prefix cache would keep
serving blocks of an older adapter loaded under the same name.

A call that fails (raises, answers success false or False, answers HTTP
4xx/5xx) raises EngineError naming the engine, the call and its reply; the
engine keeps the previous adapter, and .lora_name stays its name. Report
as with asympo_rl.engines: subscriber.report(snapshot.version) after a
load, nothing after an EngineError. An unload that fails does not fail the
load (the new version is loaded and in use): it is logged, the name is
kept in .stale and unloaded again at the next load. A snapshot that is not
one of adapters raises ValueError naming the tensor.

Targets: the calls below, by their public names, as the current sources of
vLLM and SGLang (2025-2026) spell them: vLLM's V1 LLMEngine and AsyncLLM
(vLLM 0.8 and later, as for asympo_rl.engines) and its server's runtime
LoRA endpoints; SGLang's Engine and server of the releases that load
adapters at run time (2025 on; an older server answers HTTP 404, which
the EngineError names).

vLLM in this process, VLLMLoRA(llm, path): `vllm.LLM(..., enable_lora=True,
  max_lora_rank=M, max_loras=2)` (M one of 1, 8, 16, 32, ..., 512, at
  least the learner's rank; max_loras=2 lets requests of the previous and
  the new version share a batch), or an AsyncLLM.
    vllm.lora.request.LoRARequest(lora_name=..., lora_int_id=n, lora_path=dir)
        n counts this object's loads from 1 (vLLM wants it > 0 and unique;
        the oldest releases named lora_path lora_local_path)
    engine.add_lora(request) -> True        (False fails)
    engine.remove_lora(previous lora_int_id) -> bool  (False: not loaded any
        more, e.g. evicted; nothing to unload)
  where engine is llm.llm_engine for vllm.LLM (which has no add_lora of its
  own), or the AsyncLLM itself, whose calls are coroutines: aload(). With
  pause=True (AsyncLLM), llm.pause_generation(mode="wait") before and
  llm.resume_generation() after, as asympo_rl.engines pauses: no request of
  the previous version runs once load() returns. Without it, a request
  still running with the previous adapter has vLLM's workers load it again
  from its directory (their LRU LoRA manager loads every adapter a batch
  names), which write_peft_directory keeps for the previous version.
vLLM server (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve base` with
  LoRA enabled), VLLMServerLoRA(url, path):
    POST /v1/load_lora_adapter {"lora_name": ..., "lora_path": dir}
        200 "Success: ..." (text), 400 / 404 with the error; the route exists
        only with that environment variable
    POST /v1/unload_lora_adapter {"lora_name": previous}
        (the server forgets the name; the engine evicts the adapter later)
SGLang (`sglang.Engine(..., enable_lora=True, max_lora_rank=M,
  lora_target_modules=[the learner's targets])`: it infers both only from
  adapters given at start), SGLangLoRA(engine, path):
    engine.load_lora_adapter(lora_name=..., lora_path=dir)
    engine.unload_lora_adapter(lora_name=previous)
        each -> LoRAUpdateOutput(success, error_message, loaded_adapters);
        the unload waits until the requests using that adapter are done
SGLang server (HTTP), SGLangServerLoRA(url, path):
    POST /load_lora_adapter {"lora_name": ..., "lora_path": dir}
    POST /unload_lora_adapter {"lora_name": previous}
        200 {"success": true, ...}, or 400 {"success": false,
        "error_message": ...}
SGLang has no pause here: its pause modes that keep requests (retract,
in_place) would hold the previous adapter's requests, which its unload
waits for.

The engines read the directory from `path`, so a server must see the same
file system. vLLM and SGLang need a GPU and are not installed where this
package is tested: tests/integration/python_lora_engines_test.py runs every
adapter against stand-ins that record the calls (real HTTP servers for the
server adapters) on real versions of a learner with --lora_rank."""
import inspect
import json
import logging
import re

from .engines import EngineError, _HTTP, _Adapter, _VLLM
from .weights import safetensors_chunks, write_version_directory

log = logging.getLogger("asympo_rl.lora")

PEFT_PREFIX = "base_model.model."  # what PEFT puts before the model's own names
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The projections the learner can adapt (--lora_targets), in its order.
MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_NAME = re.compile(r"model\.layers\.(\d+)\.(%s)\.lora_([AB])\.weight" % "|".join(re.escape(m) for m in MODULES))
_FORM = "model.layers.<i>.<self_attn.q|k|v|o_proj or mlp.gate|up|down_proj>.lora_A|lora_B.weight"


def adapter_layout(snapshot):
    """(r, target_modules) of a snapshot of adapters: every tensor named
    model.layers.<i>.<module>.lora_A.weight (r, in) or ...lora_B.weight
    (out, r), both for every adapted projection, one rank, the same modules
    in every layer. target_modules as PEFT names them ("q_proj", ...), in
    the learner's order. ValueError naming the tensor otherwise."""
    tensors = list(snapshot.manifest.tensors)
    if not any(".lora_" in t.name for t in tensors):
        raise ValueError("version %d holds no adapter tensors (%s): the learner trains every weight; "
                         "start it with --lora_rank for versions of adapters"
                         % (snapshot.version, tensors[0].name if tensors else "no tensor at all"))
    sides = {}  # (layer, module) -> {"A": (name, shape), "B": ...}
    for t in tensors:
        m = _NAME.fullmatch(t.name)
        if m is None:
            raise ValueError("tensor %s of version %d is not an adapter tensor (%s)"
                             % (t.name, snapshot.version, _FORM))
        if len(t.shape) != 2 or min(t.shape) < 1:
            raise ValueError("tensor %s has shape %s: an adapter matrix has 2 dimensions"
                             % (t.name, list(t.shape)))
        side = sides.setdefault((int(m.group(1)), m.group(2)), {})
        if m.group(3) in side:
            raise ValueError("tensor %s comes twice in version %d" % (t.name, snapshot.version))
        side[m.group(3)] = (t.name, list(t.shape))
    rank, layers = None, {}
    for (layer, module), side in sorted(sides.items()):
        stem = "model.layers.%d.%s" % (layer, module)
        for s, other in (("A", "B"), ("B", "A")):
            if s not in side:
                raise ValueError("tensor %s.lora_%s.weight is missing: %s.lora_%s.weight has no pair"
                                 % (stem, s, stem, other))
        (a_name, a), (b_name, b) = side["A"], side["B"]
        if b[1] != a[0]:
            raise ValueError("tensor %s has shape %s, not (out, %d) as %s's rank %d"
                             % (b_name, b, a[0], a_name, a[0]))
        if rank is not None and a[0] != rank:
            raise ValueError("tensor %s has rank %d; the others have %d" % (a_name, a[0], rank))
        rank = a[0]
        layers.setdefault(layer, []).append(module)
    first = min(layers)
    for layer, modules in layers.items():
        if set(modules) != set(layers[first]):
            odd = sorted(set(modules) ^ set(layers[first]))[0]
            raise ValueError("tensor model.layers.%d.%s.lora_A.weight: layer %d adapts %s, layer %d %s "
                             "(a PEFT adapter's target_modules are the same in every layer)"
                             % (layer if odd in modules else first, odd, layer, sorted(modules), first,
                                sorted(layers[first])))
    return rank, [m.split(".")[1] for m in MODULES if m in layers[first]]


def peft_config(rank, lora_alpha, target_modules, base_model):
    """adapter_config.json's dict for the learner's adapters (LoRA, no
    dropout, bias, rsLoRA, DoRA or per-layer patterns)."""
    alpha = int(lora_alpha) if float(lora_alpha).is_integer() else float(lora_alpha)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "target_modules": list(target_modules),
            "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
            "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
            "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": False, "use_dora": False,
            "revision": None}


def write_peft_directory(snapshot, path, lora_alpha, base_model, keep=2):
    """Writes the adapters of `snapshot` (a version of a learner with
    --lora_rank) as a PEFT adapter directory, which vLLM, SGLang and PEFT
    load beside the base: <path>.v<version>/ with adapter_model.safetensors
    (the snapshot's tensors byte for byte, named base_model.model.<name>)
    and adapter_config.json (r and target_modules from the tensors;
    lora_alpha: the learner's --lora_alpha, None for its default 2 r;
    base_model: base_model_name_or_path, the base's directory or hub name,
    or None). The files are fsynced, then renamed into place, and the
    symbolic link `path` is pointed at the directory in one rename, as
    write_hf_directory does; the newest `keep` versions are kept. Returns
    the version directory. ValueError, naming the tensor, for a snapshot
    that is not one of adapters."""
    rank, targets = adapter_layout(snapshot)
    alpha = 2 * rank if lora_alpha is None else lora_alpha
    if not alpha > 0:
        raise ValueError("lora_alpha %r: the adapters' scale alpha / r needs alpha > 0" % (lora_alpha,))
    files = {WEIGHTS_FILE: safetensors_chunks(snapshot, PEFT_PREFIX),
             CONFIG_FILE: [json.dumps(peft_config(rank, alpha, targets, base_model), indent=2).encode()
                           + b"\n"]}
    return write_version_directory(snapshot.version, path, files, keep, "write_peft_directory")


class _Prepared:
    """A version's adapter directory and the name it is loaded under."""

    def __init__(self, version, name, path):
        self.version, self.name, self.path = version, name, path


class _LoRA(_Adapter):
    """load(): write the directory, then (inside _Adapter's pause / resume,
    where the engine has one) load the new adapter, switch to it and unload
    the previous. Subclasses give _add(prepared) -> handle, _remove(handle)
    and _name_of(handle)."""

    def _init_lora(self, path, lora_alpha, base_model, prefix, keep):
        self.path, self.lora_alpha, self.base_model = path, lora_alpha, base_model
        self.prefix, self.keep = prefix, keep
        self.version = self.lora_path = self._held = None
        self.stale = []  # handles whose unload failed: unloaded again at the next load
        self._used, self._loads = set(), 0

    @property
    def lora_name(self):
        """The name to generate with (None before the first load)."""
        return None if self._held is None else self._name_of(self._held)

    def load(self, snapshot):
        """Loads the adapters of `snapshot`; returns the name to generate
        with. EngineError when an engine call fails."""
        return self._sync(self._run(self._prepare(snapshot), False))

    async def aload(self, snapshot):
        """load() for an engine whose calls are coroutines (AsyncLLM)."""
        return await self._run(self._prepare(snapshot), True)

    def _prepare(self, snapshot):
        # Written before any engine call (and before a pause): a snapshot
        # that is not one of adapters fails here, the engine untouched.
        directory = write_peft_directory(snapshot, self.path, self.lora_alpha, self.base_model, self.keep)
        self._loads += 1
        name = "%s-v%d" % (self.prefix, snapshot.version)
        if name in self._used:
            name = "%s-%d" % (name, self._loads)
        self._used.add(name)
        return _Prepared(snapshot.version, name, directory)

    def _describe(self, prepared):
        return "version %d (adapter %s)" % (prepared.version, prepared.name)

    async def _load(self, prepared):
        handle = await self._add(prepared)
        previous = ([self._held] if self._held is not None else []) + self.stale
        self._held, self.version, self.lora_path, self.stale = handle, prepared.version, prepared.path, []
        for old in previous:
            try:
                await self._remove(old)
            except EngineError as e:
                log.warning("%s; adapter %s stays loaded, and is unloaded again at the next load", e,
                            self._name_of(old))
                self.stale.append(old)
        return prepared.name


def _answer_ignored(reply):
    """remove_lora's reply taken as done: True, or False when nothing is
    loaded under that id any more (evicted), which leaves nothing to do."""
    if inspect.isawaitable(reply):
        async def wait():
            await reply
        return wait()
    return None


class VLLMLoRA(_LoRA, _VLLM):
    """Loads each version's adapters into a vLLM engine in this process
    (vllm.LLM or AsyncLLM, started with enable_lora=True): add_lora with a
    LoRARequest of a fresh name and id, then remove_lora of the previous.
    Generate with llm.generate(..., lora_request=adapter.lora_request)."""

    def __init__(self, llm, path, lora_alpha=None, base_model=None, prefix="asympo", pause=False, keep=2):
        """path: where write_peft_directory writes the versions (a link,
        <path>.v<version>/). pause: pause_generation(mode="wait") and
        resume_generation around each load when the engine has them
        (AsyncLLM), so that no request of the previous version runs once
        load() returns; not needed otherwise (see the module)."""
        _VLLM.__init__(self, llm, pause)
        self._init_lora(path, lora_alpha, base_model, prefix, keep)
        self.target = llm if hasattr(llm, "add_lora") else getattr(llm, "llm_engine", None)
        if not hasattr(self.target, "add_lora") or not hasattr(self.target, "remove_lora"):
            raise TypeError("%s has no add_lora / remove_lora (nor has its llm_engine): not a vLLM LLM, "
                            "LLMEngine or AsyncLLM" % type(llm).__name__)
        self._ids = 0

    @property
    def lora_request(self):
        """The LoRARequest to generate with (None before the first load)."""
        return self._held

    @staticmethod
    def _name_of(request):
        return request.lora_name

    async def _add(self, prepared):
        from vllm.lora.request import LoRARequest
        self._ids += 1
        request = LoRARequest(lora_name=prepared.name, lora_int_id=self._ids, lora_path=prepared.path)
        await self._do("add_lora(%s, lora_int_id=%d)" % (prepared.name, self._ids), self.target.add_lora,
                       request)
        return request

    async def _remove(self, request):
        await self._do("remove_lora(%d) of %s" % (request.lora_int_id, request.lora_name),
                       lambda: _answer_ignored(self.target.remove_lora(request.lora_int_id)))

    async def _flush(self):
        pass  # a fresh name: nothing cached belongs to it


class SGLangLoRA(_LoRA):
    """Loads each version's adapters into an in-process `sglang.Engine`
    started with enable_lora=True: load_lora_adapter under a fresh name,
    then unload_lora_adapter of the previous (which waits for its requests).
    Generate with engine.generate(..., lora_path=adapter.lora_name)."""
    engine = "SGLang"

    def __init__(self, engine, path, lora_alpha=None, base_model=None, prefix="asympo", keep=2):
        self.sgl = engine
        self._init_lora(path, lora_alpha, base_model, prefix, keep)

    @staticmethod
    def _name_of(name):
        return name

    async def _add(self, prepared):
        await self._do("load_lora_adapter(%r)" % prepared.name, self.sgl.load_lora_adapter,
                       lora_name=prepared.name, lora_path=prepared.path)
        return prepared.name

    async def _remove(self, name):
        await self._do("unload_lora_adapter(%r)" % name, self.sgl.unload_lora_adapter, lora_name=name)


class _ServerLoRA(_HTTP, _LoRA):
    """POSTs {"lora_name", "lora_path"} to load and {"lora_name"} to unload."""
    load_path = unload_path = hint = None

    def __init__(self, url, path, lora_alpha=None, base_model=None, prefix="asympo", timeout=600.0, keep=2):
        self.url, self.timeout = url.rstrip("/"), timeout
        self._init_lora(path, lora_alpha, base_model, prefix, keep)

    @staticmethod
    def _name_of(name):
        return name

    async def _add(self, prepared):
        try:
            await self._call(self.load_path, {"lora_name": prepared.name, "lora_path": prepared.path})
        except EngineError as e:
            if "HTTP 404" in str(e) and self.hint:
                raise EngineError("%s (%s)" % (e, self.hint)) from e
            raise
        return prepared.name

    async def _remove(self, name):
        await self._call(self.unload_path, {"lora_name": name})


class VLLMServerLoRA(_ServerLoRA):
    """Loads each version's adapters into a vLLM server (OpenAI API) started
    with LoRA enabled and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True. Generate
    with "model": adapter.lora_name."""
    engine = "vLLM server"
    load_path, unload_path = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    hint = "is the server started with LoRA enabled and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?"


class SGLangServerLoRA(_ServerLoRA):
    """Loads each version's adapters into an SGLang server started with
    LoRA enabled (and its max LoRA rank and target modules). Generate with
    "lora_path": adapter.lora_name (/generate), or "model":
    "<base>:<lora_name>" (OpenAI API)."""
    engine = "SGLang server"
    load_path, unload_path = "/load_lora_adapter", "/unload_lora_adapter"
    hint = "is the server recent enough to load adapters at run time?"
