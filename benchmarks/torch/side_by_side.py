#!/usr/bin/env python3
"""PyTorch side by side with snug's CUDA step benchmark (benchmarks/cuda/step_bench.cu).

The same GPT-2 (GPT-2 124M and 350M shapes, padded vocabulary 50304, tied
token embedding / output head, tanh GELU, LayerNorm eps 1e-5), the same
optimizer (AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D
weights only, gradient clipping at 1.0), the same rungs at T = 1024, B = 16:

    fp32                  fp32 weights and math (TF32 off, as snug's default)
    bf16                  torch.autocast bf16
    fp16+scaler           torch.autocast fp16 + GradScaler
    bf16+accumulate(4)    bf16, 4 micro-batches of B accumulated per update
    bf16+full-ckpt        bf16, torch.utils.checkpoint around every block
    bf16+budget 12GiB     GPT-2 350M, bf16, no checkpointing; reports whether
                          torch.cuda.max_memory_allocated stayed within 12 GiB
                          (--enforce-budget caps the allocator there instead)

each in eager mode and under torch.compile (--modes). Printed lines and CSV
columns are step_bench's, plus framework / mode (and nominal_peak_tflops, note):

    tokens/s  tokens per update / median update time (warm-up updates first;
              each update timed between torch.cuda.synchronize() calls)
    MFU       model FLOPs per token as GPTConfig::flops_per_token counts them
              (6 x matmul parameters + 12 L C T; no recomputation) x tokens/s,
              over the bf16 matmul peak measured here (8192^3 torch.matmul) and
              over --peak-tflops ('nominal', default 989 = H200 dense bf16)
    HFU       adds the forward of each checkpointed block that runs again
    tracker   torch.cuda.max_memory_allocated after reset_peak_memory_stats
              (what PyTorch's allocator handed out: snug's tracker peak)
    driver    device memory in use (cudaMemGetInfo) after each update, over
              what was in use before the rung (step_bench's driver figure)
    plan      per block: F = recomputed in backward (checkpointed), - = kept

On the CPU, memory columns say 'n/a (cpu)' and MFU 'unknown'. A rung that runs
out of memory, that torch.compile cannot compile, or that this torch cannot run
(fp16 autocast on the CPU, say) is a row that says so, not a crash.

Usage (Debian's python3-torch on a CPU machine: /usr/bin/python3):
    python3 benchmarks/torch/side_by_side.py --csv torch_step.csv --json torch_step.json
    python3 benchmarks/torch/side_by_side.py --device cpu --tiny --modes eager,compile
    python3 benchmarks/torch/side_by_side.py --check     # exit 1 on a failed check
"""
import argparse
import gc
import importlib
import json
import math
import platform
import statistics
import sys
import time
import warnings

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint
except ImportError:
    sys.exit("side_by_side.py: PyTorch is not installed for " + sys.executable +
             " (apt-get install python3-torch, then run it with /usr/bin/python3)")

GIB = float(1 << 30)
NOMINAL_BF16_TFLOPS = 989.0   # H200 SXM dense bf16, datasheet (step_bench's figure)
BUDGET_BYTES = 12 * (1 << 30)  # the small card snug is built for

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")
HAVE_COMPILE = hasattr(torch, "compile")


# ---------------------------------------------------------------------------
# Shapes, parameter count and FLOPs: snug's GPTConfig, computed here from the
# shapes alone (not from the module), so --check can compare the two.
# ---------------------------------------------------------------------------

def pad_vocab(vocab):
    """snug's GPTConfig::pad_vocab: next multiple of 128, or V itself when V <= 256."""
    return vocab if vocab <= 256 else (vocab + 127) // 128 * 128


