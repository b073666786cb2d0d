"""The PyTorch twin of bench/model_bench.cc: same model shapes, same step.

    /usr/bin/python3 bench/model_bench.py --config tiny|100m --mode train|generate
        [--batch 8] [--seq 256] [--response 192] [--new_tokens 64] [--reps 5] [--threads 2]

Training step: forward, log-probs of the response tokens (log_softmax +
gather, what a Python trainer writes), -(logp * adv).mean(), backward,
torch.optim.AdamW. Generation: greedy decoding with a KV cache that grows by
torch.cat each step (Hugging Face's dynamic cache). Prints one JSON object.
"""
import argparse
import json
import math
import os
import sys
import time

# Debian's PyTorch multiplies matrices with OpenBLAS, whose own thread pool
# torch.set_num_threads does not cap (its idle threads spin between
# products); the pool's size is read when the library loads, so --threads
# is read before torch is imported, as the C++ twin caps it (SetCpuThreads).
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--threads", type=int, default=2)
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max(1, _early.parse_known_args()[0].threads)))
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from hf_reference_model import Reference  # noqa: E402


def bench_config(name):
    if name == "100m":
        return dict(model_type="qwen3", vocab_size=32000, hidden_size=768, intermediate_size=2048,
                    num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4, head_dim=64,
                    rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)
    return dict(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=192,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)


def random_weights(c):
    g = torch.Generator().manual_seed(1)
    h, d = c["hidden_size"], c["head_dim"]
    q, kv, ff = c["num_attention_heads"] * d, c["num_key_value_heads"] * d, c["intermediate_size"]
    n = lambda *s: torch.randn(*s, generator=g) * 0.02
    w = {"model.embed_tokens.weight": n(c["vocab_size"], h), "model.norm.weight": torch.ones(h)}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w.update({p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
                  p + "self_attn.q_proj.weight": n(q, h), p + "self_attn.k_proj.weight": n(kv, h),
                  p + "self_attn.v_proj.weight": n(kv, h), p + "self_attn.o_proj.weight": n(h, q),
                  p + "self_attn.q_norm.weight": torch.ones(d), p + "self_attn.k_norm.weight": torch.ones(d),
                  p + "mlp.gate_proj.weight": n(ff, h), p + "mlp.up_proj.weight": n(ff, h),
                  p + "mlp.down_proj.weight": n(h, ff)})
    return w


def train_flops(c, batch, seq, response):
    h, q = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    kv, ff, L = c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"], c["num_hidden_layers"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * ff
    fwd = 2 * batch * seq * layer * L + 4.0 * batch * seq * seq * q * L + 2.0 * batch * response * h * c["vocab_size"]
    return 3 * fwd


def cached_generate(model, prompts, new_tokens):
    """Greedy decoding with a per-layer KV cache grown by torch.cat."""
    c, w = model.cfg, model.w
    b, t0 = prompts.shape
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    cache = [None] * c["num_hidden_layers"]
    ids, out, pos0 = prompts, [], 0
    for _ in range(new_tokens):
        t = ids.shape[1]
        pos = torch.arange(pos0, pos0 + t).float()
        freqs = torch.outer(pos, model.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = torch.nn.functional.embedding(ids, w["model.embed_tokens.weight"])
        for i in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % i
            lin = lambda name, inp: torch.nn.functional.linear(inp, w[p + name + ".weight"])
            h = model.rms(x, w[p + "input_layernorm.weight"])
            q = model.rms(lin("self_attn.q_proj", h).view(b, t, nh, d), w[p + "self_attn.q_norm.weight"]).transpose(1, 2)
            k = model.rms(lin("self_attn.k_proj", h).view(b, t, nkv, d), w[p + "self_attn.k_norm.weight"]).transpose(1, 2)
            v = lin("self_attn.v_proj", h).view(b, t, nkv, d).transpose(1, 2)
            q = q * cos + model.rotate_half(q) * sin
            k = k * cos + model.rotate_half(k) * sin
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            cache[i] = (k, v)
            kk = k.repeat_interleave(nh // nkv, dim=1)
            vv = v.repeat_interleave(nh // nkv, dim=1)
            s = q @ kk.transpose(-1, -2) / math.sqrt(d)
            if t > 1:
                s = s + torch.full((t, t), float("-inf")).triu(1)
            o = (torch.softmax(s, dim=-1) @ vv).transpose(1, 2).reshape(b, t, nh * d)
            x = x + lin("self_attn.o_proj", o)
            h = model.rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + lin("mlp.down_proj", torch.nn.functional.silu(lin("mlp.gate_proj", h)) * lin("mlp.up_proj", h))
        x = model.rms(x[:, -1:], w["model.norm.weight"])
        nxt = torch.nn.functional.linear(x, w["model.embed_tokens.weight"]).argmax(-1)
        out.append(nxt)
        pos0 += t
        ids = nxt
    return torch.cat(out, dim=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--mode", default="train")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--response", type=int, default=192)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    c = bench_config(a.config)
    model = Reference(c, random_weights(c))
    times = []
    if a.mode == "train":
        prompt = a.seq - a.response
        ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq))
        targets = ids[:, prompt:]
        adv = torch.randn(a.batch, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)

        def step():
            opt.zero_grad(set_to_none=True)
            logits = model(ids)[:, prompt - 1:-1]
            logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            (-(logp * adv).mean()).backward()
            opt.step()
        step()
        for _ in range(a.reps):
            t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
        s = sorted(times)[len(times) // 2]
        print(json.dumps({"mode": "train", "config": a.config, "median_s": s,
                          "tokens_per_s": a.batch * a.seq / s,
                          "flops": train_flops(c, a.batch, a.seq, a.response) / s}))
    else:
        prompts = torch.randint(0, c["vocab_size"], (a.batch, 16))
        with torch.no_grad():
            cached_generate(model, prompts, a.new_tokens)
            for _ in range(a.reps):
                t0 = time.perf_counter(); cached_generate(model, prompts, a.new_tokens)
                times.append(time.perf_counter() - t0)
        s = sorted(times)[len(times) // 2]
        print(json.dumps({"mode": "generate", "config": a.config, "median_s": s,
                          "tokens_per_s": a.batch * a.new_tokens / s}))


if __name__ == "__main__":
    main()
