"""The engine adapters (asympo_rl.engines) on real snapshots of a real
asympo-learner (tiny model; versions 0 and 1, fetched with
WeightSubscriber), up to the engine's own calls: vLLM and SGLang need a GPU
and are not installed here, so stand-ins record the calls, in order, with
their arguments, and fail one on demand; the SGLang server adapter talks
HTTP to a real server (http.server) that answers success true or false and
HTTP errors.

- VLLMWorkerExtension mixes into a worker class as vLLM mixes it (no name
  of it clashes with a current vLLM worker's), and every worker's model gets
  every tensor byte for byte through collective_rpc, the arguments carried
  as vLLM's msgpack transport carries them (lists, bytes);
- VLLMFromTensors: pause (mode "wait"; the older wait_for_inflight_requests
  for old AsyncLLMs), a collective_rpc per bucket, reset_prefix_cache,
  resume; a sync LLM is not paused; load() refuses an async engine;
- VLLMFromDisk: the link points at the new version, complete, when
  reload_weights runs, for version 0 then version 1; an engine started on
  another path is refused;
- VLLMServer: the same through a vLLM server's HTTP endpoints;
- SGLangInProcess from tensors and from disk; SGLangServer;
- from the learner's weight group (a second learner, --weight_group=gloo):
  VLLMFromGroup joins every worker of a stand-in engine on its first load
  (asympo_join_weight_group, one member per worker), then per load pauses,
  has every worker receive the version (asympo_receive_group_update, each
  bucket to load_weights as it arrives), resets the prefix cache and
  resumes; a load that finds no new version loads and resets nothing; a
  worker whose load_weights fails fails the load (EngineError, resumed),
  the next load has both workers load that version again, and the group
  goes on to the next version; SGLangFromGroup does the same
  through update_weights_from_tensor per bucket from a receiver in this
  process. Every worker's tensors are, byte for byte, a gRPC fetch of the
  same version;
- every failure (raise, success false, reset_prefix_cache False, HTTP 400
  and 500, a server that is down) raises EngineError naming the call and
  the reply, and generation is resumed all the same.

    python3 python_engines_test.py PKG_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc or torch is missing."""
import asyncio
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

from learner_client import RunningLearner, check, free_port, on_threads

PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
try:
    import torch
except ImportError as e:  # pragma: no cover
    print("SKIP: torch missing:", e)
    sys.exit(77)
import asympo_rl  # noqa: E402
from asympo_rl import engines as eng  # noqa: E402

CONFIG = {"model_type": "qwen3"}


