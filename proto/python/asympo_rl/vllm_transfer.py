"""A vLLM weight-transfer engine that makes each vLLM worker a member of the
learner's weight group, so that vLLM takes the learner's versions through
its own weight-transfer API, turned on by configuration (no worker
extension):

    vllm serve MODEL --weight-transfer-config '{"backend": "asympo"}'
    # or LLM(MODEL, weight_transfer_config=WeightTransferConfig(backend="asympo"))

vLLM finds the engine through the entry point that this package declares
("vllm.general_plugins": asympo_rl.vllm_transfer:register), which vLLM
loads in every process, its workers included. The trainer-side calls are
vLLM's own (LLM, AsyncLLM, or the server's /init_weight_transfer_engine,
/start_weight_update, /update_weights and /finish_weight_update):

    init_weight_transfer_engine({"init_info": {"target": "learner:50051", "worker_id": "vllm-0",
                                               "backend": "nccl"}})          once
    start_weight_update()
    update_weights({"update_info": {"version": 12, "timeout_s": 60}})         per version
    finish_weight_update(weight_version="12")

init_weight_transfer_engine makes every worker a WeightGroupReceiver named
<worker_id>-<rank> (NCCL: on the worker's GPU). update_weights has every
worker take the group's versions until it holds `version` (-1: the next
one, whatever its number), each bucket's tensors handed to
model.load_weights as the bucket arrives, verified (CRC-32C) first; a
version newer than the one asked for (the learner replaced it) is loaded
and then refused with an error naming it, so the caller asks for that one.
VLLMWeightTransfer below drives these calls for a vLLM engine in this
process, around a pause, like the other adapters of asympo_rl.engines.

Checked against vLLM's weight-transfer sources of v0.29 to v0.32
(vllm/distributed/weight_transfer/base.py, factory.py; docs/
external_generators.md names the calls); vLLM itself is not needed to
import this module."""
import dataclasses
import time
from typing import Optional

from .engines import EngineError, _VLLM

BACKEND = "asympo"


@dataclasses.dataclass
class AsympoInitInfo:
    """init_weight_transfer_engine's init_info: where the learner is and how
    the workers join its weight group (WeightGroupReceiver's arguments)."""
    target: str
    worker_id: str
    backend: str = "nccl"
    tls_ca: str = ""
    token_file: str = ""
    gloo_address: str = "127.0.0.1"
    model_signature: str = ""
    deltas: Optional[bool] = None
    next_wait_ms: int = 10000


@dataclasses.dataclass
class AsympoUpdateInfo:
    """update_weights' update_info: the version to hold (-1: the group's
    next), how long to wait for it, and whether to forget the version held
    first (after a failed update left the workers on different versions)."""
    version: int = -1
    timeout_s: float = 60.0
    reload: bool = False


def _engine_base():
    try:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        return WeightTransferEngine
    except ImportError:
        return object


def _rank(vllm_config):
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover
        pass
    return int(getattr(getattr(vllm_config, "parallel_config", None), "rank", 0) or 0)


