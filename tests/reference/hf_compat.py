"""The few calls of the reference scripts whose keywords differ between
transformers 4 and 5 (tests/reference/hf_gpu_logits_check.py,
bench/gpu_model_bench.py). Plain functions of the version string, so that
they are tested without transformers installed.

- dtype: `from_config(..., dtype=)` since 4.56; `torch_dtype=` before (5.x
  still takes it, with a deprecation warning).
- rotary settings: transformers 5 takes them in one `rope_parameters` dict
  (rope_theta, rope_type and the scaling factors) and writes that to
  config.json; 4.x takes `rope_theta` and `rope_scaling`.
- `save_pretrained` writes safetensors by default since 4.35; 5.x removed
  its `safe_serialization` keyword.
"""
import re


def version_tuple(version):
    """(major, minor, patch) of "4.57.1", "5.0.0rc1", "5.1.0.dev0"."""
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))


def dtype_kwargs(version, dtype):
    return {"dtype": dtype} if version_tuple(version) >= (4, 56) else {"torch_dtype": dtype}


def rope_kwargs(version, theta, scaling=None):
    """Config keywords for rope theta `theta` and an optional scaling dict
    ({"rope_type": "llama3", "factor": ...})."""
    if version_tuple(version) >= (5, 0):
        params = dict(scaling or {})
        params.setdefault("rope_type", "default")
        params["rope_theta"] = theta
        return {"rope_parameters": params}
    return {"rope_theta": theta, "rope_scaling": dict(scaling) if scaling else None}


def save_kwargs(version):
    return {} if version_tuple(version) >= (4, 35) else {"safe_serialization": True}
