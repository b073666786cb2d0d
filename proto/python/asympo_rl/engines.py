"""Adapters that hand a Snapshot to an inference engine.

Which engine call loads the weights, and in what order (each adapter's
load() does the steps in this order; docs/external_generators.md):

vLLM, in process (an `LLM` whose model runs in this process: the V0 engine,
tensor parallel 1):
    1. model = llm.llm_engine.model_executor.driver_worker.model_runner.model
       (or ...driver_worker.worker.model_runner.model, by version)
    2. model.load_weights(snapshot.tensors("torch"))   # HF names, in place
    3. llm.reset_prefix_cache()                        # cached KV is stale
vLLM, from disk (the V1 engine, tensor parallel > 1, or a server): start the
engine on the link that write_hf_directory maintains, then per version
    1. write_hf_directory(snapshot, link, config)
    2. llm.collective_rpc("reload_weights")            # every worker re-reads the link
    3. llm.reset_prefix_cache()
SGLang, in process (`sglang.Engine`):
    1. engine.update_weights_from_tensor(named_tensors=list(snapshot.tensors("torch")))
    2. engine.flush_cache()
SGLang server (HTTP), from disk:
    1. write_hf_directory(snapshot, link, config)
    2. POST <url>/update_weights_from_disk {"model_path": link}
    3. POST <url>/flush_cache

Then report the version: subscriber.report(snapshot.version). Generation
must not run during steps 1-3 (call load() between batches, as the
project's rollout daemon does).

vLLM and SGLang cannot be installed on the machine these adapters are tested
on (no GPU, no package index): the tests run everything up to the engine's
own call, against stand-ins that record it (and, for the SGLang server, a
real HTTP server that records the requests)."""
import json
import urllib.request

from .weights import write_hf_directory

_VLLM_MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),
)


def _walk(obj, path):
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


class VLLMInProcess:
    """Loads each snapshot into an in-process vLLM `LLM` in place."""

    def __init__(self, llm):
        self.llm = llm
        self.model = next((m for m in (_walk(llm, p) for p in _VLLM_MODEL_PATHS) if m is not None), None)
        if self.model is None or not hasattr(self.model, "load_weights"):
            raise TypeError("this vLLM LLM keeps its model in another process (V1 engine or tensor "
                            "parallel > 1): use VLLMFromDisk")

    def load(self, snapshot):
        self.model.load_weights(snapshot.tensors("torch"))
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()


class VLLMFromDisk:
    """Writes each snapshot to `link` (the path the engine was started
    with) and has every vLLM worker reload it."""

    def __init__(self, llm, link, config, extra_files=None):
        self.llm, self.link, self.config, self.extra = llm, link, config, extra_files

    def load(self, snapshot):
        write_hf_directory(snapshot, self.link, self.config, self.extra)
        self.llm.collective_rpc("reload_weights")
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()


class SGLangInProcess:
    """Loads each snapshot into an in-process `sglang.Engine` in place."""

    def __init__(self, engine):
        self.engine = engine

    def load(self, snapshot):
        self.engine.update_weights_from_tensor(named_tensors=list(snapshot.tensors("torch")))
        self.engine.flush_cache()


class SGLangServer:
    """Writes each snapshot to `link` and asks an SGLang server (HTTP) to
    load it from there."""

    def __init__(self, url, link, config, extra_files=None, timeout=600.0):
        self.url, self.link, self.config = url.rstrip("/"), link, config
        self.extra, self.timeout = extra_files, timeout

    def _post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            text = r.read().decode() or "{}"
        try:
            return json.loads(text)
        except ValueError:
            return {"success": True, "message": text}

    def load(self, snapshot):
        write_hf_directory(snapshot, self.link, self.config, self.extra)
        reply = self._post("/update_weights_from_disk", {"model_path": self.link})
        if reply.get("success") is False:
            raise RuntimeError("SGLang refused version %d: %s" % (snapshot.version, reply.get("message")))
        self._post("/flush_cache", {})