class AsympoWeightTransferEngine(_engine_base()):
    """vLLM's WeightTransferEngine over the learner's weight group (the
    module's docstring)."""
    init_info_cls = AsympoInitInfo
    update_info_cls = AsympoUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model):
        if type(self).__mro__[1] is not object:
            super().__init__(config, vllm_config, device, model)
        self.config, self.vllm_config, self.device, self.model = config, vllm_config, device, model
        self.receiver = None
        self.version = None   # the version the model holds, once one was loaded
        self._updating = False

    def init_transfer_engine(self, init_info):
        from .engines import _credentials
        from .weight_group import WeightGroupReceiver
        if init_info.backend not in ("nccl", "gloo"):
            raise ValueError("init_info.backend %r: nccl or gloo" % (init_info.backend,))
        self.shutdown()
        kw = {"backend": init_info.backend, "gloo_address": init_info.gloo_address,
              "next_wait_ms": init_info.next_wait_ms, "deltas": init_info.deltas,
              "device": self.device if init_info.backend == "nccl" else "cpu"}
        if init_info.model_signature:
            kw["model_signature"] = init_info.model_signature
        if init_info.tls_ca or init_info.token_file:
            kw["credentials"] = _credentials(init_info.tls_ca or None, init_info.token_file or None)
        member = "%s-%d" % (init_info.worker_id, _rank(self.vllm_config))
        self.receiver = WeightGroupReceiver(init_info.target, member, **kw)

    def start_weight_update(self):
        if self.receiver is None:
            raise RuntimeError("asympo weight transfer: call init_weight_transfer_engine first")
        self._updating = True

    def receive_weights(self, update_info):
        """Takes the group's versions until the model holds update_info.version."""
        if not self._updating:
            raise RuntimeError("asympo weight transfer: update_weights without start_weight_update")
        rx, want = self.receiver, update_info.version
        if update_info.reload:
            rx.forget()
        if want >= 0 and rx.holds and rx.version == want:
            return
        deadline = time.monotonic() + update_info.timeout_s
        while True:
            left = deadline - time.monotonic()
            update = rx.next_update(timeout=left) if left > 0 else None
            if update is None:
                raise TimeoutError("asympo weight transfer: %s did not come within %.1f s (the model holds %s)"
                                   % ("version %d" % want if want >= 0 else "no version", update_info.timeout_s,
                                      self.version))
            with update:
                for pairs in update.buckets():
                    if pairs:
                        self.model.load_weights(weights=pairs)
            self.version = update.version
            if want < 0 or update.version == want:
                return
            if update.version > want:
                raise RuntimeError("asympo weight transfer: version %d came and was loaded, not %d (the learner "
                                   "replaced it): ask for %d" % (update.version, want, update.version))

    def update_weights(self, update_info):
        """vLLM's base class parses the dict and calls receive_weights; this
        stands in for it where the base class is absent (tests, no vLLM)."""
        if type(self).__mro__[1] is not object:
            return super().update_weights(update_info)
        return self.receive_weights(update_info if isinstance(update_info, AsympoUpdateInfo)
                                    else AsympoUpdateInfo(**update_info))

    def finish_weight_update(self):
        self._updating = False

    def shutdown(self):
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        raise NotImplementedError("the learner sends the weights (its weight group): there is no trainer side "
                                  "to run in this process")


def register():
    """vLLM's general plugin: registers the engine as backend "asympo" (a
    second registration in the same process is a no-op)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "AsympoWeightTransferEngine")
    except ValueError:
        pass  # registered already (vLLM loads plugins once per process, tests more often)


class VLLMWeightTransfer(_VLLM):
    """Loads the learner's versions into a vLLM engine in this process (LLM or
    AsyncLLM) started with weight_transfer_config backend "asympo", through
    vLLM's weight-transfer calls: load(version) pauses generation, makes the
    workers members of the group on the first load
    (init_weight_transfer_engine), then start_weight_update, update_weights
    and finish_weight_update(weight_version=str(version)), resets the prefix
    cache and resumes. version None: the learner's current one (its
    GetStatus; needs the role status). Returns the version loaded."""

    def __init__(self, llm, target, worker_id, backend="nccl", pause=True, status_client=None, **init_kw):
        """init_kw: AsympoInitInfo's other fields (tls_ca, token_file,
        gloo_address, model_signature, deltas, next_wait_ms).
        status_client: a LearnerClient for version None (default: a
        plaintext one to `target`)."""
        super().__init__(llm, pause)
        self.init_info = dataclasses.asdict(AsympoInitInfo(target, worker_id, backend, **init_kw))
        self.status_client = status_client
        self._joined = self._reload = False

    def load(self, version=None, timeout_s=60.0):
        return self._sync(self._run((version, timeout_s), False))

    async def aload(self, version=None, timeout_s=60.0):
        return await self._run((version, timeout_s), True)

    def _describe(self, source):
        version = source[0]
        return "the learner's current version" if version is None else "version %d" % version

    async def _load(self, source):
        version, timeout_s = source
        if version is None:
            if self.status_client is None:
                from .client import LearnerClient
                self.status_client = LearnerClient(self.init_info["target"], source="vllm-weight-transfer")
            version = self.status_client.status(timeout=30).version
        self._what = "version %d" % version
        if not self._joined:
            await self._do("init_weight_transfer_engine", self.llm.init_weight_transfer_engine,
                           {"init_info": self.init_info})
            self._joined = True
        reload, self._reload = self._reload, True  # until an update completes
        await self._do("start_weight_update", self.llm.start_weight_update)
        try:
            await self._do("update_weights(version %d)" % version, self.llm.update_weights,
                           {"update_info": {"version": version, "timeout_s": timeout_s, "reload": reload}})
        finally:
            await self._do("finish_weight_update", self.llm.finish_weight_update, weight_version=str(version))
        self._reload = False
        return version


__all__ = ["AsympoWeightTransferEngine", "AsympoInitInfo", "AsympoUpdateInfo", "VLLMWeightTransfer", "register",
           "BACKEND", "EngineError"]