def real_snapshots():
    """Versions 0 and 1 of a tiny learner, as a subscriber receives them."""
    os.makedirs(WORK, exist_ok=True)
    port = free_port()
    log = open(os.path.join(WORK, "learner.log"), "w")
    proc = subprocess.Popen([LEARNER, "--listen=127.0.0.1:%d" % port, "--metrics_address=", "--model=tiny",
                             "--tiny_vocab_size=16", "--threads=1", "--prompts_per_step=2"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        sub = asympo_rl.WeightSubscriber("127.0.0.1:%d" % port, receiver_id="engines-test")
        snapshots = sub.snapshots()
        first = next(snapshots)
        client = asympo_rl.LearnerClient("127.0.0.1:%d" % port, source="engines-test")
        client.submit([asympo_rl.group([1, 4, 8 + g, 3], [([8 + g, 2], 1.0), ([9, 2], 0.0)], prompt_id="e%d" % g)
                       for g in range(2)])
        second = next(snapshots)
        sub.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    check((first.version, second.version) == (0, 1), "the learner's versions 0 and 1 arrived")
    return first, second


def rebucketed(snap, per_bucket):
    """The same tensors and bytes in buckets of `per_bucket` tensors each
    (the tiny model fits one bucket of the learner's 1 MiB minimum)."""
    from asympo_rl.crc32c import crc32c
    m = type(snap.manifest)()
    m.CopyFrom(snap.manifest)
    del m.buckets[:]
    buckets = []
    for i, t in enumerate(m.tensors):
        if i % per_bucket == 0:
            buckets.append(bytearray())
        old = snap.manifest.tensors[i]
        t.bucket, t.offset = len(buckets) - 1, len(buckets[-1])
        buckets[-1] += snap.buckets[old.bucket][old.offset:old.offset + old.size_bytes]
    for i, b in enumerate(buckets):
        m.buckets.add(index=i, size_bytes=len(b), crc32c=crc32c(b))
    asympo_rl.weights.check_manifest(m)
    return asympo_rl.Snapshot(m, buckets)


def same(pairs, snap):
    """Whether the (name, tensor) pairs are the snapshot's, byte for byte."""
    want = dict(snap.tensors("torch"))
    got = {n: t for n, t in pairs}
    return (sorted(got) == sorted(want) and len(got) == len(pairs) and
            all(got[n].dtype == want[n].dtype and got[n].shape == want[n].shape and
                got[n].cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() ==
                want[n].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for n in want))


def wire(x):
    """As vLLM's msgpack transport delivers arguments: tuples as lists,
    bytearrays as bytes."""
    if isinstance(x, (list, tuple)):
        return [wire(v) for v in x]
    return bytes(x) if isinstance(x, bytearray) else x


class Model:
    def __init__(self):
        self.loaded = []
        self.fail = None  # raised by the next load_weights

    def load_weights(self, weights):
        if self.fail is not None:
            self.fail, e = None, self.fail
            raise e
        self.loaded.extend((n, t.clone()) for n, t in weights)
        return {n for n, _ in weights}


class WorkerBase:
    pass


# The names of a current vLLM GPU worker that an extension could clash with.
class Worker(WorkerBase):
    def update_weights(self, update_info):
        pass

    def reload_weights(self, *args, **kwargs):
        pass

    def init_weight_transfer_engine(self, init_info):
        pass

    def load_model(self):
        pass

    def sleep(self, level=1):
        pass

    def wake_up(self, tags=None):
        pass

    def __init__(self):
        self.device = torch.device("cpu")
        self.model_runner = type("Runner", (), {})()
        self.model_runner.model = Model()


def extend(worker_class, extension):
    """What vLLM's WorkerWrapperBase.init_worker does with
    worker_extension_cls: refuse clashing names, then inherit."""
    for attr in dir(extension):
        if not attr.startswith("__"):
            check(not hasattr(worker_class, attr), "the extension's %s clashes with no name of the worker" % attr)
    worker_class.__bases__ = worker_class.__bases__ + (extension,)


class LLM:
    """vllm.LLM (sync, no pause) over `workers` extended workers."""

    def __init__(self, calls, workers=2, model=None, fail=None):
        self.calls, self.fail = calls, fail or {}
        self.workers = [Worker() for _ in range(workers)]
        for rank, w in enumerate(self.workers):
            w.rank = rank
        self.llm_engine = type("Engine", (), {})()
        self.llm_engine.model_config = type("ModelConfig", (), {"model": model or "/models/base"})()
        self.reload = None  # what reload_weights does

    def _maybe_fail(self, name):
        if name in self.fail:
            raise self.fail[name]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("collective_rpc", method))
        self._maybe_fail(method)
        if method == "reload_weights":
            return [self.reload(w) for w in self.workers]
        # Each worker runs the call at once, as vLLM's worker processes do.
        # Every worker at once; a worker's error raised again, as vLLM does.
        return on_threads(lambda w: getattr(w, method)(*wire(args), **(kwargs or {})), self.workers)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        self._maybe_fail("reset_prefix_cache")
        return self.fail.get("reset_prefix_cache_answer", True)


class AsyncLLM(LLM):
    """vllm.v1 AsyncLLM: coroutines, pause_generation with mode."""

    async def pause_generation(self, *, mode="abort", wait_for_inflight_requests=None, clear_cache=True):
        self.calls.append(("pause_generation", mode))
        self._maybe_fail("pause_generation")

    async def resume_generation(self):
        self.calls.append(("resume_generation",))
        self._maybe_fail("resume_generation")

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return LLM.collective_rpc(self, method, timeout, args, kwargs)

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        return LLM.reset_prefix_cache(self)


class OldAsyncLLM(AsyncLLM):
    async def pause_generation(self, wait_for_inflight_requests=False, clear_cache=True):
        self.calls.append(("pause_generation", "wait" if wait_for_inflight_requests else "abort"))


def raises(fn, *words):
    """Runs fn; returns whether it raised EngineError whose text has every word."""
    try:
        fn()
    except eng.EngineError as e:
        text = str(e)
        print("   EngineError:", text)
        return all(w in text for w in words)
    return False


def vllm_tensors(snap):
    extend(Worker, eng.VLLMWorkerExtension)
    buckets = len(list(eng.bucket_tensors_spec(snap)))
    check(buckets > 1, "a snapshot of %d buckets" % buckets)
    calls = []
    llm = LLM(calls)
    eng.VLLMFromTensors(llm).load(snap)
    check(calls == [("collective_rpc", "asympo_load_bucket")] * buckets + [("reset_prefix_cache",)],
          "vLLM LLM: a collective_rpc per bucket (%d), then reset_prefix_cache, no pause" % buckets)
    check(all(same(w.model_runner.model.loaded, snap) for w in llm.workers),
          "each of 2 workers' load_weights got all %d tensors, byte for byte" % len(snap.names()))

    calls.clear()
    asyncio.run(eng.VLLMFromTensors(AsyncLLM(calls)).aload(snap))
    check(calls == [("pause_generation", "wait")] + [("collective_rpc", "asympo_load_bucket")] * buckets +
          [("reset_prefix_cache",), ("resume_generation",)],
          "vLLM AsyncLLM: pause_generation(mode='wait'), the buckets, reset_prefix_cache, resume")
    calls.clear()
    asyncio.run(eng.VLLMFromTensors(OldAsyncLLM(calls)).aload(snap))
    check(calls[0] == ("pause_generation", "wait"), "an older AsyncLLM is paused with "
          "wait_for_inflight_requests=True")
    calls.clear()
    check(raises(lambda: eng.VLLMFromTensors(AsyncLLM(calls)).load(snap), "pause_generation", "aload"),
          "load() refuses an async engine, naming aload()")

    def failing(**fail):
        calls.clear()
        return lambda: asyncio.run(eng.VLLMFromTensors(AsyncLLM(calls, fail=fail)).aload(snap))
    check(raises(failing(asympo_load_bucket=RuntimeError("CUDA out of memory")),
                 "collective_rpc('asympo_load_bucket')", "version %d" % snap.version, "CUDA out of memory") and
          calls == [("pause_generation", "wait"), ("collective_rpc", "asympo_load_bucket"),
                    ("resume_generation",)],
          "a failed bucket: no cache reset, generation resumed, the error names the call and its reply")
    check(raises(failing(reset_prefix_cache_answer=False), "reset_prefix_cache", "answered False") and
          calls[-1] == ("resume_generation",), "reset_prefix_cache answering False fails; resumed")
    check(raises(failing(pause_generation=RuntimeError("engine dead")), "pause_generation", "engine dead") and
          calls == [("pause_generation", "wait"), ("resume_generation",)],
          "a failed pause loads nothing and still resumes")
    check(raises(failing(asympo_load_bucket=RuntimeError("bad shard"),
                         resume_generation=RuntimeError("engine gone")), "bad shard", "and then",
                 "resume_generation", "engine gone"),
          "a failed resume after a failed load reports both")
    for bad, word in (([["w", "F32", [4], 0, 16]], "does not fit"), ([["w", "I8", [8], 0, 8]], "unknown dtype")):
        try:
            eng.tensors_from_bucket(bad, b"\0" * 8)
            check(False, "a tensor outside its bucket is refused")
        except ValueError as e:
            check("tensor w" in str(e) and word in str(e), "the worker refuses a bad tensor entry: %s" % e)
    calls.clear()
    bare = LLM(calls)
    bare.workers = [type("Plain", (), {"asympo_load_bucket": lambda self, *a: None})()]
    check(raises(lambda: eng.VLLMFromTensors(bare).load(snap), "worker_extension_cls"),
          "workers without the extension's answer point at worker_extension_cls")


def vllm_disk(v0, v1):
    link = os.path.join(WORK, "vllm", "model")
    calls, seen = [], []
    llm = LLM(calls, model=link)

    def reload(worker):  # Worker.reload_weights: re-read the model path
        seen.append((worker, os.path.realpath(link),
                     list(eng.tensors_from_bucket(*safetensors(os.path.join(link, "model.safetensors"))))))
    llm.reload = reload
    adapter = eng.VLLMFromDisk(llm, link, CONFIG)
    for snap in (v0, v1):
        calls.clear()
        seen.clear()
        adapter.load(snap)
        check(calls == [("collective_rpc", "reload_weights"), ("reset_prefix_cache",)] and len(seen) == 2 and
              all(s[1].endswith("model.v%d" % snap.version) and same(s[2], snap) for s in seen),
              "vLLM from disk, version %d: each worker's reload_weights read that version, complete, "
              "through the link" % snap.version)
    check(not same(list(v0.tensors("torch")), v1), "versions 0 and 1 differ (the reload read new bytes)")
    try:
        eng.VLLMFromDisk(LLM(calls, model="/models/base"), link, CONFIG)
        check(False, "an engine started on another path is refused")
    except ValueError as e:
        check("/models/base" in str(e), "an engine started on another path is refused: %s" % e)


def safetensors(path):
    """(tensors, data) of a safetensors file, as bucket_tensors_spec gives."""
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return ([[k, v["dtype"], v["shape"], v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0]]
             for k, v in header.items() if k != "__metadata__"], raw[8 + n:])


