"""The low-rank adapter path of the Python package (asympo_rl.lora) on real
versions of a real asympo-learner started with --lora_rank=4
--lora_alpha=8 on the tiny model (versions 0 and 1, fetched with
WeightSubscriber), up to the engines' own calls: vLLM and SGLang need a GPU
and are not installed here, so stand-ins record the calls, in order, with
their arguments, and fail one on demand; the server adapters talk HTTP to
a real server (http.server).

- write_peft_directory: adapter_model.safetensors holds exactly the
  snapshot's tensors, byte for byte, named base_model.model.<name>;
  adapter_config.json has r 4, lora_alpha 8 and the seven target modules;
  the link points at the newest version and the newest `keep` are kept; a
  version of a learner without --lora_rank, and adapters with a missing
  half, another rank or a foreign tensor, are refused, naming the tensor;
- the same version as the learner's own export (--export_dir, written at
  exit): the same tensors, byte for byte, and the same adapter_config.json;
- VLLMLoRA (vllm.LLM through its llm_engine; AsyncLLM with aload, paused
  on request), VLLMServerLoRA, SGLangLoRA, SGLangServerLoRA: for version 0
  then version 1, the new adapter is loaded under a fresh name from its
  complete directory, then the previous one is unloaded; a version loaded
  again gets a name of its own; a failed load raises EngineError naming the
  call and the reply, keeps the previous adapter, and resumes generation
  where it was paused; a failed unload keeps the load and is retried at
  the next one.

    python3 python_lora_engines_test.py PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc is missing."""
import asyncio
import http.server
import json
import logging
import os
import shutil
import sys
import threading
import time
import types

from learner_client import RunningLearner, check

PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
import asympo_rl  # noqa: E402
from asympo_rl import lora  # noqa: E402
from asympo_rl.engines import EngineError  # noqa: E402

