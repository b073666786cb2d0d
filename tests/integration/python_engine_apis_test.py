"""The engines' own weight APIs against a real asympo-learner's weight group
(--weight_group=gloo, tiny model): vLLM and SGLang need a GPU and are not
installed here, so stand-ins play their parts as their current sources
spell them (docs/external_generators.md names the versions).

vLLM's weight-transfer API (asympo_rl.vllm_transfer): a stand-in vllm
package (WeightTransferEngine, WeightTransferEngineFactory) and a stand-in
LLM with two workers that loads the "vllm.general_plugins" entry points the
installed package declares, as vLLM does in every process, and creates
each worker's engine from weight_transfer_config backend "asympo";
VLLMWeightTransfer then drives init_weight_transfer_engine once and
start_weight_update / update_weights / finish_weight_update(weight_version)
per version: every worker's load_weights gets every tensor byte for byte
as a gRPC fetch; a version held already moves nothing; a worker whose
load_weights fails fails the load (finish and resume still called) and
the next load has both load the latest again; a version that never comes
times out, naming it.

SGLang's update_weights_from_distributed (asympo_rl.sglang_distributed): a
stand-in SGLang server (HTTP) with two tensor-parallel worker processes
that join the update group at rank_offset + tp_rank over the TCPStore
rendezvous, receive one broadcast per tensor in the order of `names` and
hand them to load_weights; SGLangDistributed relays the group's versions
into it: the update group forms while the relay's other threads run (the
store's host holds no GIL while it waits), the calls in order, every tensor byte for byte, weight_version;
an answer of success false fails the load (generation continued) and the
next load goes through.

vLLM's with deltas on, the learner in bfloat16 at lr 1e-6: after the
workers' first version the group sends deltas, which their receivers
rebuild and check, and load_weights still gets whole tensors, byte for
byte. SGLang's relay on Gloo refuses bfloat16 versions before asking SGLang
for anything when this torch's Gloo cannot broadcast them (torch 1.x),
naming the remedies; its checks above run on a float32 learner.

    python3 python_engine_apis_test.py PKG_DIR LEARNER_BINARY WORK_DIR
    python3 python_engine_apis_test.py sglang-worker PKG_DIR TP_RANK  (one worker)
Exit 0 on success, 1 on a failed check, 77 when grpc or torch is missing."""
import datetime
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

from learner_client import RunningLearner, check, free_port, on_threads, torch_or_skip

if sys.argv[1] == "sglang-worker":
    PKG = sys.argv[2]
else:
    PKG, LEARNER, WORK = sys.argv[1:4]
sys.path.insert(0, PKG)
torch = torch_or_skip()

FLAGS = ["--model=tiny", "--tiny_vocab_size=8000", "--threads=1", "--broadcast_bucket_mb=1",
         "--prompts_per_step=2", "--weight_group=gloo", "--weight_group_address=127.0.0.1",
         "--weight_group_timeout=20s", "--weight_group_ready_timeout=8s", "--weight_group_join_window=1s"]


# bfloat16 at lr 1e-6: a version changes a few words, so the engines' receivers
# (deltas on) get each version after their first as a delta.
DELTA_FLAGS = ["--dtype=bfloat16", "--lr=1e-6"]


def digest(t):
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


# --- the SGLang stand-in's worker process ----------------------------------

