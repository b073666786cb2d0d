"""The learner's batch rules, checked before sending.

These are the rules of common/batch_validation.cc, with its messages, so a
generator finds its mistakes without a round trip. The learner checks again:
its verdict is the one that counts.

The rules on every element (each token within the vocabulary, each behavior
log-prob finite and <= 0) are checked at once with numpy over the batch's
wire bytes, which the client then sends as they are; only when that finds a
fault (or numpy is missing) are they checked one by one, to name the first
fault as the learner would. The rules on counts, rewards and versions are
checked per response, without touching the elements."""
import math
import struct

try:
    import numpy as np
except ImportError:  # pragma: no cover - the rule by rule check alone
    np = None

MAX_PROMPT_ID_BYTES = 256
MAX_SOURCE_BYTES = 128
MAX_BATCH_ID_BYTES = 128

from .errors import InvalidBatchError  # noqa: E402


_ESCAPES = {0x0a: "\\n", 0x0d: "\\r", 0x09: "\\t", 0x22: '\\"', 0x27: "\\'", 0x5c: "\\\\"}


def _quote(s):
    """s as the learner quotes it (QuoteForMessage in common/grpc_status.cc):
    its first 64 bytes, C-escaped with absl::CHexEscape, then "..." when cut."""
    b = s.encode()
    out, hex_before = ['"'], False
    for c in b[:64]:
        hex_now = False
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif not 0x20 <= c < 0x7f or (hex_before and chr(c) in "0123456789abcdefABCDEF"):
            out.append("\\x%02x" % c)
            hex_now = True
        else:
            out.append(chr(c))
        hex_before = hex_now
    return "".join(out) + ('..."' if len(b) > 64 else '"')


def _tokens(tokens, vocab, where, what):
    if not tokens or (min(tokens) >= 0 and max(tokens) < vocab):  # the common case, in C
        return
    for i, t in enumerate(tokens):
        if t < 0 or t >= vocab:
            raise InvalidBatchError("%s: %s token %d is %d, outside the vocabulary [0, %d)"
                                    % (where, what, i, t, vocab))


def _loss_mask(r, where, g, j):
    """The response's generated tokens (Response.loss_mask; none: all of
    them), its mask checked."""
    if not r.loss_mask:
        return len(r.tokens)
    if len(r.loss_mask) != len(r.tokens):
        raise InvalidBatchError("%s: loss_mask has %d entries for %d tokens; it needs one per token (or "
                                "none: every token generated)" % (where, len(r.loss_mask), len(r.tokens)),
                                g, j)
    generated = sum(r.loss_mask)
    if generated == 0:
        raise InvalidBatchError("%s: loss_mask marks none of its %d tokens as generated; a response needs "
                                "at least one generated token to train on" % (where, len(r.tokens)), g, j)
    return generated


def _response(r, limits, require_logprobs, where, g, j, elements):
    if len(r.tokens) == 0:
        raise InvalidBatchError(where + ": response has no tokens; every response needs at least one",
                                g, j)
    if len(r.tokens) > limits.max_response_tokens:
        raise InvalidBatchError("%s: response has %d tokens, more than max_response_tokens %d"
                                % (where, len(r.tokens), limits.max_response_tokens), g, j)
    if elements:
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
    generated = _loss_mask(r, where, g, j)
    n = len(r.behavior_logprobs)
    if n == 0:
        if require_logprobs:
            raise InvalidBatchError(where + ": behavior_logprobs missing; the learner's objective "
                                    "(grpo) needs one behavior log-prob per generated response token",
                                    g, j)
        return
    if n != generated and not r.loss_mask:
        raise InvalidBatchError("%s: behavior_logprobs has %d values for %d tokens; they must match "
                                "one to one" % (where, n, len(r.tokens)), g, j)
    if n != generated:
        raise InvalidBatchError("%s: behavior_logprobs has %d values for %d generated tokens (loss_mask "
                                "true); one per generated token" % (where, n, generated), g, j)
    if not elements or max(r.behavior_logprobs) <= 0 and math.isfinite(sum(r.behavior_logprobs)):
        return
    for i, lp in enumerate(r.behavior_logprobs):
        if not math.isfinite(lp) or lp > 0:
            raise InvalidBatchError("%s: behavior_logprobs[%d] is %s; a log-probability must be "
                                    "finite and <= 0" % (where, i, lp), g, j)


def validate_batch(batch, status):
    """Raises InvalidBatchError naming the group, response and rule, as the
    learner would. `batch` is an asympo.v1 RolloutBatch, `status` the
    learner's LearnerStatus (its limits and wants_behavior_logprobs)."""
    encode_valid_batch(batch, status)


def encode_valid_batch(batch, status):
    """validate_batch, returning the batch's wire bytes
    (batch.SerializeToString()), which the client sends as they are."""
    data = batch.SerializeToString()
    elements_valid = np is not None and _elements_valid(data, status.limits.vocab_size)
    _check(batch, status, elements=not elements_valid)
    return data