TINY = ["--model=tiny", "--tiny_vocab_size=16", "--threads=1", "--prompts_per_step=2"]
LORA = ["--lora_rank=4", "--lora_alpha=8"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def learner_versions():
    """Versions 0 and 1 of a learner with adapters, and the directory it
    exported at exit."""
    export = os.path.join(WORK, "export")
    runner = RunningLearner(LEARNER, TINY + LORA + ["--export_dir=" + export],
                            os.path.join(WORK, "learner.log"), asympo_rl)
    with runner as (target, new_version):
        sub = asympo_rl.WeightSubscriber(target, receiver_id="lora-engines-test")
        snapshots = sub.snapshots()
        v0 = next(snapshots)
        new_version()
        v1 = next(snapshots)
        sub.close()
    check((v0.version, v1.version) == (0, 1), "the learner's versions 0 and 1 arrived")
    check(runner.proc.returncode == 0, "the learner stopped cleanly (exit %s)" % runner.proc.returncode)
    return v0, v1, os.path.join(export, "adapter")


def full_version():
    """Version 0 of a learner that trains every weight."""
    with RunningLearner(LEARNER, TINY, os.path.join(WORK, "base-learner.log"), asympo_rl) as (target, _):
        sub = asympo_rl.WeightSubscriber(target, receiver_id="lora-engines-test-base")
        snap = next(sub.snapshots())
        sub.close()
    return snap


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def expected(snap):
    """The snapshot's tensors as a PEFT directory must hold them."""
    out = {}
    for t in snap.manifest.tensors:
        raw = bytes(snap.buckets[t.bucket][t.offset:t.offset + t.size_bytes])
        out["base_model.model." + t.name] = (asympo_rl.weights.DTYPES[t.dtype][0], list(t.shape), raw)
    return out


def holds(directory, snap):
    """Whether `directory` is a complete PEFT directory of `snap`."""
    try:
        tensors = read_safetensors(os.path.join(directory, "adapter_model.safetensors"))
        with open(os.path.join(directory, "adapter_config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return tensors == expected(snap) and config["r"] == 4 and config["lora_alpha"] == 8


def edited(snap, edit):
    """A copy of `snap` whose manifest `edit(manifest)` changed."""
    m = type(snap.manifest)()
    m.CopyFrom(snap.manifest)
    edit(m)
    return asympo_rl.Snapshot(m, snap.buckets)


def refused(snap, *words):
    try:
        lora.write_peft_directory(snap, os.path.join(WORK, "refused", "adapter"), 8, "tiny")
    except ValueError as e:
        print("   ValueError:", e)
        return all(w in str(e) for w in words)
    return False


def peft_directory(v0, v1, base_snap):
    path = os.path.join(WORK, "peft", "adapter")
    d0 = lora.write_peft_directory(v0, path, 8, "tiny")
    check(d0 == path + ".v0" and os.path.realpath(path) == d0, "version 0 written to %s, the link points at it" % d0)
    tensors = read_safetensors(os.path.join(d0, "adapter_model.safetensors"))
    want = expected(v0)
    check(list(tensors) == list(want) and tensors == want and len(want) == 3 * 7 * 2,
          "adapter_model.safetensors holds exactly the snapshot's %d tensors, byte for byte, under "
          "base_model.model.<name>" % len(want))
    with open(os.path.join(d0, "adapter_config.json")) as f:
        config = json.load(f)
    check(config == lora.peft_config(4, 8, TARGETS, "tiny") and isinstance(config["lora_alpha"], int) and
          (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8, TARGETS),
          "adapter_config.json: LORA, r 4, lora_alpha 8 (an int), the seven target modules")
    d1 = lora.write_peft_directory(v1, path, None, "tiny")
    with open(os.path.join(d1, "adapter_config.json")) as f:
        check(json.load(f)["lora_alpha"] == 8, "lora_alpha None is the learner's default, twice the rank")
    v2 = edited(v1, lambda m: setattr(m, "version", 2))
    lora.write_peft_directory(v2, path, 8, "tiny")
    left = sorted(n for n in os.listdir(os.path.dirname(path)))
    check(left == ["adapter", "adapter.v1", "adapter.v2"] and holds(d1, v1),
          "the newest two versions are kept, no temporary left: %s" % left)

    check(refused(base_snap, "no adapter tensors", base_snap.manifest.tensors[0].name, "--lora_rank"),
          "a version of a learner without --lora_rank is refused, saying why")
    a = "model.layers.1.mlp.up_proj.lora_A.weight"
    b = "model.layers.1.mlp.up_proj.lora_B.weight"
    index = {t.name: i for i, t in enumerate(v1.manifest.tensors)}
    def drop_b(m):
        del m.tensors[index[b]]
    check(refused(edited(v1, drop_b), b, "missing"),
          "an adapted projection without its lora_B is refused, naming the tensor")
    check(refused(edited(v1, lambda m: m.tensors[index[b]].shape.__setitem__(1, 8)), b, "rank"),
          "a lora_B of another rank is refused, naming the tensor")
    check(refused(edited(v1, lambda m: setattr(m.tensors[index[a]], "name", "model.layers.1.mlp.up_proj.weight")),
                  "model.layers.1.mlp.up_proj.weight", "not an adapter tensor"),
          "a tensor that is not an adapter's is refused, naming it")


def same_as_export(v0, v1, export):
    tensors = read_safetensors(os.path.join(export, "adapter_model.safetensors"))
    version = next((s.version for s in (v1, v0) if tensors == expected(s)), None)
    check(version == 1, "the learner's export at exit is version 1: write_peft_directory of version 1 writes "
          "the same %d tensors (names, float32, shapes, bytes)" % len(tensors))
    mine = lora.write_peft_directory(v1, os.path.join(WORK, "export-compare", "adapter"), 8, "tiny")
    check(read_safetensors(os.path.join(mine, "adapter_model.safetensors")) == tensors,
          "adapter_model.safetensors: byte for byte the export's tensors")
    with open(os.path.join(export, "adapter_config.json")) as f:
        theirs = json.load(f)
    with open(os.path.join(mine, "adapter_config.json")) as f:
        ours = json.load(f)
    check(ours == theirs and (theirs["r"], theirs["lora_alpha"], theirs["target_modules"]) == (4, 8, TARGETS),
          "adapter_config.json: the export's, key for key (r 4, lora_alpha 8, the seven targets)")


class LoRARequest:
    """vllm.lora.request.LoRARequest: keyword fields."""

    def __init__(self, *, lora_name, lora_int_id, lora_path=""):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


def install_vllm_stand_in():
    modules = {n: types.ModuleType(n) for n in ("vllm", "vllm.lora", "vllm.lora.request")}
    modules["vllm"].lora = modules["vllm.lora"]
    modules["vllm.lora"].request = modules["vllm.lora.request"]
    modules["vllm.lora.request"].LoRARequest = LoRARequest
    sys.modules.update(modules)


class VLLMEngine:
    """vLLM's LLMEngine: add_lora / remove_lora; records each call, and for
    add_lora whether the directory was complete then."""

    def __init__(self, calls, snaps):
        self.calls, self.snaps, self.loaded, self.fail = calls, snaps, {}, {}

    def _maybe_fail(self, name):
        if name in self.fail:
            raise self.fail.pop(name)

    def add_lora(self, lora_request):
        r = lora_request
        complete = holds(r.lora_path, self.snaps[int(r.lora_path.rsplit(".v", 1)[1])])
        self.calls.append(("add_lora", r.lora_name, r.lora_int_id, complete))
        self._maybe_fail("add_lora")
        self.loaded[r.lora_int_id] = r
        return self.fail.pop("add_answer", True)

    def remove_lora(self, lora_id):
        self.calls.append(("remove_lora", lora_id))
        self._maybe_fail("remove_lora")
        return self.loaded.pop(lora_id, None) is not None


class LLM:
    """vllm.LLM: no add_lora of its own, an llm_engine that has it."""

    def __init__(self, engine):
        self.llm_engine = engine


class AsyncLLM:
    """vLLM's AsyncLLM: coroutines, pause_generation with mode."""

    def __init__(self, engine):
        self.engine, self.calls = engine, engine.calls

    async def add_lora(self, lora_request):
        return self.engine.add_lora(lora_request)

    async def remove_lora(self, lora_id):
        return self.engine.remove_lora(lora_id)

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        self.calls.append(("pause_generation", mode))
        self.engine._maybe_fail("pause_generation")

    async def resume_generation(self):
        self.calls.append(("resume_generation",))


def raises(fn, *words):
    """Runs fn; whether it raised EngineError whose text has every word."""
    try:
        fn()
    except EngineError as e:
        print("   EngineError:", e)
        return all(w in str(e) for w in words)
    return False


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []
        logging.getLogger("asympo_rl.lora").addHandler(self)

    def emit(self, record):
        self.seen.append(record.getMessage())


def vllm_in_process(v0, v1, warned):
    calls = []
    engine = VLLMEngine(calls, {0: v0, 1: v1})
    adapter = lora.VLLMLoRA(LLM(engine), os.path.join(WORK, "vllm", "adapter"), lora_alpha=8, base_model="tiny")
    check(adapter.load(v0) == "asympo-v0" and calls == [("add_lora", "asympo-v0", 1, True)] and
          adapter.lora_request.lora_path == os.path.join(WORK, "vllm", "adapter.v0"),
          "vLLM LLM, version 0: llm_engine.add_lora(LoRARequest('asympo-v0', 1, <its complete directory>))")
    calls.clear()
    adapter.load(v1)
    check(calls == [("add_lora", "asympo-v1", 2, True), ("remove_lora", 1)] and adapter.lora_name == "asympo-v1"
          and adapter.version == 1 and set(engine.loaded) == {2},
          "vLLM LLM, version 1: add_lora('asympo-v1', 2) from its complete directory, then remove_lora(1)")
    calls.clear()
    adapter.load(v1)
    check(calls == [("add_lora", "asympo-v1-3", 3, True), ("remove_lora", 2)],
          "the same version loaded again: a name and an id of its own (asympo-v1-3, 3)")
    calls.clear()
    engine.fail = {"add_lora": RuntimeError("LoRA rank 4 is greater than max_lora_rank 1")}
    check(raises(lambda: adapter.load(v0), "vLLM", "add_lora(asympo-v0", "max_lora_rank 1") and
          calls == [("add_lora", "asympo-v0-4", 4, True)] and adapter.lora_name == "asympo-v1-3",
          "vLLM: a failed add_lora names the call and the error; the previous adapter stays in use, none removed")
    engine.fail = {"add_answer": False}
    check(raises(lambda: adapter.load(v0), "add_lora", "answered False") and adapter.lora_name == "asympo-v1-3",
          "vLLM: add_lora answering False fails the load")
    calls.clear()
    engine.fail = {"remove_lora": RuntimeError("engine core busy")}
    adapter.load(v1)
    check(adapter.lora_name == "asympo-v1-6" and [r.lora_int_id for r in adapter.stale] == [3] and
          any("remove_lora(3)" in w and "engine core busy" in w for w in warned.seen),
          "vLLM: a failed remove_lora keeps the load (asympo-v1-6 in use), is logged, and is kept for later")
    calls.clear()
    engine.loaded.pop(3)
    adapter.load(v0)
    check(calls == [("add_lora", "asympo-v0-7", 7, True), ("remove_lora", 6), ("remove_lora", 3)] and
          not adapter.stale, "the next load removes the previous adapter and the one left over "
          "(remove_lora answering False, nothing loaded under 3 any more, is no failure)")
    try:
        lora.VLLMLoRA(object(), os.path.join(WORK, "vllm", "adapter"))
        check(False, "an object without add_lora is refused")
    except TypeError as e:
        check("add_lora" in str(e), "an object without add_lora is refused: %s" % e)


def vllm_async(v0, v1):
    calls = []
    llm = AsyncLLM(VLLMEngine(calls, {0: v0, 1: v1}))
    path = os.path.join(WORK, "vllm-async", "adapter")
    adapter = lora.VLLMLoRA(llm, path, lora_alpha=8, pause=True)
    check(raises(lambda: adapter.load(v0), "pause_generation", "aload") and calls == [],
          "load() refuses an AsyncLLM, naming aload()")
    asyncio.run(adapter.aload(v0))
    asyncio.run(adapter.aload(v1))
    check(calls == [("pause_generation", "wait"), ("add_lora", "asympo-v0-2", 1, True), ("resume_generation",),
                    ("pause_generation", "wait"), ("add_lora", "asympo-v1", 2, True), ("remove_lora", 1),
                    ("resume_generation",)],
          "vLLM AsyncLLM with pause=True: pause_generation(mode='wait'), add_lora, remove_lora of the previous, "
          "resume_generation")
    calls.clear()
    llm.engine.fail = {"add_lora": RuntimeError("No adapter found")}
    check(raises(lambda: asyncio.run(adapter.aload(v0)), "add_lora", "No adapter found") and
          calls[0] == ("pause_generation", "wait") and calls[-1] == ("resume_generation",) and
          adapter.lora_name == "asympo-v1", "a failed add_lora: EngineError; generation resumed, asympo-v1 in use")
    calls.clear()
    llm.engine.fail = {"pause_generation": RuntimeError("engine dead")}
    check(raises(lambda: asyncio.run(adapter.aload(v0)), "pause_generation", "engine dead") and
          calls == [("pause_generation", "wait"), ("resume_generation",)],
          "a failed pause loads nothing and still resumes")
    calls.clear()
    asyncio.run(lora.VLLMLoRA(llm, path, lora_alpha=8, prefix="other").aload(v1))
    check(calls == [("add_lora", "other-v1", 1, True)], "without pause=True: no pause, no resume")


class SGLangEngine:
    """sglang.Engine: load_lora_adapter / unload_lora_adapter answer
    LoRAUpdateOutput(success, error_message, loaded_adapters)."""

    class LoRAUpdateOutput:
        def __init__(self, success, error_message=None, loaded_adapters=None):
            self.success, self.error_message, self.loaded_adapters = success, error_message, loaded_adapters

        def __repr__(self):
            return "LoRAUpdateOutput(success=%r, error_message=%r)" % (self.success, self.error_message)

    def __init__(self, calls, snaps):
        self.calls, self.snaps, self.loaded, self.fail = calls, snaps, {}, {}

    def load_lora_adapter(self, lora_name, lora_path, pinned=False):
        complete = holds(lora_path, self.snaps[int(lora_path.rsplit(".v", 1)[1])])
        self.calls.append(("load_lora_adapter", lora_name, complete))
        if "load" in self.fail:
            return self.LoRAUpdateOutput(False, self.fail.pop("load"))
        self.loaded[lora_name] = lora_path
        return self.LoRAUpdateOutput(True, None, dict(self.loaded))

    def unload_lora_adapter(self, lora_name):
        self.calls.append(("unload_lora_adapter", lora_name))
        if "unload" in self.fail:
            return self.LoRAUpdateOutput(False, self.fail.pop("unload"))
        self.loaded.pop(lora_name)
        return self.LoRAUpdateOutput(True, None, dict(self.loaded))


def sglang_in_process(v0, v1):
    calls = []
    engine = SGLangEngine(calls, {0: v0, 1: v1})
    adapter = lora.SGLangLoRA(engine, os.path.join(WORK, "sglang", "adapter"), lora_alpha=8, prefix="run7")
    adapter.load(v0)
    adapter.load(v1)
    check(calls == [("load_lora_adapter", "run7-v0", True), ("load_lora_adapter", "run7-v1", True),
                    ("unload_lora_adapter", "run7-v0")] and list(engine.loaded) == ["run7-v1"] and
          adapter.lora_name == "run7-v1",
          "SGLang Engine, versions 0 then 1: load_lora_adapter (complete directory), then unload of the previous")
    calls.clear()
    engine.fail = {"load": "LoRA rank 4 exceeds max_lora_rank"}
    check(raises(lambda: adapter.load(v0), "SGLang", "load_lora_adapter('run7-v0", "exceeds max_lora_rank") and
          calls == [("load_lora_adapter", "run7-v0-3", True)] and adapter.lora_name == "run7-v1",
          "SGLang Engine: success false names the call and its error_message; the previous adapter stays")
    engine.fail = {"unload": "LoRA with name run7-v1 does not exist"}
    adapter.load(v0)
    check(adapter.lora_name == "run7-v0-4" and adapter.stale == ["run7-v1"],
          "SGLang Engine: a failed unload keeps the load and the name for the next one")


class Server:
    """A real HTTP server in the engine's place: records each request and
    whether the lora_path it names was a complete directory then; answers
    answers[path] = (status, body)."""

    def __init__(self, snaps, ok):
        self.seen, self.answers = [], {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                path = body.get("lora_path")
                complete = path and holds(path, snaps[int(path.rsplit(".v", 1)[1])])
                owner.seen.append((self.path, body.get("lora_name"), complete))
                status, reply = owner.answers.pop(self.path, (200, ok))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(reply.encode())

            def log_message(self, *a):
                pass
        self.http = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.http.server_port

    def close(self):
        self.http.shutdown()
        self.http.server_close()


def vllm_server(v0, v1):
    server = Server({0: v0, 1: v1}, "Success: LoRA adapter added successfully.")
    adapter = lora.VLLMServerLoRA(server.url, os.path.join(WORK, "vllm-server", "adapter"), 8, "tiny")
    adapter.load(v0)
    adapter.load(v1)
    check(server.seen == [("/v1/load_lora_adapter", "asympo-v0", True), ("/v1/load_lora_adapter", "asympo-v1", True),
                          ("/v1/unload_lora_adapter", "asympo-v0", None)] and adapter.lora_name == "asympo-v1",
          "vLLM server, versions 0 then 1: POST /v1/load_lora_adapter (complete directory), then "
          "/v1/unload_lora_adapter of the previous")
    server.answers = {"/v1/load_lora_adapter": (400, '{"error": {"message": "LoRA rank 4 is greater than '
                                                     'max_lora_rank 1", "code": 400}}')}
    check(raises(lambda: adapter.load(v0), "vLLM server", "POST /v1/load_lora_adapter", "HTTP 400",
                 "max_lora_rank") and adapter.lora_name == "asympo-v1",
          "vLLM server: HTTP 400 names the call and the reply; the previous adapter stays in use")
    server.answers = {"/v1/load_lora_adapter": (404, '{"detail": "Not Found"}')}
    check(raises(lambda: adapter.load(v0), "HTTP 404", "VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
          "vLLM server without the LoRA endpoints (HTTP 404): the error says how to start it")
    server.close()


def sglang_server(v0, v1):
    server = Server({0: v0, 1: v1}, '{"success": true, "error_message": null, "loaded_adapters": {}}')
    adapter = lora.SGLangServerLoRA(server.url, os.path.join(WORK, "sglang-server", "adapter"), 8, "tiny")
    adapter.load(v0)
    adapter.load(v1)
    check(server.seen == [("/load_lora_adapter", "asympo-v0", True), ("/load_lora_adapter", "asympo-v1", True),
                          ("/unload_lora_adapter", "asympo-v0", None)],
          "SGLang server, versions 0 then 1: POST /load_lora_adapter (complete directory), then "
          "/unload_lora_adapter of the previous")
    for status in (400, 200):
        server.answers = {"/load_lora_adapter": (status, '{"success": false, "error_message": "Failed to load '
                                                         'LoRA adapter: target modules differ"}')}
        check(raises(lambda: adapter.load(v0), "SGLang server", "POST /load_lora_adapter", "target modules differ")
              and adapter.lora_name == "asympo-v1",
              "SGLang server: success false (HTTP %d) names the reply; the previous adapter stays" % status)
    server.seen.clear()
    server.answers = {"/unload_lora_adapter": (400, '{"success": false, "error_message": "no such adapter"}')}
    adapter.load(v0)
    adapter.load(v1)
    check([p for p, _, _ in server.seen] == ["/load_lora_adapter", "/unload_lora_adapter"] * 2 +
          ["/unload_lora_adapter"] and not adapter.stale,
          "SGLang server: a failed unload is tried again at the next load, after the new adapter is in")
    server.close()
    check(raises(lambda: lora.SGLangServerLoRA(server.url, os.path.join(WORK, "down", "a"), 8, timeout=5).load(v0),
                 "POST /load_lora_adapter"), "a server that is down: EngineError naming the call")


def main():
    t0 = time.time()
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    v0, v1, export = learner_versions()
    peft_directory(v0, v1, full_version())
    same_as_export(v0, v1, export)
    install_vllm_stand_in()
    warned = Warnings()
    vllm_in_process(v0, v1, warned)
    vllm_async(v0, v1)
    sglang_in_process(v0, v1)
    vllm_server(v0, v1)
    sglang_server(v0, v1)
    print("all adapter checks passed in %.1f s" % (time.time() - t0))


main()