class Shape:
    def __init__(self, name, layers, heads, channels, vocab=50257, max_seq=1024):
        self.name, self.L, self.NH, self.C = name, layers, heads, channels
        self.V, self.Vp, self.maxT = vocab, pad_vocab(vocab), max_seq

    def with_vocab(self, vocab):
        return Shape(self.name, self.L, self.NH, self.C, vocab, self.maxT)

    def with_context(self, max_seq):
        return Shape(self.name, self.L, self.NH, self.C, self.V, max_seq)

    def block_parameters(self):
        # two LayerNorms 4C, QKV 3C^2 + 3C, attention projection C^2 + C,
        # MLP up 4C^2 + 4C, MLP down 4C^2 + C
        return 12 * self.C * self.C + 13 * self.C

    def num_parameters(self):
        # every stored parameter, padded vocabulary rows included; wte counted once (tied)
        return self.Vp * self.C + self.maxT * self.C + self.L * self.block_parameters() + 2 * self.C

    def flops_per_token(self, T):
        # GPTConfig::flops_per_token: 6 x the parameters that do matmul work
        # (wte once, as the head, over the real vocabulary; not wpe, not the
        # padding) + 12 L C T for attention's Q K^T and A V.
        matmul_params = self.V * self.C + self.L * self.block_parameters() + 2 * self.C
        return 6.0 * matmul_params + 12.0 * self.L * self.C * T

    def recompute_flops_per_token(self, T, checkpointed_blocks):
        # step_bench's HFU term: the forward again of each fully checkpointed block
        return checkpointed_blocks * (2.0 * self.block_parameters() + 4.0 * self.C * T)


PRESETS = {  # snug's GPTConfig::preset (L, NH, C)
    "124M": (12, 12, 768), "350M": (24, 16, 1024),
    "d2": (2, 2, 128), "d4": (4, 4, 256),
}


def preset(name):
    L, NH, C = PRESETS[name]
    return Shape(name, L, NH, C)


# ---------------------------------------------------------------------------
# The model: plain PyTorch GPT-2 (no transformers).
# ---------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, s, device=None):
        super().__init__()
        C = s.C
        self.n_head = s.NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5, device=device)
        self.c_attn = nn.Linear(C, 3 * C, device=device)
        self.attn_proj = nn.Linear(C, C, device=device)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5, device=device)
        self.c_fc = nn.Linear(C, 4 * C, device=device)
        self.mlp_proj = nn.Linear(4 * C, C, device=device)

    def attention(self, x):  # x: (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
        if HAVE_SDPA:
            # On the GPU this is flash attention (memory-efficient attention in
            # fp32): fused, T x T scores never stored. snug has no flash
            # attention (it stores the scores); this is the fair PyTorch
            # baseline, what a PyTorch user gets by default.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # torch < 2.0: the plain causal attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x):  # (B, T, C) -> (B, T, C)
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, s, device=None, checkpoint=False):
        super().__init__()
        self.shape = s
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(s.Vp, s.C, device=device)  # also the output head (tied)
        self.wpe = nn.Embedding(s.maxT, s.C, device=device)
        self.h = nn.ModuleList(Block(s, device) for _ in range(s.L))
        self.ln_f = nn.LayerNorm(s.C, eps=1e-5, device=device)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        # snug's gpt_initial_weights: matmul weights and embeddings N(0, 0.02),
        # residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm
        # weights 1, padded vocabulary rows 0
        residual_std = 0.02 / math.sqrt(2 * self.shape.L)
        for name, p in self.named_parameters():
            if name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, residual_std)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif (".ln_" in name or name.startswith("ln_f")) and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)
        self.wte.weight[self.shape.V:].zero_()

    def forward(self, idx, targets):  # idx, targets: (B, T) -> scalar mean loss
        B, T = idx.shape
        s = self.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # (B, T, Vp): the GEMM over the padded vocabulary
        if s.Vp > s.V:
            # as snug's cross entropy: the padded columns take no part in the
            # softmax (and get no gradient)
            logits[:, :, s.V:] = float("-inf")
        return F.cross_entropy(logits.view(B * T, s.Vp), targets.reshape(B * T))


