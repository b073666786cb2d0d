"""Typed errors of the asympo-rl client. Every one is an AsympoError."""


class AsympoError(Exception):
    """Base class of the client's errors."""


class InvalidBatchError(AsympoError, ValueError):
    """A batch breaks one of the learner's rules (docs/protocol.md,
    "Validation"), or the learner cannot take it as it is: the retry
    policy's drop_batch (docs/protocol.md, "Retries"). Raised before sending
    when the client's own check finds it, with the learner's message
    otherwise. Never retried."""

    def __init__(self, message, group=None, response=None):
        super().__init__(message)
        self.group = group        # index of the offending group, when known
        self.response = response  # index of the offending response, when known


class RefusedError(AsympoError):
    """The learner refused the call for good: the retry policy's fatal, a
    configuration error (PERMISSION_DENIED, UNAUTHENTICATED, NOT_FOUND,
    UNIMPLEMENTED, ...; docs/protocol.md, "Retries"). `code` is the
    grpc.StatusCode."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class LearnerUnavailableError(AsympoError):
    """The learner could not be reached, or kept refusing with a retryable
    code, until the client's retry budget ran out. A batch sent with a
    batch_id may be sent again safely: it is trained at most once."""

    def __init__(self, message, code=None, attempts=0):
        super().__init__(message)
        self.code = code
        self.attempts = attempts


class LearnerBusyError(LearnerUnavailableError):
    """The learner's queue stayed full (RESOURCE_EXHAUSTED) until the retry
    budget ran out."""


class WeightsError(AsympoError):
    """A weight snapshot could not be received: a checksum mismatch, a
    truncated transfer, or a manifest that does not describe its bytes."""
