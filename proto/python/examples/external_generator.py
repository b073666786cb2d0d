#!/usr/bin/env python3
"""A complete external generator: its own sampler in PyTorch, the learner's
weights through asympo_rl.WeightSubscriber, its own reward function, and
batches submitted through asympo_rl.LearnerClient (exactly once).

It plays the part of a vLLM or SGLang fleet for the learner's built-in tiny
model on the `copy` task (prompt [BOS, 4, s1..sn, SEP], answer s1..sn, EOS;
docs/tasks.md), so it runs on a laptop:

    asympo-learner --model=tiny --tiny_vocab_size=16 --prompts_per_step=8 --lr=5e-4 \
        --queue_capacity=16 --max_groups_per_batch=16      # config.json: its --export_dir
    python3 external_generator.py --learner 127.0.0.1:50051 \\
        --config /tmp/tiny/config.json --rounds 400

The model code is a plain PyTorch Llama/Qwen3 forward (the architecture the
learner runs, docs/model.md); a real deployment hands the same (name,
tensor) pairs to its engine instead (docs/external_generators.md).
Prints one line per --log_every rounds and, at the end, a JSON summary."""
import argparse
import json
import math
import os
import random
import sys
import threading
import time

# One thread (set_num_threads below) for OpenBLAS too: where PyTorch uses it
# (Debian's), its own pool is not capped by torch.set_num_threads and spins
# between matrix products. Read when the library loads, so set before.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402

import asympo_rl

BOS, EOS, SEP, COPY, FIRST_SYMBOL = 1, 2, 3, 4, 8


class Policy(torch.nn.Module):
    """A Llama/Qwen3 decoder (RMSNorm, RoPE, grouped-query attention,
    Qwen3's q/k norm, SwiGLU, tied embeddings) over a state dict with
    Hugging Face names."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.w = cfg, {}
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        # transformers 5 keeps rope_theta inside rope_parameters.
        base = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)

    def load(self, state_dict):
        self.w = {k: v.float() for k, v in state_dict.items()}

    def norm(self, x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope(self, x, t):
        freqs = torch.outer(torch.arange(t).float(), self.inv_freq)
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    @torch.no_grad()
    def forward(self, ids):
        w, (b, t) = self.w, ids.shape
        lin = lambda name, x: torch.nn.functional.linear(x, w[name + ".weight"], w.get(name + ".bias"))
        x = w["model.embed_tokens.weight"][ids]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for i in range(self.cfg["num_hidden_layers"]):
            p = "model.layers.%d." % i
            h = self.norm(x, w[p + "input_layernorm.weight"])
            q = lin(p + "self_attn.q_proj", h).view(b, t, self.heads, self.head_dim)
            k = lin(p + "self_attn.k_proj", h).view(b, t, self.kv_heads, self.head_dim)
            v = lin(p + "self_attn.v_proj", h).view(b, t, self.kv_heads, self.head_dim)
            if p + "self_attn.q_norm.weight" in w:
                q, k = self.norm(q, w[p + "self_attn.q_norm.weight"]), self.norm(k, w[p + "self_attn.k_norm.weight"])
            q, k, v = (self.rope(q.transpose(1, 2), t), self.rope(k.transpose(1, 2), t), v.transpose(1, 2))
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask, -1)
            x = x + lin(p + "self_attn.o_proj", (att @ v).transpose(1, 2).reshape(b, t, -1))
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            x = x + lin(p + "mlp.down_proj",
                        torch.nn.functional.silu(lin(p + "mlp.gate_proj", h)) * lin(p + "mlp.up_proj", h))
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return torch.nn.functional.linear(self.norm(x, w["model.norm.weight"]), head)


def sample(policy, prompt, n, max_new, temperature, gen):
    """n responses to one prompt, each ending at EOS or max_new tokens."""
    seqs = torch.tensor([prompt] * n)
    done = torch.zeros(n, dtype=torch.bool)
    out = [[] for _ in range(n)]
    for _ in range(max_new):
        logits = policy(seqs)[:, -1, :] / temperature
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
        for i in range(n):
            if not done[i]:
                out[i].append(int(nxt[i]))
        done |= nxt == EOS
        if bool(done.all()):
            break
        seqs = torch.cat([seqs, nxt[:, None]], 1)
    return out


def reward(symbols, resp):
    """The copy task's reward: positions right / max(len(response), n + 1)."""
    expected = symbols + [EOS]
    right = sum(1 for a, b in zip(resp, expected) if a == b)
    return right / max(len(resp), len(expected))