def make_optimizer(model, device):
    """AdamW with snug's defaults; weight decay on 2-D weights only. Returns (optimizer, note)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), ""
        except (TypeError, RuntimeError) as e:
            return torch.optim.AdamW(groups, **kwargs), "AdamW fused=True unavailable (%s)" % first_line(e)
    return torch.optim.AdamW(groups, **kwargs), ""


# ---------------------------------------------------------------------------
# Rungs and timing
# ---------------------------------------------------------------------------

class Rung:
    def __init__(self, name, model, dtype=None, scaler=False, micro=1, checkpoint=False, budget=False):
        self.name, self.model, self.dtype, self.scaler = name, model, dtype, scaler
        self.micro, self.checkpoint, self.budget = micro, checkpoint, budget


def ladder(small, medium):
    return [
        Rung("fp32", small),
        Rung("bf16", small, torch.bfloat16),
        Rung("fp16+scaler", small, torch.float16, scaler=True),
        Rung("bf16+accumulate(4)", small, torch.bfloat16, micro=4),
        Rung("bf16+full-ckpt", small, torch.bfloat16, checkpoint=True),
        Rung("bf16+budget 12GiB", medium, torch.bfloat16, budget=True),
    ]


def first_line(e):
    text = str(e).strip().splitlines()
    msg = type(e).__name__ + (": " + text[0] if text else "")
    return msg if len(msg) <= 240 else msg[:237] + "..."


def is_out_of_memory(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def driver_used(device):
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def autocast_works(device, dtype):
    """Whether torch.autocast really computes in dtype here (torch 1.x on the
    CPU silently disables fp16 autocast with a warning)."""
    a = torch.randn(8, 8, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device_type=device.type, dtype=dtype):
                return torch.mm(a, a).dtype == dtype
        except RuntimeError:
            return False


def make_scaler(device):
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None:  # torch >= 2.3: torch.amp.GradScaler(device)
        return amp_scaler(device.type)
    if device.type == "cuda":
        return torch.cuda.amp.GradScaler()
    raise RuntimeError("GradScaler for %s needs torch >= 2.3 (this is %s)" % (device.type, torch.__version__))


def measure_bf16_peak(device):
    """TFLOP/s of an 8192^3 bf16 matmul on random operands (step_bench measures the same through cuBLASLt)."""
    n = 8192
    g = torch.Generator(device=device).manual_seed(3)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    times = []
    for i in range(13):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        c = a @ b.t()
        stop.record()
        stop.synchronize()
        if i >= 3:  # three warm-up products
            times.append(start.elapsed_time(stop))
    del a, b, c
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (statistics.median(times) * 1e-3) * 1e-12


def run_rung(rung, mode, args, device, B, T, measured_peak):
    s = rung.model
    r = dict(framework="pytorch", mode=mode, rung=rung.name, model=s.name, B=B, T=T, micro_batches=rung.micro,
             median_ms=None, tokens_per_s=None, mfu_measured_peak=None, mfu_nominal_989=None,
             hfu_measured_peak=None, tracker_peak_gib=None, driver_peak_gib=None,
             plan=("F" if rung.checkpoint else "-") * s.L, status="ok", note="")
    notes = []
    cuda = device.type == "cuda"
    if mode == "compile" and HAVE_COMPILE:
        importlib.import_module("torch._dynamo").reset()  # every rung compiles its own model (no cache-limit carry-over)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        driver_before = driver_peak = driver_used(device)
        if rung.budget and args.enforce_budget:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, BUDGET_BYTES / total), device)
    state = {}
    try:
        if rung.dtype is not None and not autocast_works(device, rung.dtype):
            raise NotImplementedError("autocast %s is not supported on %s by torch %s"
                                      % (str(rung.dtype).replace("torch.", ""), device.type, torch.__version__))
        if mode == "compile" and not HAVE_COMPILE:
            raise RuntimeError("torch.compile is not available: it needs torch >= 2.0 (this is %s)"
                               % torch.__version__)
        torch.manual_seed(1)
        state["model"] = model = GPT(s, device=device, checkpoint=rung.checkpoint)
        state["opt"], opt_note = make_optimizer(model, device)
        if opt_note:
            notes.append(opt_note)
        state["scaler"] = scaler = make_scaler(device) if rung.scaler else None
        forward = torch.compile(model) if mode == "compile" else model
        # random token ids below V, targets the next token (step_bench: the same, seed 11)
        g = torch.Generator().manual_seed(11)
        n = rung.micro
        ids = torch.randint(0, s.V, (n * B * T + 1,), generator=g)
        tokens = ids[:-1].view(n, B, T).to(device)
        targets = ids[1:].view(n, B, T).to(device)
        params = list(model.parameters())

        def update():
            opt = state["opt"]
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for i in range(n):
                if rung.dtype is not None:
                    with torch.autocast(device_type=device.type, dtype=rung.dtype):
                        loss = forward(tokens[i], targets[i]) / n
                else:
                    loss = forward(tokens[i], targets[i]) / n
                (scaler.scale(loss) if scaler else loss).backward()
                loss_sum += loss.detach()
            if scaler:
                scaler.unscale_(opt)  # before clipping, as snug
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            return loss_sum

        times = []
        for i in range(args.warmup + args.steps):
            sync(device)
            t0 = time.perf_counter()
            loss = update()
            sync(device)
            t1 = time.perf_counter()
            if i >= args.warmup:
                times.append((t1 - t0) * 1e3)
            if cuda:
                driver_peak = max(driver_peak, driver_used(device))
        r["loss"] = float(loss)
        if not math.isfinite(r["loss"]):
            notes.append("loss not finite (%s)" % r["loss"])
        if scaler is not None and scaler.get_scale() < 65536.0:
            notes.append("some updates skipped (loss scale search)")
        ms = statistics.median(times)
        tokens_per_update = n * B * T
        flops = tokens_per_update * s.flops_per_token(T)
        recompute = tokens_per_update * s.recompute_flops_per_token(T, s.L if rung.checkpoint else 0)
        r["median_ms"] = ms
        r["tokens_per_s"] = tokens_per_update / (ms * 1e-3)
        if cuda:
            tflops = flops / (ms * 1e-3) * 1e-12
            r["mfu_measured_peak"] = tflops / measured_peak
            r["mfu_nominal_989"] = tflops / args.peak_tflops
            r["hfu_measured_peak"] = (flops + recompute) / (ms * 1e-3) * 1e-12 / measured_peak
    except Exception as e:  # a row that says what happened, never a crash
        if cuda and is_out_of_memory(e):
            r["status"] = "out-of-memory"
            notes.insert(0, "OUT OF MEMORY (a result, not a crash): " + first_line(e))
        elif isinstance(e, NotImplementedError):
            r["status"] = "unsupported"
            notes.insert(0, "UNSUPPORTED here: " + str(e))
        elif mode == "compile":
            r["status"] = "compile-failed"
            notes.insert(0, "COMPILE FAILED (a result, not a crash): " + first_line(e))
        else:
            r["status"] = "error"
            notes.insert(0, "ERROR: " + first_line(e))
    finally:
        state.clear()
        gc.collect()
    if cuda:
        sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        r["tracker_peak_gib"] = peak / GIB
        r["driver_peak_gib"] = (driver_peak - driver_before) / GIB
        if rung.budget and args.enforce_budget:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            notes.append("allocator capped at 12 GiB (set_per_process_memory_fraction)")
        if rung.budget and r["status"] == "ok":
            notes.append("plain bf16, no checkpointing: max_memory_allocated %.2f GiB %s 12 GiB: %s"
                         % (peak / GIB, "<=" if peak <= BUDGET_BYTES else ">",
                            "fits" if peak <= BUDGET_BYTES else "does NOT fit"))
        r["fits_12gib"] = r["status"] == "ok" and peak <= BUDGET_BYTES
        torch.cuda.empty_cache()
    r["note"] = "; ".join(notes)
    return r


# ---------------------------------------------------------------------------
# Output: step_bench's line and CSV columns
# ---------------------------------------------------------------------------

CSV_COLUMNS = ["framework", "mode", "rung", "model", "B", "T", "micro_batches", "median_ms", "tokens_per_s",
               "mfu_measured_peak", "mfu_nominal_989", "hfu_measured_peak", "tracker_peak_gib", "driver_peak_gib",
               "plan", "bf16_peak_tflops", "status", "nominal_peak_tflops", "note"]


def pct(x):
    return "unknown" if x is None else "%5.1f%%" % (100 * x)


def gib_text(x, device):
    if device.type != "cuda":
        return "n/a (cpu)"
    return "%6.2f GiB" % x


def print_row(r, device):
    ms = 0.0 if r["median_ms"] is None else r["median_ms"]
    tps = 0.0 if r["tokens_per_s"] is None else r["tokens_per_s"]
    print("[torch %-7s] %-22s %-5s B %2d x %d  %9.1f ms %10.0f tok/s  MFU %s (nominal %s)  HFU %s  "
          "tracker %s  driver %s  plan %s"
          % (r["mode"], r["rung"], r["model"], r["B"], r["micro_batches"], ms, tps, pct(r["mfu_measured_peak"]),
             pct(r["mfu_nominal_989"]), pct(r["hfu_measured_peak"]), gib_text(r["tracker_peak_gib"], device),
             gib_text(r["driver_peak_gib"], device), r["plan"] or "?"))
    if r["note"]:
        print("  " + r["note"])
    sys.stdout.flush()


def csv_value(r, key, device, measured_peak, args):
    if key == "bf16_peak_tflops":
        return "unknown" if measured_peak is None else "%g" % measured_peak
    if key == "nominal_peak_tflops":
        return "%g" % args.peak_tflops if device.type == "cuda" else "unknown"
    v = r[key]
    if key in ("tracker_peak_gib", "driver_peak_gib") and device.type != "cuda":
        return "n/a (cpu)"
    if key in ("mfu_measured_peak", "mfu_nominal_989", "hfu_measured_peak") and v is None:
        return "unknown" if device.type != "cuda" or r["status"] == "ok" else ""
    if v is None:
        return ""
    if isinstance(v, float):
        return "%g" % v
    text = str(v)
    if any(c in text for c in ',"\n') or key == "rung":
        text = '"' + text.replace('"', '""') + '"'  # step_bench quotes the rung name
    return text


def write_csv(path, rows, device, measured_peak, args):
    with open(path, "w") as f:
        f.write(",".join(CSV_COLUMNS) + "\n")
        for r in rows:
            f.write(",".join(csv_value(r, k, device, measured_peak, args) for k in CSV_COLUMNS) + "\n")
    print("wrote " + path)


# ---------------------------------------------------------------------------
# --check: the model against snug's formulas (tiny, CPU)
# ---------------------------------------------------------------------------

def run_checks():
    failures = []

    def check(ok, what):
        print("%s  %s" % ("PASS" if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    def module_parameters(model):
        seen = {}
        for p in model.parameters():  # parameters() yields a tied tensor once
            seen[id(p)] = p.numel()
        return sum(seen.values())

    # 1. snug's formula against llm.c's published count for GPT-2 124M (padded vocabulary)
    s124 = preset("124M")
    check(s124.num_parameters() == 124475904,
          "formula: GPT-2 124M (Vp 50304, T 1024) has 124,475,904 parameters (llm.c); got %d" % s124.num_parameters())

    # 2. the module's parameter count equals the formula (big shapes on the meta device: no memory)
    shapes = [("124M", s124, "meta"), ("350M", preset("350M"), "meta"),
              ("d2 V 256", preset("d2").with_vocab(256).with_context(64), "cpu"),
              ("d2 V 1000 -> Vp 1024", preset("d2").with_vocab(1000).with_context(64), "cpu")]
    for label, s, dev in shapes:
        model = GPT(s, device=torch.device(dev))
        got = module_parameters(model)
        check(got == s.num_parameters(),
              "parameters of %s (L %d, NH %d, C %d, V %d, Vp %d, maxT %d): module %d, formula %d"
              % (label, s.L, s.NH, s.C, s.V, s.Vp, s.maxT, got, s.num_parameters()))
        # the FLOP count's 6 N: every parameter but wpe and the padded rows
        matmul = got - model.wpe.weight.numel() - (s.Vp - s.V) * s.C
        check(abs(s.flops_per_token(0) - 6.0 * matmul) < 0.5,
              "%s: flops_per_token(T=0) = 6 x (module parameters - wpe - padding) = %.0f" % (label, 6.0 * matmul))

    # 3. loss at init ~ ln(V), the padded columns get no gradient, attention is causal
    for label, s in [("d2 V 256", shapes[2][1]), ("d2 V 1000 -> Vp 1024", shapes[3][1])]:
        torch.manual_seed(1)
        model = GPT(s)
        g = torch.Generator().manual_seed(11)
        ids = torch.randint(0, s.V, (4 * 64 + 1,), generator=g)
        loss = model(ids[:-1].view(4, 64), ids[1:].view(4, 64))
        check(abs(loss.item() - math.log(s.V)) < 0.1,
              "%s: loss at init %.4f within 0.1 of ln(V) = %.4f" % (label, loss.item(), math.log(s.V)))
        loss.backward()
        if s.Vp > s.V:
            pad_grad = model.wte.weight.grad[s.V:].abs().max().item()
            check(pad_grad == 0.0, "%s: padded rows of wte get no gradient (max |grad| %g)" % (label, pad_grad))
        # causality: changing the last token must not change the loss on earlier positions
        x = ids[:-1].view(4, 64).clone()
        with torch.no_grad():
            h1 = model.wte(x) + model.wpe(torch.arange(64))
            for b in model.h:
                h1 = b(h1)
            x[:, -1] = (x[:, -1] + 1) % s.V
            h2 = model.wte(x) + model.wpe(torch.arange(64))
            for b in model.h:
                h2 = b(h2)
        diff = (h1[:, :-1] - h2[:, :-1]).abs().max().item()
        check(diff == 0.0, "%s: attention is causal (earlier positions unchanged by the last token: %g)"
              % (label, diff))

    # 4. torch.utils.checkpoint per block gives the plain gradients
    s = shapes[3][1]
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(1)
        model = GPT(s, checkpoint=ckpt)
        g = torch.Generator().manual_seed(11)
        ids = torch.randint(0, s.V, (2 * 32 + 1,), generator=g)
        model(ids[:-1].view(2, 32), ids[1:].view(2, 32)).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    diff = (grads[0] - grads[1]).abs().max().item()
    check(diff < 1e-6, "checkpointed blocks give the plain gradients (max |diff| %g)" % diff)

    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    return 1 if failures else 0


# ---------------------------------------------------------------------------

def attention_bench(args, device):
    """Causal attention alone, as snug's kernel benchmark measures it: PyTorch's
    F.scaled_dot_product_attention forward and forward+backward at (B, NH, T,
    hs), in TFLOP/s with snug's convention (forward 4 B NH T^2 hs / 2, the
    backward 2.5x that), median of --steps timed calls after --warmup."""
    if not HAVE_SDPA:
        print("attention: F.scaled_dot_product_attention needs torch >= 2.0 (this is %s)" % torch.__version__)
        return 0
    B, NH, T, hs = (int(x) for x in args.attention.split(","))
    backends = ["default"]
    if args.sdpa_backends == "all" and device.type == "cuda":
        backends = ["default", "flash", "cudnn", "efficient"]
    elif args.sdpa_backends not in ("default", "all"):
        backends = args.sdpa_backends.split(",")
    fwd_flops = 4.0 * B * NH * T * T * hs / 2
    dtypes = [torch.bfloat16, torch.float16] if device.type == "cuda" else [torch.float32]
    for dtype in dtypes:
        q, k, v = (torch.randn(B, NH, T, hs, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, NH, T, hs, device=device, dtype=dtype)

        def timed(fn):
            times = []
            for i in range(args.warmup + args.steps):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                if i >= args.warmup:
                    times.append(time.perf_counter() - t0)
            return sorted(times)[len(times) // 2]

        for backend in backends:
            try:
                with sdpa_backend(backend):
                    with torch.no_grad():
                        t_fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    t_all = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout))
            except RuntimeError as e:  # a backend that does not take this case
                print("sdpa %s %s: not available (%s)" % (backend, str(dtype).replace("torch.", ""),
                                                          str(e).splitlines()[0][:120]))
                continue
            print("sdpa %s %s B %d NH %d T %d hs %d: forward %.3f ms %.1f TFLOP/s; forward+backward %.3f ms "
                  "%.1f TFLOP/s" % (backend, str(dtype).replace("torch.", ""), B, NH, T, hs, t_fwd * 1e3,
                                    fwd_flops / t_fwd * 1e-12, t_all * 1e3, 3.5 * fwd_flops / t_all * 1e-12))
    return 0


def sdpa_backend(name):
    """A context that makes F.scaled_dot_product_attention take one backend
    ("flash", "cudnn", "efficient", "math"), or PyTorch's own choice ("default")."""
    import contextlib
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--modes", default="eager,compile", help="comma list of eager, compile (default both)")
    p.add_argument("--rungs", default=None, help="comma list of rung names to run (default all)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny shapes for a CPU smoke run: d2 (2 layers, 128 channels) and d4 for the 350M rung, "
                        "vocabulary 256, T 64, B 4, 1 warm-up + 2 timed updates")
    p.add_argument("--shape", default=None, metavar="L,NH,C,V",
                   help="the small model's layers, heads, channels and vocabulary instead of its preset, e.g. "
                        "4,4,128,256: snug's host step goal (with -T 128 -B 16 --device cpu --rungs fp32)")
    p.add_argument("-B", type=int, default=None, help="micro-batch (default 16; tiny 4)")
    p.add_argument("-T", type=int, default=None, help="sequence length (default 1024; tiny 64)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up updates (default 2; tiny 1)")
    p.add_argument("--steps", type=int, default=None, help="timed updates, median reported (default 6; tiny 2)")
    p.add_argument("--peak-tflops", type=float, default=NOMINAL_BF16_TFLOPS,
                   help="nominal bf16 peak for the 'nominal' MFU (default 989, H200 dense bf16)")
    p.add_argument("--enforce-budget", action="store_true",
                   help="cap PyTorch's allocator at 12 GiB for the 350M rung (an OOM is then the result)")
    p.add_argument("--csv", default=None, help="write step_bench's CSV columns (+ framework, mode) here")
    p.add_argument("--json", default=None, help="write the rows and the environment as JSON here")
    p.add_argument("--sdpa-backends", default="default",
                   help="with --attention: default (PyTorch's choice), all (default, flash, cudnn, efficient on "
                        "the GPU), or a comma list of those")
    p.add_argument("--attention", default=None, metavar="B,NH,T,HS",
                   help="benchmark F.scaled_dot_product_attention alone at this shape (snug's kernel benchmark "
                        "uses 16,12,1024,64) and exit")
    p.add_argument("--check", action="store_true",
                   help="check the model against snug's parameter-count formula and ln(V) at init; exit 1 on failure")
    args = p.parse_args()

    if args.check:
        return run_checks()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("side_by_side.py: --device cuda but torch.cuda.is_available() is False")
    if args.attention:
        args.warmup = args.warmup if args.warmup is not None else 3
        args.steps = args.steps if args.steps is not None else 10
        return attention_bench(args, device)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("eager", "compile"):
            sys.exit("side_by_side.py: --modes takes eager and/or compile, got '%s'" % m)
    tiny = args.tiny
    B = args.B or (4 if tiny else 16)
    T = args.T or (64 if tiny else 1024)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 2)
    args.steps = args.steps if args.steps is not None else (2 if tiny else 6)
    if args.steps < 1:
        sys.exit("side_by_side.py: --steps must be at least 1")
    if tiny:
        small, medium = preset("d2").with_vocab(256), preset("d4").with_vocab(256)
    else:
        small, medium = preset("124M"), preset("350M")
    if args.shape:
        try:
            L, NH, C, V = (int(x) for x in args.shape.split(","))
        except ValueError:
            sys.exit("side_by_side.py: --shape takes L,NH,C,V (four integers), got '%s'" % args.shape)
        small = Shape("L%d-C%d" % (L, C), L, NH, C).with_vocab(V)
    small, medium = small.with_context(T), medium.with_context(T)
    rungs = ladder(small, medium)
    if args.rungs:
        wanted = [w.strip() for w in args.rungs.split(",")]
        unknown = [w for w in wanted if w not in [r.name for r in rungs]]
        if unknown:
            sys.exit("side_by_side.py: unknown rung(s) %s (valid: %s)" % (unknown, ", ".join(r.name for r in rungs)))
        rungs = [r for r in rungs if r.name in wanted]

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # snug's fp32 GEMMs are true fp32 by default
        torch.backends.cudnn.allow_tf32 = False
        name = torch.cuda.get_device_name(device)
        measured_peak = measure_bf16_peak(device)
        print("device: %s; bf16 GEMM peak measured %.1f TFLOP/s (8192^3 through torch.matmul), nominal %.0f"
              % (name, measured_peak, args.peak_tflops))
        print("MFU and HFU below are against the MEASURED bf16 peak; '(nominal)' against %.0f TFLOP/s"
              % args.peak_tflops)
    else:
        name = "cpu (%s, %d threads)" % (platform.processor() or platform.machine(), torch.get_num_threads())
        measured_peak = None
        print("device: %s; MFU unknown (no bf16 peak on the CPU); memory columns n/a" % name)
    print("framework: PyTorch %s, Python %s; attention: %s" % (
        torch.__version__, platform.python_version(),
        "F.scaled_dot_product_attention (flash attention on the GPU, as snug's default)" if HAVE_SDPA
        else "plain causal softmax(QK^T)V (no F.scaled_dot_product_attention before torch 2.0)"))
    print("models: %s = L %d NH %d C %d V %d (Vp %d), %d parameters; %s = L %d NH %d C %d, %d parameters; "
          "T %d, micro-batch %d; %d warm-up + %d timed updates"
          % (small.name, small.L, small.NH, small.C, small.V, small.Vp, small.num_parameters(), medium.name,
             medium.L, medium.NH, medium.C, medium.num_parameters(), T, B, args.warmup, args.steps))
    sys.stdout.flush()

    rows = []
    for mode in modes:
        for rung in rungs:
            r = run_rung(rung, mode, args, device, B, T, measured_peak)
            print_row(r, device)
            rows.append(r)

    if args.csv:
        write_csv(args.csv, rows, device, measured_peak, args)
    if args.json:
        doc = dict(framework="pytorch", torch_version=torch.__version__, python=platform.python_version(),
                   device=name, device_type=device.type, sdpa=HAVE_SDPA, bf16_peak_tflops_measured=measured_peak,
                   nominal_peak_tflops=args.peak_tflops if device.type == "cuda" else None,
                   B=B, T=T, warmup=args.warmup, steps=args.steps, rows=rows)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print("wrote " + args.json)
    # an eager rung that failed for another reason than memory or support is a bug
    return 1 if any(r["status"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
