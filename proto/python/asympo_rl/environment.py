"""Environments as services (docs/protocol.md, "Environments"). A rollout
daemon started with --environment=host:port runs each response of a group
as an episode against this server: Reset with the group's prompt, then a
Step per turn of the model, answered with the tokens to insert before its
next turn or, at the end, with the reward. Write reset and step:

    class Calculator(asympo_rl.Environment):
        def reset(self, prompt_tokens, prompt_id, reference, index, seed):
            return {"transcript": []}          # the episode's state, anything
        def step(self, state, turn_tokens, turn, final, tokens_left):
            if wants_a_tool(turn_tokens) and not final:
                return asympo_rl.Answer(append=tool_output)     # goes on
            return asympo_rl.Answer(done=True, reward=1.0, correct=True)

    Calculator().serve("127.0.0.1:50070").wait_for_termination()

`final` is set on the last turn the daemon allows (its turn and token
limits): answer it done. An answer must leave room for one generated token
(at most tokens_left - 1 appended). An exception in reset or step fails
that episode (INTERNAL, with its message); the daemon drops its group and
counts the failure. Steps of one episode never overlap; different episodes
run concurrently on the server's threads. proto/python/examples/
calculator_environment.py serves the built-in "add_tool" task."""
import collections
import math
import threading
import time
import uuid
from concurrent import futures

from .errors import AsympoError

Answer = collections.namedtuple("Answer", "append done reward correct")
Answer.__new__.__defaults__ = ((), False, 0.0, False)
Answer.__doc__ = ("What step returns: tokens to append before the model's next turn (when not "
                  "done), or done with the episode's reward (finite) and whether it is solved.")


class Environment:
    """Subclass it with reset and step; serve() runs it as the
    asympo.v1.Environment service."""

    def reset(self, prompt_tokens, prompt_id, reference, index, seed):
        """A new episode for response `index` of the group on the prompt;
        returns its state (passed to step and close)."""
        raise NotImplementedError

    def step(self, state, turn_tokens, turn, final, tokens_left):
        """The model's turn `turn` (its tokens, stop token included);
        returns an Answer."""
        raise NotImplementedError

    def close(self, state):
        """The episode is over (done, failed or abandoned). Optional."""

    def serve(self, address, max_workers=16, tls=None, token=None, insecure=False, max_episodes=65536,
              idle_timeout=3600.0):
        """Starts the service at `address` (host:port) and returns the
        started grpc.Server. tls: (private_key_pem, certificate_chain_pem),
        bytes; token: the bearer token callers must send. Beyond loopback
        the server needs TLS unless `insecure`. At most `max_episodes` are
        open at once; an episode no call has touched for `idle_timeout`
        seconds is closed (its daemon died, or cancelled the Reset that
        opened it); None keeps them until Close."""
        if idle_timeout is not None and not idle_timeout > 0:
            raise AsympoError("Environment.serve: idle_timeout=%r must be positive seconds, or None"
                              % (idle_timeout,))
        import grpc
        from ._stubs import environment_pb2_grpc

        host = address.rsplit(":", 1)[0].strip("[]")
        if tls is None and not insecure and host not in ("127.0.0.1", "localhost", "::1"):
            raise AsympoError("Environment.serve(%r): beyond loopback the service needs tls (or "
                              "insecure=True)" % address)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        environment_pb2_grpc.add_EnvironmentServicer_to_server(_Servicer(self, token, max_episodes, idle_timeout), server)
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
        if port == 0:
            raise AsympoError("Environment.serve: cannot listen on %s" % address)
        server.start()
        server.port = port
        return server


class _Servicer:
    """The gRPC methods over an Environment's reset, step and close."""

    def __init__(self, env, token, max_episodes, idle_timeout):
        self.env, self.token, self.max_episodes = env, token, max_episodes
        self.idle_timeout = idle_timeout
        self.lock = threading.Lock()
        self.states = {}  # episode_id -> [state, when a call last touched it]
        self.swept = time.monotonic()

    def _close(self, state):
        try:
            self.env.close(state)
        except Exception:  # noqa: BLE001 (Close's errors are ignored by the daemon)
            pass

    def _expire(self):
        """Closes the episodes idle past idle_timeout; looks at most every
        quarter of it (and every minute)."""
        if self.idle_timeout is None:
            return
        now = time.monotonic()
        with self.lock:
            if now - self.swept < min(self.idle_timeout / 4, 60.0):
                return
            self.swept = now
            idle = [k for k, (_, used) in self.states.items() if now - used > self.idle_timeout]
            expired = [self.states.pop(k)[0] for k in idle]
        for state in expired:
            self._close(state)

    def _check_token(self, context):
        import grpc
        if self.token is None:
            return
        sent = dict(context.invocation_metadata()).get("authorization", "")
        if sent != "Bearer " + self.token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "a missing or wrong bearer token")

    def Reset(self, request, context):
        import grpc
        from ._stubs import environment_pb2
        self._check_token(context)
        self._expire()
        with self.lock:
            if len(self.states) >= self.max_episodes:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              "%d episodes are open (max_episodes)" % len(self.states))
        try:
            state = self.env.reset(list(request.prompt_tokens), request.prompt_id, request.reference,
                                   request.response_index, request.seed)
        except Exception as e:  # noqa: BLE001 (the episode fails, the server goes on)
            context.abort(grpc.StatusCode.INTERNAL, "reset raised %s: %s" % (type(e).__name__, e))
        if not context.is_active():  # cancelled or past its deadline: no one will close it
            self._close(state)
            return environment_pb2.ResetResponse()
        episode_id = uuid.uuid4().hex
        with self.lock:
            self.states[episode_id] = [state, time.monotonic()]
        return environment_pb2.ResetResponse(episode_id=episode_id)

    def Step(self, request, context):
        import grpc
        from ._stubs import environment_pb2
        self._check_token(context)
        with self.lock:
            entry = self.states.get(request.episode_id)
            if entry is not None:
                entry[1] = time.monotonic()
        if entry is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no open episode %r" % request.episode_id[:64])
        try:
            answer = self.env.step(entry[0], list(request.turn_tokens), request.turn, request.final,
                                   request.tokens_left)
            reply = _reply(environment_pb2, answer)
        except Exception as e:  # noqa: BLE001
            context.abort(grpc.StatusCode.INTERNAL, "step raised %s: %s" % (type(e).__name__, e))
        finally:
            entry[1] = time.monotonic()  # a long step is not idleness
        return reply

    def Close(self, request, context):
        from ._stubs import environment_pb2
        self._check_token(context)
        with self.lock:
            entry = self.states.pop(request.episode_id, None)
        if entry is not None:
            self._close(entry[0])
        return environment_pb2.CloseResponse()


def _reply(pb, answer):
    if not isinstance(answer, Answer):
        raise TypeError("step must return an asympo_rl.Answer, not %s" % type(answer).__name__)
    reward = float(answer.reward)
    if answer.done and not math.isfinite(reward):
        raise ValueError("the reward of a done answer must be finite, not %r" % reward)
    append = [int(t) for t in answer.append] if not answer.done else []
    if any(t < 0 for t in append):
        raise ValueError("appended tokens must be ids >= 0")
    return pb.StepResponse(append_tokens=append, done=bool(answer.done), reward=reward,
                           correct=bool(answer.correct))