class SGLangEngine:
    def __init__(self, calls, answers=None, pausable=True):
        self.calls, self.answers, self.got = calls, answers or {}, []
        if pausable:
            self.pause_generation = lambda mode: calls.append(("pause_generation", mode))
            self.continue_generation = lambda: calls.append(("continue_generation",))

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update_weights_from_tensor", flush_cache))
        self.got.extend(named_tensors)
        return self.answers.get("update", (True, "Succeeded to update model weights."))

    def update_weights_from_disk(self, model_path, load_format=None):
        self.calls.append(("update_weights_from_disk", model_path))
        self.got = list(eng.tensors_from_bucket(*safetensors(os.path.join(model_path, "model.safetensors"))))
        return self.answers.get("update", (True, "Succeeded to update model weights.", 0))

    def flush_cache(self):
        self.calls.append(("flush_cache",))
        return type("FlushCacheReqOutput", (), {"success": self.answers.get("flush", True)})()


def sglang_engine(snap):
    buckets = len(list(eng.bucket_tensors_spec(snap)))
    calls = []
    engine = SGLangEngine(calls)
    eng.SGLangInProcess(engine).load(snap)
    check(calls == [("pause_generation", "abort")] + [("update_weights_from_tensor", False)] * buckets +
          [("flush_cache",), ("continue_generation",)] and same(engine.got, snap),
          "SGLang Engine: pause_generation('abort'), update_weights_from_tensor per bucket (flush_cache "
          "False), flush_cache, continue_generation; every tensor byte for byte")
    calls.clear()
    link = os.path.join(WORK, "sglang-engine", "model")
    engine = SGLangEngine(calls, pausable=False)
    eng.SGLangInProcess(engine, link=link, config=CONFIG).load(snap)
    check(calls == [("update_weights_from_disk", link), ("flush_cache",)] and same(engine.got, snap),
          "SGLang Engine without pause_generation, from disk: update_weights_from_disk on the complete "
          "directory, flush_cache")
    calls.clear()
    check(raises(lambda: eng.SGLangInProcess(SGLangEngine(calls, {"update": (False, "shape mismatch")})).load(snap),
                 "update_weights_from_tensor", "shape mismatch") and
          calls == [("pause_generation", "abort"), ("update_weights_from_tensor", False), ("continue_generation",)],
          "SGLang Engine: an update answering success false fails, names its message; resumed")
    calls.clear()
    check(raises(lambda: eng.SGLangInProcess(SGLangEngine(calls, {"flush": False})).load(snap), "flush_cache",
                 "success=False") and
          calls[-2:] == [("flush_cache",), ("continue_generation",)],
          "SGLang Engine: flush_cache answering success false fails; resumed")


