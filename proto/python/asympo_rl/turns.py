"""Multi-turn responses (docs/protocol.md, "Multi-turn responses"): a
response built from its segments in order, the turns the policy generated
and the tokens the environment inserted between them (a tool's output,
another party's turn). The learner conditions on every token and trains on
the generated ones only (Response.loss_mask):

    r = asympo_rl.multi_turn_response(
        [asympo_rl.generated(call_tokens), asympo_rl.inserted(tool_output_tokens),
         asympo_rl.generated(answer_tokens)],
        reward=1.0, first_policy_version=7, last_policy_version=8)

Behavior log-probs (the grpo baseline only) belong to generated segments:
give them for every generated segment or for none."""
import collections

from .client import response
from .errors import InvalidBatchError

Segment = collections.namedtuple("Segment", "tokens generated behavior_logprobs")


def generated(tokens, behavior_logprobs=None):
    """Tokens the policy sampled (trained on), with their behavior log-probs
    when the learner wants them (LearnerStatus.wants_behavior_logprobs)."""
    return Segment(list(tokens), True, None if behavior_logprobs is None else list(behavior_logprobs))


def inserted(tokens):
    """Tokens the environment inserted (conditioned on, never trained on)."""
    return Segment(list(tokens), False, None)


def multi_turn_response(segments, reward, finish_reason=None, first_policy_version=None,
                        last_policy_version=None):
    """One Response of `segments` (generated() and inserted() in order),
    its loss_mask marking the inserted tokens (none when every segment was
    generated). first_policy_version, last_policy_version: the versions of
    the weights that sampled its first and its last generated token.
    InvalidBatchError for an empty segment, no generated token, or
    behavior log-probs given for some generated segments only or not one
    per token."""
    tokens, mask, logprobs, with_logprobs = [], [], [], set()
    for i, s in enumerate(segments):
        if not isinstance(s, Segment):
            raise InvalidBatchError("segment %d: expected generated(...) or inserted(...), got %r" % (i, s))
        if not s.tokens:
            raise InvalidBatchError("segment %d has no tokens" % i)
        tokens += s.tokens
        mask += [s.generated] * len(s.tokens)
        if not s.generated:
            continue
        with_logprobs.add(s.behavior_logprobs is not None)
        if s.behavior_logprobs is not None:
            if len(s.behavior_logprobs) != len(s.tokens):
                raise InvalidBatchError("segment %d: %d behavior log-probs for %d tokens"
                                        % (i, len(s.behavior_logprobs), len(s.tokens)))
            logprobs += s.behavior_logprobs
    if not with_logprobs:
        raise InvalidBatchError("a response needs at least one generated segment to train on")
    if len(with_logprobs) > 1:
        raise InvalidBatchError("behavior log-probs were given for some generated segments only")
    out = response(tokens, reward, behavior_logprobs=logprobs or None, finish_reason=finish_reason,
                   first_policy_version=first_policy_version, last_policy_version=last_policy_version)
    if not all(mask):
        out.loss_mask.extend(mask)
    return out


__all__ = ["Segment", "generated", "inserted", "multi_turn_response"]
