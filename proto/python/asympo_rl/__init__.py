"""asympo-rl: the Python client of the ASymPO-RL learner.

- LearnerClient: submit rollout batches (exactly once, with batch ids;
  each kept until the learner's checkpoint records it, and sent again
  after a learner restart), read the learner's status and limits;
  multi_turn_response builds a response from generated() and inserted()
  segments (the learner trains on the generated tokens only).
- WeightSubscriber: receive the learner's policy weights, verified, as
  (Hugging Face name, tensor) pairs; write_hf_directory for engines that
  reload from disk.
- WeightGroupReceiver: receive them instead over the learner's collective
  weight group (torch.distributed, Gloo or NCCL), bucket by bucket, as
  WeightUpdates; GroupStore, the c10d store the group meets over. Needs
  torch, which is imported on first use of these names.
- Environment: subclass it with reset and step and serve() it as the
  asympo.v1.Environment service, which rollout daemons started with
  --environment run multi-turn episodes against; Answer, what step returns.
- asympo_rl.engines: load a snapshot into vLLM or SGLang (pause, load,
  flush, resume), or have them receive from the weight group; EngineError
  when an engine call fails.
- asympo_rl.lora: versions of a learner that trains low-rank adapters
  (--lora_rank) as PEFT adapter directories (write_peft_directory), loaded
  into a running vLLM or SGLang under a fresh name per version (VLLMLoRA,
  VLLMServerLoRA, SGLangLoRA, SGLangServerLoRA).
See docs/external_generators.md in the repository."""
from .client import (LearnerClient, StreamResult, SubmitResult, group, response,  # noqa: F401
                     stamp_policy_version)
from .engines import EngineError  # noqa: F401
from .environment import Answer, Environment  # noqa: F401
from .errors import (AsympoError, InvalidBatchError, LearnerBusyError,  # noqa: F401
                     LearnerUnavailableError, RefusedError, WeightsError)
from .lora import (SGLangLoRA, SGLangServerLoRA, VLLMLoRA, VLLMServerLoRA,  # noqa: F401
                   write_peft_directory)
from .turns import generated, inserted, multi_turn_response  # noqa: F401
from .validation import validate_batch  # noqa: F401
from .weights import Snapshot, WeightSubscriber, model_signature, write_hf_directory  # noqa: F401

__version__ = "0.1.0"

_WEIGHT_GROUP = ("WeightGroupReceiver", "WeightUpdate", "GroupStore")


def __getattr__(name):
    # The weight group needs torch: imported when first asked for, so that
    # the rest of the package works without it.
    if name in _WEIGHT_GROUP:
        from . import weight_group
        return getattr(weight_group, name)
    raise AttributeError("module 'asympo_rl' has no attribute %r" % name)


def __dir__():
    return sorted(list(globals()) + list(_WEIGHT_GROUP))