def _check(batch, status, elements):
    """The rules one by one; elements: also each token and log-prob (False
    once _elements_valid found them all valid)."""
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
    plain = None if elements else _PlainRules(limits, status.wants_behavior_logprobs)
    for g, group in enumerate(batch.groups):
        if plain is None or not plain.group_valid(group):
            _group(group, g, limits, status.wants_behavior_logprobs, elements)


def _group(group, g, limits, require_logprobs, elements):
    """A group's rules one by one, raising with the learner's message."""
    where = "group %d (prompt_id %s)" % (g, _quote(group.prompt_id))
    if len(group.prompt_id.encode()) > MAX_PROMPT_ID_BYTES:
        raise InvalidBatchError("%s: prompt_id is %d bytes, more than %d"
                                % (where, len(group.prompt_id.encode()), MAX_PROMPT_ID_BYTES), g)
    if len(group.prompt_tokens) == 0:
        raise InvalidBatchError(where + ": prompt has no tokens; every prompt needs at least one", g)
    if len(group.prompt_tokens) > limits.max_prompt_tokens:
        raise InvalidBatchError("%s: prompt has %d tokens, more than max_prompt_tokens %d"
                                % (where, len(group.prompt_tokens), limits.max_prompt_tokens), g)
    if elements:
        try:
            _tokens(group.prompt_tokens, limits.vocab_size, where, "prompt")
        except InvalidBatchError as e:
            raise InvalidBatchError(str(e), g) from None
    size = len(group.responses)
    if size < limits.min_group_size or size > limits.max_group_size:
        raise InvalidBatchError("%s: group has %d responses; group size must be in [%d, %d]"
                                % (where, size, limits.min_group_size, limits.max_group_size), g)
    for j, r in enumerate(group.responses):
        _response(r, limits, require_logprobs, "%s response %d" % (where, j), g, j, elements)


class _PlainRules:
    """_group's rules without the elements, for the common case of a valid
    group, in as few Python steps as can be: False sends the group through
    _group, which names the fault."""

    def __init__(self, limits, require_logprobs):
        self.max_prompt, self.max_response = limits.max_prompt_tokens, limits.max_response_tokens
        self.sizes = range(limits.min_group_size, limits.max_group_size + 1)
        self.bound = limits.max_abs_reward or math.inf  # 0: a learner that predates the bound
        self.require_logprobs = require_logprobs

    def group_valid(self, group):
        if not (0 < len(group.prompt_tokens) <= self.max_prompt and len(group.responses) in self.sizes
                and len(group.prompt_id.encode()) <= MAX_PROMPT_ID_BYTES):
            return False
        max_response, bound, isfinite = self.max_response, self.bound, math.isfinite
        for r in group.responses:
            n, lps, reward = len(r.tokens), len(r.behavior_logprobs), r.reward
            if not (0 < n <= max_response and -bound <= reward <= bound and isfinite(reward)
                    and (lps == n or (lps == 0 and not self.require_logprobs))) or r.loss_mask:
                return False  # a loss mask: _group checks it
            if r.HasField("last_policy_version") and not (
                    r.HasField("first_policy_version") and r.last_policy_version >= r.first_policy_version):
                return False
        return True


class BatchOfGroups:
    """A RolloutBatch given as its parts: `groups` (PromptGroup messages),
    `source` and `batch_id`, serialized without first copying the groups
    into one message; validate_batch and encode_valid_batch take it as they
    take a RolloutBatch. SerializeToString() gives the same bytes as the
    RolloutBatch would."""

    def __init__(self, groups, source, batch_id, stamp=None):
        """stamp: a policy version set, in the bytes only, on every response
        that carries neither first_policy_version nor last_policy_version
        (as client.stamp_policy_version would, without copying or changing
        the groups)."""
        self.groups, self.source, self.batch_id, self.stamp = groups, source, batch_id, stamp

    def SerializeToString(self):  # noqa: N802 (the protobuf message's name)
        parts = []
        groups = [g.SerializeToString() for g in self.groups]
        if self.stamp is not None:
            versions = b"".join(bytes([tag]) + _varint_bytes(self.stamp) for tag in _RESPONSE_VARINTS[1:])
            groups = [_stamped_group(g, versions) for g in groups]
        for tag, items in ((_BATCH_GROUPS, groups),
                           (_BATCH_STRINGS[0], [self.source.encode()] if self.source else []),
                           (_BATCH_STRINGS[1], [self.batch_id.encode()] if self.batch_id else [])):
            for b in items:
                parts += [bytes([tag]), _varint_bytes(len(b)), b]
        return b"".join(parts)


def _stamped_group(data, versions):
    """A serialized PromptGroup with `versions` (the bytes of fields
    first_policy_version and last_policy_version, the Response's last) added
    to every response that has neither: the bytes the stamped message
    serializes to."""
    out, pos, end = [], 0, len(data)
    while pos < end:
        start, tag = pos, data[pos]
        n, pos = _length(data, pos + 1)
        if tag == _GROUP_RESPONSES and not _has_versions(data, pos, pos + n):
            response = data[pos:pos + n] + versions
            out += [bytes([tag]), _varint_bytes(len(response)), response]
        else:
            out.append(data[start:pos + n])
        pos += n
    return b"".join(out)


