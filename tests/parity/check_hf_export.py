#!/usr/bin/env python3
"""Checks snug's Hugging Face GPT-2 and Llama exports in PyTorch.

    check_hf_export.py MODEL_DIR [MODEL_DIR ...]

Each MODEL_DIR holds what snug's io::export_hf_gpt2 wrote (model.safetensors,
config.json) plus reference.safetensors from tests/parity/export_reference.cpp:
the tokens (B, T) and snug's logits (B, T, V). The weights are loaded into a
GPT-2 forward written here from torch primitives (in float64: Conv1D-style
x @ W + b, tanh GELU, causal attention, head tied to wte) and, when the
transformers package is importable, into transformers.GPT2LMHeadModel through
from_pretrained (float32). A Llama export (config.json model_type "llama",
io/hf_llama.hpp) the same way: a Llama forward written here (RMSNorm, RoPE
with rotate_half's (i, i + hs/2) pairs, SwiGLU, causal attention, untied
head) and transformers.LlamaForCausalLM. Both must reproduce snug's logits to
a max absolute difference of TOLERANCE.

Exit status: 0 all match, 1 a mismatch or a malformed export, 77 no PyTorch
(ctest reports the test as skipped).
"""
import json
import math
import struct
import sys
from pathlib import Path

try:
    import torch
except ImportError:
    print("check_hf_export: PyTorch is not installed; skipped")
    sys.exit(77)

TOLERANCE = 1e-4  # max |logit difference|; snug computes in fp32, logits are O(10)

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32}


def read_safetensors(path):
    """name -> tensor, and the metadata, read from the file layout directly."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        buf = bytearray(data[base + begin : base + end])
        out[name] = torch.frombuffer(buf, dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, meta


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def gpt2_forward(p, cfg, tokens):
    """GPT-2 logits (B, T, V) from Hugging Face tensors; Conv1D weights are (in, out)."""
    C, NH, L, eps = cfg["n_embd"], cfg["n_head"], cfg["n_layer"], cfg["layer_norm_epsilon"]
    hs = C // NH
    Bn, Tn = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:Tn]
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        h = f"h.{l}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = (t.reshape(Bn, Tn, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=-1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T


def rms_norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate(x, theta):
    """RoPE on (B, NH, T, hs): pairs (i, i + hs/2), angle t theta^(-2i/hs)."""
    hs, Tn = x.shape[-1], x.shape[-2]
    inv = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    ang = torch.arange(Tn, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : hs // 2], x[..., hs // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def llama_forward(p, cfg, tokens):
    """Llama logits (B, T, V) from LlamaForCausalLM's tensors (nn.Linear weights: (out, in))."""
    C, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    KV = cfg.get("num_key_value_heads") or NH  # grouped-query attention: NH // KV query heads per key/value head
    eps, theta, hs = cfg["rms_norm_eps"], cfg["rope_theta"], C // NH
    Bn, Tn = tokens.shape
    x = p["model.embed_tokens.weight"][tokens]
    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        h = f"model.layers.{l}."
        a = rms_norm(x, p[h + "input_layernorm.weight"], eps)
        q, k, v = (
            (a @ p[h + f"self_attn.{n}_proj.weight"].T).reshape(Bn, Tn, -1, hs).transpose(1, 2) for n in "qkv"
        )
        q, k = rotate(q, theta), rotate(k, theta)
        k, v = (t.repeat_interleave(NH // KV, dim=1) for t in (k, v))  # key/value head g serves query heads g G ..
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ p[h + "self_attn.o_proj.weight"].T
        m = rms_norm(x, p[h + "post_attention_layernorm.weight"], eps)
        gate, up = m @ p[h + "mlp.gate_proj.weight"].T, m @ p[h + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ p[h + "mlp.down_proj.weight"].T
    return rms_norm(x, p["model.norm.weight"], eps) @ p["lm_head.weight"].T


def report(what, got, want):
    diff = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    ok = diff <= TOLERANCE
    print(f"  {what:<34} max |diff| {diff:.3e}  (max |logit| {scale:.2f})  {'ok' if ok else 'FAIL'}")
    return ok


def check_plain(model_dir, cfg, tokens, want):
    params, _ = read_safetensors(model_dir / "model.safetensors")
    params = {k: v.double() for k, v in params.items()}
    llama = cfg.get("model_type") == "llama"
    with torch.no_grad():
        got = (llama_forward if llama else gpt2_forward)(params, cfg, tokens.long())
    if got.shape != want.shape:
        print(f"  plain PyTorch: logits shape {tuple(got.shape)}, snug's {tuple(want.shape)}  FAIL")
        return False
    return report(f"plain PyTorch {'Llama' if llama else 'GPT-2'} (float64)", got, want)


def check_transformers(model_dir, tokens, want, llama):
    """transformers' GPT2LMHeadModel or LlamaForCausalLM, loaded from the export."""
    name = "LlamaForCausalLM" if llama else "GPT2LMHeadModel"
    try:
        import transformers
    except ImportError:
        print(f"  transformers is not installed: {name} check skipped")
        return True
    model, info = getattr(transformers, name).from_pretrained(
        str(model_dir), torch_dtype=torch.float32, output_loading_info=True
    )
    # Only GPT-2's tied head and mask buffers may be absent from the file.
    gpt2_absent = lambda k: k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias"))
    missing = [k for k in info["missing_keys"] if llama or not gpt2_absent(k)]
    if missing or info["unexpected_keys"] or info.get("mismatched_keys"):
        print(f"  transformers: missing {missing}, unexpected {info['unexpected_keys']}, "
              f"mismatched {info.get('mismatched_keys')}  FAIL")
        return False
    model.eval()
    with torch.no_grad():
        got = model(tokens.long()).logits
    return report(f"transformers {name} (fp32)", got, want)


def check(model_dir):
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    ref, meta = read_safetensors(model_dir / "reference.safetensors")
    tokens, want = ref["tokens"], ref["logits"]
    llama = cfg.get("model_type") == "llama"
    layers, C = (cfg["num_hidden_layers"], cfg["hidden_size"]) if llama else (cfg["n_layer"], cfg["n_embd"])
    heads = (cfg["num_attention_heads"], cfg.get("num_key_value_heads")) if llama else (cfg["n_head"], None)
    kv = f" ({heads[1]} key/value)" if heads[1] not in (None, heads[0]) else ""
    print(f"{model_dir}: {cfg.get('model_type')}, {layers} layers, C {C}, {heads[0]} heads{kv}, V {cfg['vocab_size']}, "
          f"{cfg.get('torch_dtype')} weights, tokens {tuple(tokens.shape)}")
    ok = check_plain(model_dir, cfg, tokens, want)
    ok = check_transformers(model_dir, tokens, want, llama) and ok
    return ok


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    ok = True
    for d in sys.argv[1:]:
        try:
            ok = check(d) and ok
        except (OSError, KeyError, ValueError, RuntimeError) as e:
            print(f"{d}: {type(e).__name__}: {e}  FAIL")
            ok = False
    print("check_hf_export:", "all logits match" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
