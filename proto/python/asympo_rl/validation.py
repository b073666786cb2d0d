"""The learner's batch rules, checked before sending.

These are the rules of common/batch_validation.cc, with its messages, so a
generator finds its mistakes without a round trip. The learner checks again:
its verdict is the one that counts."""
import math

MAX_PROMPT_ID_BYTES = 256
MAX_SOURCE_BYTES = 128
MAX_BATCH_ID_BYTES = 128

from .errors import InvalidBatchError  # noqa: E402


def _quote(s):
    s = s if len(s) <= 64 else s[:64] + "..."
    return '"%s"' % s.encode("unicode_escape").decode("ascii").replace('"', '\\"')


def _tokens(tokens, vocab, where, what):
    if not tokens or (min(tokens) >= 0 and max(tokens) < vocab):  # the common case, in C
        return
    for i, t in enumerate(tokens):
        if t < 0 or t >= vocab:
            raise InvalidBatchError("%s: %s token %d is %d, outside the vocabulary [0, %d)"
                                    % (where, what, i, t, vocab))


def _response(r, limits, require_logprobs, where, g, j):
    if len(r.tokens) == 0:
        raise InvalidBatchError(where + ": response has no tokens; every response needs at least one",
                                g, j)
    if len(r.tokens) > limits.max_response_tokens:
        raise InvalidBatchError("%s: response has %d tokens, more than max_response_tokens %d"
                                % (where, len(r.tokens), limits.max_response_tokens), g, j)
    try:
        _tokens(r.tokens, limits.vocab_size, where, "response")
    except InvalidBatchError as e:
        raise InvalidBatchError(str(e), g, j) from None
    if not math.isfinite(r.reward):
        raise InvalidBatchError("%s: reward is %s; rewards must be finite" % (where, r.reward), g, j)
    bound = limits.max_abs_reward  # 0: a learner that predates the bound
    if bound > 0 and abs(r.reward) > bound:
        raise InvalidBatchError("%s: reward is %g, beyond max_abs_reward %g; rewards must lie within "
                                "+-max_abs_reward" % (where, r.reward, bound), g, j)
    if r.HasField("last_policy_version"):
        if not r.HasField("first_policy_version"):
            raise InvalidBatchError("%s: last_policy_version is %d without first_policy_version; set "
                                    "both, or first_policy_version alone"
                                    % (where, r.last_policy_version), g, j)
        if r.last_policy_version < r.first_policy_version:
            raise InvalidBatchError("%s: last_policy_version %d is below first_policy_version %d; the "
                                    "last token cannot be sampled by an older policy"
                                    % (where, r.last_policy_version, r.first_policy_version), g, j)
    n = len(r.behavior_logprobs)
    if n == 0:
        if require_logprobs:
            raise InvalidBatchError(where + ": behavior_logprobs missing; the learner's objective "
                                    "(grpo) needs one behavior log-prob per response token", g, j)
        return
    if n != len(r.tokens):
        raise InvalidBatchError("%s: behavior_logprobs has %d values for %d tokens; they must match "
                                "one to one" % (where, n, len(r.tokens)), g, j)
    if max(r.behavior_logprobs) <= 0 and math.isfinite(sum(r.behavior_logprobs)):
        return
    for i, lp in enumerate(r.behavior_logprobs):
        if not math.isfinite(lp) or lp > 0:
            raise InvalidBatchError("%s: behavior_logprobs[%d] is %s; a log-probability must be "
                                    "finite and <= 0" % (where, i, lp), g, j)


def validate_batch(batch, status):
    """Raises InvalidBatchError naming the group, response and rule, as the
    learner would. `batch` is an asympo.v1 RolloutBatch, `status` the
    learner's LearnerStatus (its limits and wants_behavior_logprobs)."""
    limits = status.limits
    if len(batch.groups) == 0:
        raise InvalidBatchError("batch has no groups; send at least one prompt group")
    if len(batch.groups) > limits.max_groups_per_batch:
        raise InvalidBatchError("batch has %d groups, more than max_groups_per_batch %d"
                                % (len(batch.groups), limits.max_groups_per_batch))
    if len(batch.source.encode()) > MAX_SOURCE_BYTES:
        raise InvalidBatchError("batch source is %d bytes, more than %d"
                                % (len(batch.source.encode()), MAX_SOURCE_BYTES))
    max_id = limits.max_batch_id_bytes or MAX_BATCH_ID_BYTES
    if len(batch.batch_id.encode()) > max_id:
        raise InvalidBatchError("batch_id is %d bytes, more than %d" % (len(batch.batch_id.encode()),
                                                                        max_id))
    for g, group in enumerate(batch.groups):
        where = "group %d (prompt_id %s)" % (g, _quote(group.prompt_id))
        if len(group.prompt_id.encode()) > MAX_PROMPT_ID_BYTES:
            raise InvalidBatchError("%s: prompt_id is %d bytes, more than %d"
                                    % (where, len(group.prompt_id.encode()), MAX_PROMPT_ID_BYTES), g)
        if len(group.prompt_tokens) == 0:
            raise InvalidBatchError(where + ": prompt has no tokens; every prompt needs at least one", g)
        if len(group.prompt_tokens) > limits.max_prompt_tokens:
            raise InvalidBatchError("%s: prompt has %d tokens, more than max_prompt_tokens %d"
                                    % (where, len(group.prompt_tokens), limits.max_prompt_tokens), g)
        try:
            _tokens(group.prompt_tokens, limits.vocab_size, where, "prompt")
        except InvalidBatchError as e:
            raise InvalidBatchError(str(e), g) from None
        size = len(group.responses)
        if size < limits.min_group_size or size > limits.max_group_size:
            raise InvalidBatchError("%s: group has %d responses; group size must be in [%d, %d]"
                                    % (where, size, limits.min_group_size, limits.max_group_size), g)
        for j, r in enumerate(group.responses):
            _response(r, limits, status.wants_behavior_logprobs, "%s response %d" % (where, j), g, j)
