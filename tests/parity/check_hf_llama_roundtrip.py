#!/usr/bin/env python3
"""A Llama made by transformers goes through snug and back.

    check_hf_llama_roundtrip.py TRAIN_GPT WORK_DIR

transformers makes a random grouped-query LlamaForCausalLM (4 query heads
sharing 2 key/value heads) and saves it (save_pretrained: config.json and
model.safetensors). snug's training program reads it (--arch llama
--init-from), evaluates it on a token file, trains it three updates in fp32
and exports it (--export-hf). Then:
  - the validation loss snug measured before training (summary.json's
    first_val_loss) is transformers' loss of the model it made, and
  - snug's loss after training (final_val_loss) is transformers' loss of the
    model it reads back from snug's export,
each on the same windows of the same tokens, within TOLERANCE.

Exit status: 0 both match, 1 a mismatch or a failed run, 77 no PyTorch or no
transformers (ctest reports the test as skipped).
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print("check_hf_llama_roundtrip: PyTorch or transformers is not installed; skipped")
    sys.exit(77)

TOLERANCE = 1e-4  # |loss difference| in nats: snug and transformers both compute in fp32
B, T, BATCHES = 4, 16, 2  # snug's --batch, --seq and --eval-batches
VOCAB = 128


def write_tokens(path, tokens):
    """An llm.c token file: 256 int32 of header (magic, version, count), then uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    path.write_bytes(struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens))


def val_loss(model, val):
    """The mean cross-entropy over snug's validation windows: BATCHES consecutive
    windows of B*T + 1 tokens from the start, each read as (B, T) inputs and
    the next tokens as targets."""
    x = torch.tensor(val[: BATCHES * B * T]).view(BATCHES * B, T)
    y = torch.tensor(val[1 : BATCHES * B * T + 1]).view(BATCHES * B, T)
    with torch.no_grad():
        logits = model(x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1)).item()


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    exe, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
    made = LlamaForCausalLM(cfg).float().eval()
    # Weights larger than the default init (attention far from uniform, the
    # loss far from log V) and norms off 1, so that a misread shows.
    with torch.no_grad():
        for name, p in made.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    made.save_pretrained(work / "made", safe_serialization=True)

    g = torch.Generator().manual_seed(8)
    train = torch.randint(0, VOCAB, (4096,), generator=g).tolist()
    val = torch.randint(0, VOCAB, (BATCHES * B * T + 1,), generator=g).tolist()
    write_tokens(work / "train.bin", train)
    write_tokens(work / "val.bin", val)

    cmd = [exe, "--device", "host", "--arch", "llama", "--init-from", str(work / "made"),
           "--data", f"tokens:{work / 'train.bin'}", "--val", f"tokens:{work / 'val.bin'}",
           "--precision", "fp32", "--batch", str(B), "--seq", str(T), "--eval-batches", str(BATCHES),
           "--steps", "3", "--eval-every", "3", "--sample", "0",
           "--out", str(work / "run"), "--export-hf", str(work / "exported")]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print("FAIL: " + " ".join(cmd) + f"\nexit {run.returncode}\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        return 1
    summary = json.loads((work / "run" / "summary.json").read_text())

    ok = True
    for what, snug_loss, model in (
        ("the model transformers made, evaluated by snug", summary["first_val_loss"], made),
        ("snug's trained export, read by transformers", summary["final_val_loss"],
         LlamaForCausalLM.from_pretrained(work / "exported", torch_dtype=torch.float32).eval()),
    ):
        want = val_loss(model, val)
        diff = abs(snug_loss - want)
        good = diff <= TOLERANCE
        ok = ok and good
        print(f"  {what}: snug {snug_loss:.6f}, transformers {want:.6f}, |diff| {diff:.2e}  {'ok' if good else 'FAIL'}")
    trained = summary["final_val_loss"] != summary["first_val_loss"]
    if not trained:
        print("FAIL: three updates did not change the validation loss")
    print("check_hf_llama_roundtrip: " + ("a grouped-query Llama goes through snug and back" if ok and trained
                                           else "mismatch"))
    return 0 if ok and trained else 1


if __name__ == "__main__":
    sys.exit(main())