def sglang_worker(tp_rank):
    """One tensor-parallel worker: JSON commands on stdin, answers on stdout."""
    from torch.distributed import distributed_c10d as c10d
    import torch.distributed as dist
    groups, fail = {}, [False]
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    for line in sys.stdin:
        cmd = json.loads(line)
        op, reply = cmd.pop("op"), {"success": True}
        if op == "init":
            # As SGLang joins: the rendezvous at tcp://master, the keys under
            # the group's name, a group of its own.
            timeout = datetime.timedelta(seconds=30)
            store, rank, size = next(c10d.rendezvous("tcp://%s:%d" % (cmd["master_address"], cmd["master_port"]),
                                                     cmd["rank_offset"] + tp_rank, cmd["world_size"], timeout=timeout))
            made = c10d._new_process_group_helper(size, rank, [], c10d.Backend(cmd["backend"]),
                                                  c10d.PrefixStore(cmd["group_name"], store),
                                                  group_name=cmd["group_name"], timeout=timeout)
            groups[cmd["group_name"]] = made[0] if isinstance(made, tuple) else made
        elif op == "update":
            pg, loaded = groups[cmd["group_name"]], []
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = 0, 0
            for name, dtype, shape in zip(cmd["names"], cmd["dtypes"], cmd["shapes"]):
                t = torch.empty(shape, dtype=dtypes[dtype])
                pg.broadcast([t], opts).wait()
                loaded.append([name, digest(t)])
            reply["loaded"] = loaded
            if fail[0]:
                fail[0] = False
                reply = {"success": False, "message": "load_weights failed: CUDA out of memory"}
        elif op == "fail_next":
            fail[0] = True
        elif op == "destroy":
            groups.pop(cmd["group_name"], None)
        print(json.dumps(reply), flush=True)


if sys.argv[1] == "sglang-worker":
    sglang_worker(int(sys.argv[3]))
    sys.exit(0)

import asympo_rl  # noqa: E402
from asympo_rl import sglang_distributed  # noqa: E402


# --- the vLLM stand-in ------------------------------------------------------

FAKE_BASE = '''
import abc


class WeightTransferEngine(abc.ABC):
    init_info_cls = None
    update_info_cls = None
    supports_draft_weight_update = True

    def __init__(self, config, vllm_config, device, model):
        self.config, self.vllm_config, self.device, self.model = config, vllm_config, device, model

    def parse_init_info(self, info):
        try:
            return self.init_info_cls(**info)
        except TypeError as e:
            raise ValueError("bad init_info: %s" % e)

    def parse_update_info(self, info):
        try:
            return self.update_info_cls(**info)
        except TypeError as e:
            raise ValueError("bad update_info: %s" % e)

    @abc.abstractmethod
    def init_transfer_engine(self, init_info): ...

    @abc.abstractmethod
    def start_weight_update(self): ...

    @abc.abstractmethod
    def finish_weight_update(self): ...

    @abc.abstractmethod
    def receive_weights(self, update_info): ...

    @abc.abstractmethod
    def shutdown(self): ...

    @staticmethod
    @abc.abstractmethod
    def trainer_send_weights(iterator, trainer_args): ...

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))
'''

FAKE_FACTORY = '''
import importlib


class WeightTransferEngineFactory:
    _registry = {}

    @classmethod
    def register_engine(cls, name, module_path_or_cls, class_name=None):
        if name in cls._registry:
            raise ValueError("weight transfer engine %r is registered already" % name)
        cls._registry[name] = (module_path_or_cls, class_name)

    @classmethod
    def create_engine(cls, config, vllm_config, device, model):
        if config.backend not in cls._registry:
            raise ValueError("unknown weight transfer backend %r" % config.backend)
        where, name = cls._registry[config.backend]
        klass = getattr(importlib.import_module(where), name) if isinstance(where, str) else where
        return klass(config, vllm_config, device, model)
'''


def install_fake_vllm():
    root = os.path.join(WORK, "fake_vllm")
    pkg = os.path.join(root, "vllm", "distributed", "weight_transfer")
    os.makedirs(pkg, exist_ok=True)
    for d in (os.path.join(root, "vllm"), os.path.join(root, "vllm", "distributed"), pkg):
        open(os.path.join(d, "__init__.py"), "w").close()
    with open(os.path.join(pkg, "base.py"), "w") as f:
        f.write(FAKE_BASE)
    with open(os.path.join(pkg, "factory.py"), "w") as f:
        f.write(FAKE_FACTORY)
    sys.path.insert(0, root)


class Model:
    def __init__(self):
        self.loaded, self.fail = [], None

    def load_weights(self, weights):
        if self.fail is not None:
            self.fail, e = None, self.fail
            raise e
        self.loaded.extend((n, digest(t)) for n, t in weights)


