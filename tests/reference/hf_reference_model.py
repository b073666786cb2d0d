"""An independent PyTorch implementation of the Hugging Face Llama / Qwen3
forward pass, written from the transformers modeling code's semantics
(LlamaRMSNorm, rotate_half RoPE with llama3 scaling, repeat_kv GQA, Qwen3
q/k norm, SwiGLU MLP, tied embeddings). It reads a checkpoint directory
(config.json + model.safetensors) with nothing but json and torch.

Used by the model reference test (logits of the C++ model against these) and
by the benchmarks as the equivalent Python program.

    python3 hf_reference_model.py MODEL_DIR IDS_FILE OUT_FILE
reads whitespace-separated token ids (one sequence per line), writes the
final-position-free logits of every position as float32 raw bytes.
"""
import json
import math
import struct
import sys

import torch

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=_DTYPES[info["dtype"]]) if buf else torch.empty(0, dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def rope_settings(cfg):
    """(theta, scaling) from either layout of config.json: transformers <= 4
    writes a top-level rope_theta and a rope_scaling dict, transformers 5 one
    rope_parameters dict holding both (optionally one per layer type)."""
    params = cfg.get("rope_parameters") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        params = params["full_attention"]
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    return theta, cfg.get("rope_scaling") or params


def rope_inv_freq(cfg):
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base, scaling = rope_settings(cfg)
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling.get("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings", cfg.get("max_position_embeddings")))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Reference(torch.nn.Module):
    def __init__(self, cfg, weights):
        super().__init__()
        self.cfg = cfg
        self.w = {k: torch.nn.Parameter(v.float()) for k, v in weights.items()}
        for i, (k, p) in enumerate(self.w.items()):
            self.register_parameter("p%d" % i, p)
        self.inv_freq = rope_inv_freq(cfg)

    def rms(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.get("rms_norm_eps", 1e-6))
        return w * xf.to(x.dtype)

    @staticmethod
    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, ids):
        cfg, w = self.cfg, self.w
        b, t = ids.shape
        nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        d = cfg.get("head_dim") or cfg["hidden_size"] // nh
        qwen3 = cfg["model_type"] == "qwen3"
        pos = torch.arange(t).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = torch.nn.functional.embedding(ids, w["model.embed_tokens.weight"])
        for i in range(cfg["num_hidden_layers"]):
            p = "model.layers.%d." % i
            h = self.rms(x, w[p + "input_layernorm.weight"])
            lin = lambda name, inp: torch.nn.functional.linear(inp, w[p + name + ".weight"], w.get(p + name + ".bias"))
            q = lin("self_attn.q_proj", h).view(b, t, nh, d)
            k = lin("self_attn.k_proj", h).view(b, t, nkv, d)
            v = lin("self_attn.v_proj", h).view(b, t, nkv, d)
            if qwen3:
                q = self.rms(q, w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, w[p + "self_attn.k_norm.weight"])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + mask, dim=-1)
            o = (att @ v).transpose(1, 2).reshape(b, t, nh * d)
            x = x + lin("self_attn.o_proj", o)
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + lin("mlp.down_proj", torch.nn.functional.silu(lin("mlp.gate_proj", h)) * lin("mlp.up_proj", h))
        x = self.rms(x, w["model.norm.weight"])
        head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
        return torch.nn.functional.linear(x, head)


def load(model_dir):
    with open(model_dir + "/config.json") as f:
        cfg = json.load(f)
    return Reference(cfg, load_safetensors(model_dir + "/model.safetensors"))


def main():
    model = load(sys.argv[1])
    with open(sys.argv[2]) as f:
        rows = [[int(x) for x in line.split()] for line in f if line.strip()]
    with torch.no_grad(), open(sys.argv[3], "wb") as out:
        for row in rows:
            logits = model(torch.tensor([row]))
            out.write(logits.float().contiguous().numpy().tobytes())


if __name__ == "__main__":
    main()