class Server:
    """A real HTTP server in the engine's place: records each request (and,
    where `reads` names its path, the directory reads(body) resolves to and
    the tensors found there) and answers `answers[path]` = (status, body),
    by default 200 with success true."""

    def __init__(self, reads):
        self.seen, self.answers = [], {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                found = None
                if self.path in reads:
                    d = reads[self.path](body)
                    found = (os.path.realpath(d), list(eng.tensors_from_bucket(
                        *safetensors(os.path.join(d, "model.safetensors")))))
                owner.seen.append((self.path, body, found))
                status, reply = owner.answers.get(self.path, (200, '{"success": true, "message": "ok"}'))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(reply.encode())

            def log_message(self, *a):
                pass
        self.http = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.http.server_port

    def paths(self):
        return [p for p, _, _ in self.seen]


def vllm_server(v0, v1):
    link = os.path.join(WORK, "vllm-server", "model")
    server = Server({"/collective_rpc": lambda body: link})
    adapter = eng.VLLMServer(server.url, link, CONFIG)
    for snap in (v0, v1):
        server.seen.clear()
        adapter.load(snap)
        rpc = server.seen[1] if len(server.seen) > 1 else (None, {}, ("", []))
        check(server.paths() == ["/pause?mode=wait&wait_for_inflight_requests=true", "/collective_rpc",
                                 "/reset_prefix_cache", "/resume"] and rpc[1] == {"method": "reload_weights"} and
              rpc[2][0].endswith("model.v%d" % snap.version) and same(rpc[2][1], snap),
              "vLLM server, version %d: pause (wait), collective_rpc reload_weights with the link at that "
              "version, complete; reset_prefix_cache, resume" % snap.version)
    server.seen.clear()
    server.answers = {"/collective_rpc": (500, '{"detail": "Error executing method reload_weights"}')}
    check(raises(lambda: adapter.load(v1), "vLLM server", "POST /collective_rpc", "HTTP 500", "reload_weights") and
          server.paths()[-1] == "/resume" and "/reset_prefix_cache" not in server.paths(),
          "vLLM server: a failed reload names the call and the reply; resumed")
    server.http.shutdown()
    server.http.server_close()


def sglang_server(snap):
    link = os.path.join(WORK, "sglang-server", "model")
    server = Server({"/update_weights_from_disk": lambda body: body["model_path"]})
    adapter = eng.SGLangServer(server.url, link, CONFIG)
    adapter.load(snap)
    update = server.seen[1] if len(server.seen) > 1 else (None, {}, ("", []))
    check(server.paths() == ["/pause_generation", "/update_weights_from_disk", "/flush_cache",
                             "/continue_generation"] and server.seen[0][1] == {"mode": "abort"} and
          update[1] == {"model_path": link} and same(update[2][1], snap),
          "SGLang server: pause_generation (abort), update_weights_from_disk on the complete directory, "
          "flush_cache, continue_generation")

    def failing(path, status, body, *words):
        server.seen.clear()
        server.answers = {path: (status, body)}
        ok = raises(lambda: adapter.load(snap), *words)
        return ok and server.paths()[-1] == "/continue_generation"
    check(failing("/update_weights_from_disk", 400,
                  '{"success": false, "message": "Failed to load weights: size mismatch"}',
                  "POST /update_weights_from_disk", "size mismatch"),
          "SGLang server: update_weights_from_disk failing (400, success false) names the reply; resumed")
    check(failing("/update_weights_from_disk", 200, '{"success": false, "message": "no such file"}',
                  "POST /update_weights_from_disk", "no such file"),
          "SGLang server: success false under HTTP 200 fails too; resumed")
    check(failing("/flush_cache", 400, "Cache not flushed because there are pending requests. #queue-req: 3",
                  "POST /flush_cache", "HTTP 400", "pending requests"),
          "SGLang server: /flush_cache answering 400 fails, naming its reply; resumed")
    check(failing("/pause_generation", 500, "Internal Server Error", "POST /pause_generation", "HTTP 500") and
          "/update_weights_from_disk" not in server.paths(),
          "SGLang server: a failed pause loads nothing and still resumes")
    server.http.shutdown()
    server.http.server_close()
    check(raises(lambda: eng.SGLangServer(server.url, link, CONFIG, timeout=5).load(snap),
                 "POST /pause_generation", "and then", "POST /continue_generation"),
          "SGLang server down: the error names the pause and the resume that failed")
    try:
        eng.SGLangServer(server.url, link, CONFIG, pause_mode="later")
        check(False, "an unknown pause_mode is refused")
    except ValueError as e:
        check("later" in str(e), "an unknown pause_mode is refused: %s" % e)


GROUP_FLAGS = ["--model=tiny", "--tiny_vocab_size=8000", "--threads=1", "--broadcast_bucket_mb=1",
               "--prompts_per_step=2", "--weight_group=gloo", "--weight_group_timeout=10s",
               "--weight_group_ready_timeout=10s", "--weight_group_join_window=1s"]


def group_engines():
    """VLLMFromGroup and SGLangFromGroup against a learner's weight group."""
    with RunningLearner(LEARNER, GROUP_FLAGS, os.path.join(WORK, "group-learner.log"), asympo_rl) as (
            target, new_version):
        vllm_group(target, new_version)
        sglang_group(target, new_version)


def latest_over_grpc(target):
    sub = asympo_rl.WeightSubscriber(target, receiver_id="engines-group-check")
    snap = next(sub.snapshots())
    sub.close()
    return snap


def vllm_group(target, new_version):
    calls = []
    llm = AsyncLLM(calls)
    adapter = eng.VLLMFromGroup(llm, target, "vllm-e", backend="gloo", gloo_address="127.0.0.1",
                                next_wait_ms=500)
    receive = ("collective_rpc", "asympo_receive_group_update")
    v = asyncio.run(adapter.aload(60))
    snap = latest_over_grpc(target)
    check(v == snap.version and len(snap.manifest.buckets) >= 2, "vLLM from the group: version %s of %d buckets "
          "arrived" % (v, len(snap.manifest.buckets)))
    check(calls == [("pause_generation", "wait"), ("collective_rpc", "asympo_join_weight_group"), receive,
                    ("reset_prefix_cache",), ("resume_generation",)] and adapter.members == ["vllm-e-0", "vllm-e-1"],
          "vLLM from the group, first load: pause, every worker joins (as vllm-e-0, vllm-e-1), receives; "
          "reset_prefix_cache, resume")
    check(all(same(w.model_runner.model.loaded, snap) for w in llm.workers),
          "each worker's load_weights got every tensor of version %d, byte for byte as a gRPC fetch" % v)
    for w in llm.workers:
        w.model_runner.model.loaded.clear()
    calls.clear()
    check(asyncio.run(adapter.aload(1.5)) is None and calls == [("pause_generation", "wait"), receive,
                                                              ("resume_generation",)],
          "a load with no new version within its timeout: None; nothing loaded, no cache reset, resumed")

    llm.workers[1].model_runner.model.fail = RuntimeError("CUDA out of memory")
    new_version()
    calls.clear()
    check(raises(lambda: asyncio.run(adapter.aload(60)), "collective_rpc('asympo_receive_group_update')",
                 "CUDA out of memory") and calls == [("pause_generation", "wait"), receive, ("resume_generation",)],
          "a worker's load_weights failing fails the load, naming the call and the error; resumed")
    failed = latest_over_grpc(target)
    for w in llm.workers:
        w.model_runner.model.loaded.clear()
    calls.clear()
    again = asyncio.run(adapter.aload(60))
    check(again == failed.version and calls[-2:] == [("reset_prefix_cache",), ("resume_generation",)] and
          all(same(w.model_runner.model.loaded, failed) for w in llm.workers),
          "after the failed load, the next one has both workers (one had loaded it) load version %s again, "
          "whole" % again)
    for w in llm.workers:
        w.model_runner.model.loaded.clear()
    new_version()
    v2 = asyncio.run(adapter.aload(60))
    snap = latest_over_grpc(target)
    check(v2 == snap.version and v2 > again and all(same(w.model_runner.model.loaded, snap) for w in llm.workers),
          "the group went on: the next version (%s) reached both workers whole" % v2)
    for w in llm.workers:
        w._asympo_group.close()


def sglang_group(target, new_version):
    calls = []
    engine = SGLangEngine(calls)
    with asympo_rl.WeightGroupReceiver(target, "sglang-e", next_wait_ms=500) as receiver:
        adapter = eng.SGLangFromGroup(engine, receiver)
        v = adapter.load(60)
        snap = latest_over_grpc(target)
        buckets = len(snap.manifest.buckets)
        check(v == snap.version and calls == [("pause_generation", "abort")] +
              [("update_weights_from_tensor", False)] * buckets + [("flush_cache",), ("continue_generation",)] and
              same(engine.got, snap),
              "SGLang from the group: pause_generation('abort'), update_weights_from_tensor per bucket (%d, "
              "flush_cache False), flush_cache, continue_generation; version %d byte for byte" % (buckets, v))
        calls.clear()
        check(adapter.load(1.5) is None and calls == [], "no new version within the timeout: None, no engine call")
        new_version()
        engine.answers = {"update": (False, "shape mismatch")}
        check(raises(lambda: adapter.load(60), "update_weights_from_tensor", "shape mismatch") and
              calls == [("pause_generation", "abort"), ("update_weights_from_tensor", False),
                        ("continue_generation",)],
              "SGLang from the group: an update answering success false fails, names its message; resumed")
        engine.answers, engine.got = {}, []
        new_version()
        calls.clear()
        v2 = adapter.load(60)
        snap = latest_over_grpc(target)
        check(v2 == snap.version and v2 > v and same(engine.got, snap),
              "the group went on: version %s reached the SGLang engine whole" % v2)


def main():
    t0 = time.time()
    v0, v1 = real_snapshots()
    vllm_tensors(rebucketed(v1, 8))
    vllm_disk(v0, v1)
    vllm_server(v0, v1)
    sglang_engine(rebucketed(v1, 8))
    sglang_server(v1)
    group_engines()
    print("all engine adapter checks passed in %.1f s" % (time.time() - t0))


main()
