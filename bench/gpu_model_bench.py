"""The PyTorch/transformers twin of bench/model_bench.cc on a GPU: the same
model shapes and the same step, written the way a Python trainer writes it.

    python3 bench/gpu_model_bench.py --config qwen3-0.6b --mode train --batch 8 --seq 1024 --response 768
    python3 bench/gpu_model_bench.py --config qwen3-0.6b --mode generate --batch 64 --new_tokens 512

Train: transformers' Qwen3ForCausalLM (random init, float32 parameters) under
bfloat16 autocast, the response tokens' log-probs by log_softmax + gather in
float32, -(logp * adv).mean(), backward, torch.optim.AdamW.
Generate: the model in bfloat16, model.generate with the static KV cache,
sampling at temperature 1, exactly --new_tokens new tokens per row.
Prints one JSON object like model_bench's.
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("gpu_model_bench: PyTorch is not installed", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from hf_compat import dtype_kwargs, rope_kwargs  # noqa: E402


def qwen3_config(name):
    import transformers
    from transformers import Qwen3Config
    small = name == "qwen3-0.6b"
    return Qwen3Config(vocab_size=151936, hidden_size=1024 if small else 2048,
                       intermediate_size=3072 if small else 6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, attention_bias=False,
                       **rope_kwargs(transformers.__version__, 1000000.0))


def from_config(cfg, dtype):
    import transformers
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                            **dtype_kwargs(transformers.__version__, dtype))


def train_flops(c, batch, seq, response):
    # bench/bench_models.h TrainStepFlops, the same count.
    h, q, kv, ff = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
    layer = h * q + 2 * h * kv + q * h + 3 * h * ff
    fwd = 2 * batch * seq * layer * c.num_hidden_layers + 4.0 * batch * seq * seq * q * c.num_hidden_layers \
        + 2.0 * batch * response * h * c.vocab_size
    return 3 * fwd


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_train(a, cfg):
    torch.manual_seed(1)
    model = from_config(cfg, torch.float32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prompt = a.seq - a.response
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    targets = ids[:, prompt:]
    adv = torch.randn(a.batch, 1, device="cuda").expand(a.batch, a.response)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model.model(input_ids=ids).last_hidden_state[:, prompt - 1:-1]
            logits = model.lm_head(hidden)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        (-(logp * adv).mean()).backward()
        opt.step()

    s = timed(step, a.reps)
    flops = train_flops(cfg, a.batch, a.seq, a.response) / s
    return {"mode": "train", "config": a.config, "impl": "pytorch", "median_s": s,
            "tokens_per_s": a.batch * a.seq / s, "flops": flops,
            "mfu": flops / (a.peak_tflops * 1e12) if a.peak_tflops > 0 else 0.0,
            "peak_memory_bytes": torch.cuda.max_memory_allocated()}


def bench_generate(a, cfg):
    torch.manual_seed(1)
    model = from_config(cfg, torch.bfloat16).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (a.batch, 16), device="cuda")
    mask = torch.ones_like(ids)

    def gen():
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                 cache_implementation="static", pad_token_id=0, eos_token_id=None)
        assert out.shape[1] == 16 + a.new_tokens, out.shape

    s = timed(gen, a.reps)
    return {"mode": "generate", "config": a.config, "impl": "transformers-static-cache", "batch": a.batch,
            "new_tokens": a.new_tokens, "median_s": s, "tokens_per_s": a.batch * a.new_tokens / s}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="qwen3-0.6b", choices=["qwen3-0.6b", "qwen3-1.7b"])
    p.add_argument("--mode", default="train", choices=["train", "generate"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--response", type=int, default=768)
    p.add_argument("--new_tokens", type=int, default=512)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--peak_tflops", type=float, default=0.0)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_model_bench: no CUDA device", file=sys.stderr)
        return 77
    cfg = qwen3_config(a.config)
    out = bench_train(a, cfg) if a.mode == "train" else bench_generate(a, cfg)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