class Config:
    def __init__(self, backend):
        self.backend = backend


class ParallelConfig:
    def __init__(self, rank):
        self.rank = rank


class VllmConfig:
    def __init__(self, rank):
        self.parallel_config = ParallelConfig(rank)


class LLM:
    """vLLM's LLM as far as weight transfer goes: two workers, each with an
    engine made by the factory; each call runs on every worker at once."""

    def __init__(self, backend, calls):
        import importlib.metadata as md
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        points = md.entry_points()
        points = points.select(group="vllm.general_plugins") if hasattr(points, "select") \
            else points.get("vllm.general_plugins", [])
        for ep in points:  # vLLM's load_general_plugins, in each process
            ep.load()()
        self.models = [Model(), Model()]
        self.engines = [WeightTransferEngineFactory.create_engine(Config(backend), VllmConfig(r), "cpu", m)
                        for r, m in enumerate(self.models)]
        self.calls, self.weight_version = calls, None

    def _all(self, name, fn):
        self.calls.append(name)
        on_threads(fn, self.engines)

    def init_weight_transfer_engine(self, request):
        self._all("init_weight_transfer_engine",
                  lambda e: e.init_transfer_engine(e.parse_init_info(request["init_info"])))

    def start_weight_update(self):
        self._all("start_weight_update", lambda e: e.start_weight_update())

    def update_weights(self, request):
        self._all("update_weights", lambda e: e.update_weights(request["update_info"]))

    def finish_weight_update(self, weight_version=None):
        self._all("finish_weight_update", lambda e: e.finish_weight_update())
        self.weight_version = weight_version

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")
        return True


def tensors_of(snap):
    return sorted((t.name, hashlib.sha256(bytes(snap.buckets[t.bucket][t.offset:t.offset + t.size_bytes]))
                   .hexdigest()) for t in snap.manifest.tensors)


def latest_over_grpc(target):
    sub = asympo_rl.WeightSubscriber(target, receiver_id="apis-check", deltas=False)
    snap = next(sub.snapshots())
    sub.close()
    return snap


def raises(fn, *words):
    try:
        fn()
    except asympo_rl.engines.EngineError as e:
        return all(w in str(e) for w in words) or print("EngineError without %s: %s" % (words, e))
    return False


def vllm_api(target, new_version):
    install_fake_vllm()  # before asympo_rl.vllm_transfer is imported: its base class is vLLM's
    from asympo_rl import vllm_transfer
    calls = []
    llm = LLM("asympo", calls)
    check(all(isinstance(e, vllm_transfer.AsympoWeightTransferEngine) for e in llm.engines),
          "the entry point registered backend 'asympo': each worker's engine is AsympoWeightTransferEngine")
    vllm_transfer.register()  # a second registration is a no-op
    adapter = vllm_transfer.VLLMWeightTransfer(llm, target, "vllm-t", backend="gloo", next_wait_ms=500,
                                               deltas=True)
    step = ["start_weight_update", "update_weights", "finish_weight_update", "reset_prefix_cache"]
    v = adapter.load()
    snap = latest_over_grpc(target)
    check(v == snap.version and calls == ["init_weight_transfer_engine"] + step and llm.weight_version == str(v),
          "vLLM, first load: init_weight_transfer_engine, then start, update_weights, finish (weight_version "
          "%s), reset_prefix_cache: %s" % (llm.weight_version, calls))
    check([e.receiver.worker_id for e in llm.engines] == ["vllm-t-0", "vllm-t-1"] and
          all(sorted(m.loaded) == tensors_of(snap) for m in llm.models),
          "each worker (vllm-t-0, vllm-t-1) loaded every tensor of version %d, byte for byte as a gRPC fetch" % v)
    for m in llm.models:
        m.loaded.clear()
    calls.clear()
    check(adapter.load(version=v) == v and calls == step and not any(m.loaded for m in llm.models),
          "a load of the version held moves nothing")
    new_version()
    v1 = adapter.load()
    snap = latest_over_grpc(target)
    check(v1 == snap.version == v + 1 and all(sorted(m.loaded) == tensors_of(snap) for m in llm.models),
          "the next version (%d) reached both workers, byte for byte as a gRPC fetch" % v1)
    check([e.receiver.delta_versions for e in llm.engines] == [1, 1],
          "both workers rebuilt it from its delta: %s" % [e.receiver.delta_versions for e in llm.engines])
    llm.models[1].fail = RuntimeError("CUDA out of memory")
    new_version()
    calls.clear()
    check(raises(adapter.load, "update_weights", "CUDA out of memory") and calls == step[:3],
          "a worker's load_weights failing fails the load, naming the call; finish_weight_update still called")
    for m in llm.models:
        m.loaded.clear()
    v2 = adapter.load()
    snap = latest_over_grpc(target)
    check(v2 == snap.version and all(sorted(m.loaded) == tensors_of(snap) for m in llm.models),
          "after the failure both workers load version %d again, whole" % v2)
    check(raises(lambda: adapter.load(version=v2 + 50, timeout_s=1.5), "update_weights", "version %d" % (v2 + 50)),
          "a version that never comes times out, naming it")
    for e in llm.engines:
        e.shutdown()


