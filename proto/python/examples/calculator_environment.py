#!/usr/bin/env python3
"""The "add_tool" task's calculator as a Python environment service: the
same episodes as the rollout daemon's built-in one (docs/tasks.md,
"add_tool"), through the asympo.v1.Environment service.

A prompt is [BOS, ADD_TOOL, 2 3 + 4 5 + 1 7, SEP]. A turn of the model that
ends with CALL asks for the sum it wrote ("23 + 45 CALL", or "+ 17 CALL" to
go on from the last answer) and is answered "= 68"; an expression that
cannot be read is answered ",". A turn that ends otherwise (EOS) ends the
episode: reward 1 when the digits after the transcript's last "=" are the
sum of the prompt's numbers.

    python3 calculator_environment.py --listen 127.0.0.1:50070 [--token_file F]
    asympo-rollout --task=add_tool --environment=127.0.0.1:50070 \
        [--environment_token_file F] ...

Prints "listening on HOST:PORT" once it serves."""
import argparse
import time

import asympo_rl

# The synthetic tasks' ids (rollout_server/tasks/tasks.h, addition_task.h).
EOS, FIRST_DIGIT = 2, 8
PLUS, EQUALS, COMMA, CALL = 18, 19, 20, 23


def digits(n):
    return [FIRST_DIGIT + int(c) for c in str(n)]


def read_sum(tokens, previous):
    """The sum written by `tokens` ([+] n (+ n)*, numbers of 1 to 4
    digits; a leading + adds to `previous`), or None."""
    total, i = 0, 0
    if tokens[:1] == [PLUS]:
        if previous is None:
            return None
        total, i = previous, 1
    while True:
        start = i
        while i < len(tokens) and FIRST_DIGIT <= tokens[i] < FIRST_DIGIT + 10 and i - start < 5:
            i += 1
        if not 1 <= i - start <= 4:
            return None
        total += int("".join(str(t - FIRST_DIGIT) for t in tokens[start:i]))
        if i == len(tokens):
            return total
        if tokens[i] != PLUS:
            return None
        i += 1


def final_answer(transcript):
    """The number between the transcript's last "=" (or its start) and its
    EOS, or None."""
    if EOS not in transcript:
        return None
    end = transcript.index(EOS)
    begin = max([i + 1 for i, t in enumerate(transcript[:end]) if t == EQUALS], default=0)
    number = transcript[begin:end]
    if not 1 <= len(number) <= 4 or any(not FIRST_DIGIT <= t < FIRST_DIGIT + 10 for t in number):
        return None
    if len(number) > 1 and number[0] == FIRST_DIGIT:
        return None
    return int("".join(str(t - FIRST_DIGIT) for t in number))


class Calculator(asympo_rl.Environment):
    def reset(self, prompt_tokens, prompt_id, reference, index, seed):
        words = reference.split()
        if not words or words[0] != "add":
            raise ValueError("prompt %s is not an add_tool prompt (reference %r)" % (prompt_id, reference))
        return {"sum": sum(int(w) for w in words[1:]), "transcript": [], "previous": None}

    def step(self, state, turn_tokens, turn, final, tokens_left):
        state["transcript"] += turn_tokens
        if turn_tokens[-1:] == [CALL] and not final:
            total = read_sum(turn_tokens[:-1], state["previous"])
            append = [COMMA] if total is None else [EQUALS] + digits(total)
            if total is not None:
                state["previous"] = total
            if len(append) < tokens_left:
                state["transcript"] += append
                return asympo_rl.Answer(append=append)
        solved = final_answer(state["transcript"]) == state["sum"]
        return asympo_rl.Answer(done=True, reward=1.0 if solved else 0.0, correct=solved)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:50070")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--token_file", default="",
                   help="a file whose first line is the bearer token callers must send "
                        "(the daemon's --environment_token_file)")
    args = p.parse_args()
    token = open(args.token_file).readline().strip() if args.token_file else None
    server = Calculator().serve(args.listen, max_workers=args.workers, token=token)
    print("listening on %s:%d" % (args.listen.rsplit(":", 1)[0], server.port), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop(1)


if __name__ == "__main__":
    main()