class LatestWeights:
    """Keeps the newest verified snapshot from a WeightSubscriber thread."""

    def __init__(self, subscriber):
        self.sub, self.lock, self.snap, self.stopped = subscriber, threading.Lock(), None, False
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        for snap in self.sub.snapshots(stop=lambda: self.stopped):
            with self.lock:
                self.snap = snap
            self.ready.set()

    def take(self):
        with self.lock:
            snap, self.snap = self.snap, None
        return snap


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--learner", required=True, help="the learner's host:port")
    ap.add_argument("--config", required=True, help="the model's config.json (the learner's export)")
    ap.add_argument("--rounds", type=int, default=400, help="batches to submit")
    ap.add_argument("--prompts", type=int, default=8, help="prompt groups per batch")
    ap.add_argument("--group_size", type=int, default=16)
    ap.add_argument("--symbols", type=int, default=4, help="alphabet size of the copy task")
    ap.add_argument("--temperature", type=float, default=1.3,
                    help="sampling temperature (1.3 keeps every symbol in play; docs/tasks.md)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--source", default="example-generator")
    ap.add_argument("--log_every", type=int, default=20)
    ap.add_argument("--weights_dir", default="",
                    help="also write every loaded version as a Hugging Face directory here (a link)")
    ap.add_argument("--confirm_at", default="trained", choices=["trained", "recorded"],
                    help="when the client forgets a batch it sent (docs/protocol.md, \"Recovery "
                         "after a learner restart\"): \"recorded\" for a learner with "
                         "--checkpoint_dir, whose checkpoints outlive a restart; \"trained\" "
                         "for one without (the example's)")
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    torch.set_num_threads(1)
    rng, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)

    client = asympo_rl.LearnerClient(args.learner, source=args.source, confirm_at=args.confirm_at)
    status = client.status(timeout=60)
    if status.limits.vocab_size != cfg["vocab_size"]:
        sys.exit("the learner's vocabulary is %d, the config's %d" % (status.limits.vocab_size,
                                                                      cfg["vocab_size"]))
    weights = LatestWeights(asympo_rl.WeightSubscriber(args.learner, receiver_id=args.source))
    if not weights.ready.wait(120):
        sys.exit("no weights from the learner within 120 s")
    policy, version, rewards, lines = Policy(cfg), None, [], []
    start = time.time()
    for r in range(args.rounds):
        snap = weights.take()
        if snap is not None:  # load between generations, as an engine would
            policy.load(snap.state_dict("torch"))
            version = snap.version
            weights.sub.report(version)
            if args.weights_dir:
                asympo_rl.write_hf_directory(snap, args.weights_dir, cfg)
        groups, round_rewards = [], []
        for p in range(args.prompts):
            n = rng.randint(2, 4)
            symbols = [FIRST_SYMBOL + rng.randrange(args.symbols) for _ in range(n)]
            responses = sample(policy, [BOS, COPY] + symbols + [SEP], args.group_size, n + 2,
                               args.temperature, gen)
            scored = [(resp, reward(symbols, resp)) for resp in responses]
            round_rewards += [s for _, s in scored]
            groups.append(asympo_rl.group([BOS, COPY] + symbols + [SEP], scored,
                                          prompt_id="r%d-p%d" % (r, p)))
        result = client.submit(groups, policy_version=version)  # the weights that sampled them
        rewards.append(sum(round_rewards) / len(round_rewards))
        if (r + 1) % args.log_every == 0 or r == 0:
            line = "round %d version %s reward %.3f (last %d: %.3f) learner %d queue %d" % (
                r + 1, version, rewards[-1], min(len(rewards), args.log_every),
                sum(rewards[-args.log_every:]) / len(rewards[-args.log_every:]), result.learner_version,
                result.queue_depth_groups)
            print(line, flush=True)
    weights.stopped = True
    k = min(20, len(rewards))
    summary = {"rounds": len(rewards), "first_reward": sum(rewards[:k]) / k,
               "last_reward": sum(rewards[-k:]) / k, "last_version": version,
               "seconds": round(time.time() - start, 1), "weight_failures": weights.sub.failures}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