def _has_versions(data, pos, end):
    while pos < end:
        tag = data[pos]
        if tag in _RESPONSE_VARINTS[1:]:
            return True
        if tag == _RESPONSE_TOKENS or tag == _RESPONSE_LOGPROBS:
            n, pos = _length(data, pos + 1)
            pos += n
        elif tag == _RESPONSE_REWARD:
            pos += 5
        else:
            pos = _varint(data, pos + 1)[1]
    return False


def _varint_bytes(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7f | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# The wire format of asympo.v1 RolloutBatch, PromptGroup and Response
# (proto/asympo/v1/rollout.proto): a tag is (field << 3) | wire type.
_LEN, _VARINT, _FIXED32 = 2, 0, 5
_BATCH_GROUPS, _BATCH_STRINGS = 0x0a, (0x12, 0x1a)          # groups; source, batch_id
_GROUP_PROMPT_ID, _GROUP_TOKENS, _GROUP_RESPONSES = 0x0a, 0x12, 0x1a
_RESPONSE_TOKENS, _RESPONSE_REWARD, _RESPONSE_LOGPROBS = 0x0a, 0x15, 0x1a
_RESPONSE_VARINTS = (0x20, 0x28, 0x30)                       # finish_reason, versions


def _varint(data, pos):
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    value, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7f) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _length(data, pos):
    """_varint for a field's length, most often one or two bytes."""
    n = data[pos]
    if n < 0x80:
        return n, pos + 1
    if data[pos + 1] < 0x80:
        return (n & 0x7f) | data[pos + 1] << 7, pos + 2
    return _varint(data, pos)


def _spans(data):
    """The byte ranges of every packed token list (prompts and responses) and
    every packed behavior_logprobs list of a serialized RolloutBatch, or None
    for anything this walk does not expect (then the rules run one by one)."""
    tokens, logprobs = [], []
    pos, end = 0, len(data)
    while pos < end:
        tag = data[pos]
        if tag != _BATCH_GROUPS and tag not in _BATCH_STRINGS:
            return None
        n, pos = _varint(data, pos + 1)
        if tag == _BATCH_GROUPS and not _group_spans(data, pos, pos + n, tokens, logprobs):
            return None
        pos += n
    return (tokens, logprobs) if pos == end else None


def _group_spans(data, pos, end, tokens, logprobs):
    while pos < end:
        tag = data[pos]
        n, pos = _length(data, pos + 1)
        if tag == _GROUP_TOKENS:
            tokens.append((pos, pos + n))
        elif tag == _GROUP_RESPONSES:
            if not _response_spans(data, pos, pos + n, tokens, logprobs):
                return False
        elif tag != _GROUP_PROMPT_ID:
            return False
        pos += n
    return pos == end


def _response_spans(data, pos, end, tokens, logprobs):
    while pos < end:
        tag = data[pos]
        if tag == _RESPONSE_TOKENS or tag == _RESPONSE_LOGPROBS:
            n, pos = _length(data, pos + 1)
            (tokens if tag == _RESPONSE_TOKENS else logprobs).append((pos, pos + n))
            pos += n
        elif tag == _RESPONSE_REWARD:
            pos += 5
        elif tag in _RESPONSE_VARINTS:
            pos = pos + 2 if data[pos + 1] < 0x80 else _varint(data, pos + 1)[1]
        else:
            return False
    return pos == end


def _gather(buf, spans):
    if not spans:
        return buf[:0]
    return np.concatenate([buf[a:b] for a, b in spans]) if len(spans) > 1 else buf[spans[0][0]:spans[0][1]]


def _elements_valid(data, vocab):
    """Whether every token of a serialized RolloutBatch lies in [0, vocab)
    and every behavior log-prob is finite and <= 0, checked with numpy over
    its packed fields. False also when it cannot tell (then the rules run
    one by one and name the fault)."""
    spans = _spans(data)
    if spans is None:
        return False
    buf = np.frombuffer(data, dtype=np.uint8)
    lps = _gather(buf, spans[1])
    if lps.size % 4:
        return False
    lps = lps.view("<f4")
    if lps.size and not ((lps <= 0) & (lps >= -_FLOAT32_MAX)).all():  # NaN fails both
        return False
    return _varints_below(_gather(buf, spans[0]), vocab)


_FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


def _varints_below(b, vocab):
    """Whether the packed varints `b` (uint8) are all in [0, vocab): int32
    tokens, a negative one being 10 bytes long. Decoded at once: each
    value's 7-bit groups shifted into place and summed per value."""
    if b.size == 0:
        return True
    last = b < 0x80
    if not last[-1]:
        return False
    if last.all():
        return int(b.max()) < vocab
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > 4:  # 2^28 or more, or negative: the rules name it
        return False
    shift = (np.arange(b.size) - np.repeat(starts, lengths)) * 7
    values = np.add.reduceat((b & 0x7f).astype(np.int64) << shift, starts)
    return int(values.max()) < vocab