# --- the SGLang stand-in ----------------------------------------------------

class SGLangStandIn:
    """An SGLang server's HTTP endpoints over two worker processes."""

    def __init__(self):
        self.calls, self.versions = [], []
        self.workers = [subprocess.Popen([sys.executable, __file__, "sglang-worker", PKG, str(r)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in (0, 1)]
        self.loaded = None
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, body):
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer({"tp_size": 2} if self.path == "/get_server_info" else {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                self._answer(me.handle(self.path.lstrip("/"), body))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def ask(self, cmd):
        for w in self.workers:
            w.stdin.write(json.dumps(cmd) + "\n")
            w.stdin.flush()
        return [json.loads(w.stdout.readline()) for w in self.workers]

    def handle(self, name, body):
        self.calls.append(name)
        if name == "init_weights_update_group":
            replies = self.ask(dict(body, op="init"))
        elif name == "update_weights_from_distributed":
            self.versions.append(body.get("weight_version"))
            replies = self.ask(dict(body, op="update"))
            self.loaded = [r.get("loaded") for r in replies]
        elif name == "destroy_weights_update_group":
            replies = self.ask(dict(body, op="destroy"))
        else:
            return {"success": True}
        bad = [r for r in replies if not r["success"]]
        return bad[0] if bad else {"success": True, "message": "ok"}

    def close(self):
        self.server.shutdown()
        for w in self.workers:
            w.stdin.close()
            w.wait(timeout=30)


def update_group_beside_threads():
    """open_update_group waits for SGLang's ranks without holding the GIL:
    the relay's other threads (the weight group's receiver, the HTTP call
    that asks SGLang to join) run meanwhile. Here the other rank joins from
    a thread of this process a second after rank 0 starts waiting."""
    from torch.distributed import distributed_c10d as c10d
    import torch.distributed as dist
    port, got = free_port(), {}

    def join():
        time.sleep(1.0)
        timeout = datetime.timedelta(seconds=30)
        store, rank, size = next(c10d.rendezvous("tcp://127.0.0.1:%d" % port, 1, 2, timeout=timeout))
        made = c10d._new_process_group_helper(size, rank, [], c10d.Backend("gloo"),
                                              c10d.PrefixStore("g", store), group_name="g", timeout=timeout)
        pg, t = made[0] if isinstance(made, tuple) else made, torch.zeros(4)
        pg.broadcast([t], dist.BroadcastOptions()).wait()
        got["t"] = t
    joiner = threading.Thread(target=join, daemon=True)
    t0 = time.time()
    joiner.start()
    pg = sglang_distributed.open_update_group("gloo", "127.0.0.1", port, 2, "g", 30)
    formed = time.time() - t0
    pg.broadcast([torch.arange(4.0)], dist.BroadcastOptions()).wait()
    joiner.join(30)
    sglang_distributed.close_update_group(pg)
    check(formed < 10 and got.get("t") is not None and got["t"].tolist() == [0, 1, 2, 3],
          "the update group formed in %.1f s with its other rank joining from a thread of this process "
          "(rank 0 holds no lock while it waits), and a broadcast went through" % formed)


def sglang_bfloat16_on_gloo(target, new_version):
    """A bfloat16 version over a Gloo update group, where this torch's Gloo
    has no bfloat16: refused before SGLang is asked to load it; the
    learner's group goes on."""
    if sglang_distributed.gloo_broadcasts(torch.bfloat16):
        print("this torch's Gloo broadcasts bfloat16: nothing to refuse")
        return
    sgl = SGLangStandIn()
    receiver = asympo_rl.WeightGroupReceiver(target, "sglang-bf16", backend="gloo", next_wait_ms=500, deltas=True)
    adapter = sglang_distributed.SGLangDistributed(sgl.url, receiver, master_port=free_port(), timeout_s=60)
    try:
        new_version()
        check(raises(lambda: adapter.load(timeout_s=60), "bfloat16", "Gloo in torch", "NCCL", "--dtype=float32")
              and "update_weights_from_distributed" not in sgl.calls and "pause_generation" not in sgl.calls,
              "a bfloat16 version on a Gloo update group is refused before SGLang is asked to load it: %s"
              % sgl.calls)
        new_version()
        check(receiver.next_update(timeout=60) is not None, "the learner's group went on after the refusal")
        adapter.close()
    finally:
        receiver.close()
        sgl.close()


def sglang_api(target, new_version):
    sgl = SGLangStandIn()
    receiver = asympo_rl.WeightGroupReceiver(target, "sglang-r", backend="gloo", next_wait_ms=500)
    adapter = sglang_distributed.SGLangDistributed(sgl.url, receiver, master_port=free_port(), timeout_s=60)
    try:
        new_version()
        v = adapter.load(timeout_s=60)
        snap = latest_over_grpc(target)
        check(v == snap.version and sgl.calls == ["init_weights_update_group", "pause_generation",
                                                  "update_weights_from_distributed", "flush_cache",
                                                  "continue_generation"] and sgl.versions == [str(v)],
              "SGLang, first load: init_weights_update_group (world 3) before the version is taken, pause, "
              "update_weights_from_distributed "
              "(weight_version %s), flush_cache, continue: %s" % (sgl.versions, sgl.calls))
        check(all(sorted(map(tuple, loaded)) == tensors_of(snap) for loaded in sgl.loaded),
              "both SGLang workers received every tensor of version %d by broadcast, byte for byte" % v)
        sgl.ask({"op": "fail_next"})
        new_version()
        sgl.calls.clear()
        check(raises(lambda: adapter.load(timeout_s=60), "update_weights_from_distributed", "CUDA out of memory")
              and sgl.calls[-1] == "continue_generation",
              "SGLang answering success false fails the load, naming its message; generation continued")
        new_version()
        sgl.calls.clear()
        v2 = adapter.load(timeout_s=60)
        snap = latest_over_grpc(target)
        check(v2 == snap.version and "init_weights_update_group" not in sgl.calls and
              all(sorted(map(tuple, loaded)) == tensors_of(snap) for loaded in sgl.loaded),
              "the update group stood: the next version (%d) went through it, byte for byte" % v2)
        adapter.close()
        check(sgl.calls[-1] == "destroy_weights_update_group", "close() destroys SGLang's update group")
    finally:
        receiver.close()
        sgl.close()


def main():
    t0 = time.time()
    os.makedirs(WORK, exist_ok=True)
    with RunningLearner(LEARNER, FLAGS + DELTA_FLAGS, os.path.join(WORK, "learner-bf16.log"),
                        asympo_rl) as (target, new_version):
        vllm_api(target, new_version)
        sglang_bfloat16_on_gloo(target, new_version)
    update_group_beside_threads()
    with RunningLearner(LEARNER, FLAGS, os.path.join(WORK, "learner.log"), asympo_rl) as (target, new_version):
        sglang_api(target, new_version)
    print("all engine API checks passed in %.1f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
