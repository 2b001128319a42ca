#!/usr/bin/env python3
"""Writes tests/data/gpt_reference.safetensors: a small GPT-2 built here with
PyTorch, independently of snug, and one forward/backward pass on random tokens.

The C++ test (tests/host/gpt_parity_test.cpp) loads the parameters, runs its
own GPT on the same tokens, and checks logits, loss and every gradient.

The parameters are float32 (what both sides start from); the pass runs in
float64, so the reference outputs are exact to well below fp32's precision.
Tensor names are Hugging Face GPT2Model's, with nn.Linear's (out, in) layout.
Run with Debian's python3-torch:  python3 tests/parity/make_gpt_reference.py
"""
import json
import math
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# Odd sizes on purpose: V not a multiple of 8 and padded to Vp, C not a multiple
# of 32, head size 12, T shorter than the context.
CONFIG = dict(vocab_size=97, padded_vocab_size=128, max_seq_len=16, n_layer=2, n_head=4, channels=48)
B, T = 3, 11
SEED = 1234


def make_parameters(gen):
    V, Vp, maxT = CONFIG["vocab_size"], CONFIG["padded_vocab_size"], CONFIG["max_seq_len"]
    L, C = CONFIG["n_layer"], CONFIG["channels"]

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def near(shape, mean, std):  # LayerNorm weights and all biases: non-trivial values
        return mean + normal(*shape, std=std)

    p = {}
    wte = torch.zeros(Vp, C)
    wte[:V] = normal(V, C, std=0.2)
    p["wte.weight"] = wte
    p["wpe.weight"] = normal(maxT, C, std=0.3)
    for l in range(L):
        h = f"h.{l}."
        p[h + "ln_1.weight"] = near((C,), 1.0, 0.1)
        p[h + "ln_1.bias"] = near((C,), 0.0, 0.1)
        p[h + "attn.c_attn.weight"] = normal(3 * C, C, std=0.3)
        p[h + "attn.c_attn.bias"] = near((3 * C,), 0.0, 0.1)
        p[h + "attn.c_proj.weight"] = normal(C, C, std=0.2)
        p[h + "attn.c_proj.bias"] = near((C,), 0.0, 0.1)
        p[h + "ln_2.weight"] = near((C,), 1.0, 0.1)
        p[h + "ln_2.bias"] = near((C,), 0.0, 0.1)
        p[h + "mlp.c_fc.weight"] = normal(4 * C, C, std=0.2)
        p[h + "mlp.c_fc.bias"] = near((4 * C,), 0.0, 0.1)
        p[h + "mlp.c_proj.weight"] = normal(C, 4 * C, std=0.1)
        p[h + "mlp.c_proj.bias"] = near((C,), 0.0, 0.1)
    p["ln_f.weight"] = near((C,), 1.0, 0.1)
    p["ln_f.bias"] = near((C,), 0.0, 0.1)
    return p


def gpt_forward(p, tokens, targets):
    """GPT-2 forward in float64 from torch primitives: returns (logits, loss)."""
    V, L, NH, C = CONFIG["vocab_size"], CONFIG["n_layer"], CONFIG["n_head"], CONFIG["channels"]
    hs = C // NH
    Bn, Tn = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:Tn]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps=1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(Bn, Tn, NH, hs).transpose(1, 2)
        k = k.view(Bn, Tn, NH, hs).transpose(1, 2)
        v = v.view(Bn, Tn, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps=1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
    logits = x @ p["wte.weight"][:V].T
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss


def write_safetensors(path, tensors, metadata):
    """The safetensors layout: u64 header size, JSON header, raw little-endian data."""
    dtype_names = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = dict(dtype=dtype_names[t.dtype], shape=list(t.shape), data_offsets=[offset, offset + len(data)])
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)
    tmp.replace(path)


def main():
    gen = torch.Generator().manual_seed(SEED)
    params32 = make_parameters(gen)
    V = CONFIG["vocab_size"]
    tokens = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    params = {k: v.double().requires_grad_(True) for k, v in params32.items()}
    logits, loss = gpt_forward(params, tokens, targets)
    loss.backward()

    out = {f"param.{k}": v for k, v in params32.items()}
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for k, v in params.items():
        out[f"grad.{k}"] = v.grad.detach()
    meta = {k: str(v) for k, v in CONFIG.items()}
    meta.update(B=str(B), T=str(T), seed=str(SEED), torch=torch.__version__)
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "data" / "gpt_reference.safetensors"
    write_safetensors(path, out, meta)
    print(f"wrote {path} ({path.stat().st_size} bytes), loss {loss.item():.10f}")


if __name__ == "__main__":
    main()
