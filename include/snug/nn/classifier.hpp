// The output head and its loss, a chunk of tokens at a time, for GPT and
// CausalLM: the logits (B·T·Vp values, by far the largest tensor of a small
// model's step) never exist whole. For each chunk of rows: the logits GEMM,
// the fused softmax + loss (+ dlogits in place), and when training the head's
// backward right there — d(hidden) for the chunk and dW added into the fp32
// gradient — so training keeps (N, C) of d(hidden) instead of (N, Vp) logits.
// Evaluation computes only the losses; sampling only the last position's
// logits (last_position_logits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/nn/context.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// The fewest rows an automatic chunk has: shorter chunks make the head's
// GEMMs too thin to run well (on the host, 4-row chunks ran the step at 0.4x
// the speed of unchunked, 64-row ones at 0.96x).
inline constexpr std::int64_t classifier_min_chunk_rows = 128;

// Rows of logits per chunk for N rows of C channels over Vp classes. asked
// > 0: that many (at most N). asked == 0, automatic: the smallest power of
// two of rows whose chunk holds at least as many logits as the N·C hidden
// values (so a chunk's logits are one to two times the hidden states: memory
// that grows with the batch like every activation, not by the factor Vp / C),
// but at least classifier_min_chunk_rows, and at most N. GPT-2 124M at
// B 16, T 1024: 256 rows. Throws ConfigError for asked < 0.
inline std::int64_t classifier_chunk_rows(std::int64_t N, int C, int Vp, std::int64_t asked) {
    if (asked < 0)
        throw ConfigError("classifier chunk: " + std::to_string(asked) + " rows (0 is automatic, else positive)");
    if (N <= 0) return 0;
    if (asked > 0) return std::min(asked, N);
    const std::int64_t widening = (std::int64_t{Vp} + C - 1) / std::max(C, 1);  // logit row / hidden row
    const std::int64_t want = (N + widening - 1) / std::max<std::int64_t>(widening, 1);
    std::int64_t rows = classifier_min_chunk_rows;
    while (rows < want) rows *= 2;
    return std::min(rows, N);
}

// The mean cross-entropy of N tokens whose final hidden states are normed
// (N, C), through the head weight (Vp, C) (logits = normed · weightᵀ) against
// targets (N) in [0, V). Training (dloss != 0, the derivative of the objective
// by each token's loss): dnormed (N, C) is overwritten with the gradient of the
// hidden states and dweight (Vp, C) accumulates the head's, as backward of the
// unchunked head would (within rounding: the sum over rows is split at chunk
// boundaries). Evaluation (dloss == 0): dnormed and dweight are not touched
// (may be null). One chunk of logits (chunk_rows of them, 0 automatic) and the
// per-token losses live in ctx.scratch meanwhile. On the host a target outside
// [0, V) throws naming the id and row before anything is written; on CUDA it
// makes the loss NaN (targets are device memory).
// The loss: with loss_sum (one double in device memory) the N token losses
// are added to it on the device and NaN is returned, nothing read back (so a
// training step reads its loss once per update, not once per micro-batch);
// without, the mean is downloaded and returned.
template <class Act, DeviceTag D>
float classifier_loss(Context<D>& ctx, Act* dnormed,      // (N, C) or null when evaluating
                      float* dweight,                      // (Vp, C) accumulated; null when evaluating
                      const Act* normed,                   // (N, C)
                      const Act* weight,                   // (Vp, C)
                      const std::int32_t* targets,         // (N)
                      std::int64_t N, int C, int V, int Vp, float dloss, std::int64_t chunk_rows,
                      double* loss_sum = nullptr) {        // (1) accumulated, or null

    constexpr const char* op = "classifier_loss";
    const bool training = dloss != 0.0f;
    if (targets == nullptr || (training && (dnormed == nullptr || dweight == nullptr)))
        throw Error(std::string(op) + ": " + (targets == nullptr ? "targets" : "the gradients") + " are null");
    ops::check_cross_entropy(op, N, V, Vp);
    if constexpr (std::is_same_v<D, Host>) host::check_targets(op, targets, N, V);
    if (N == 0) return loss_sum != nullptr ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    const std::int64_t rows = classifier_chunk_rows(N, C, Vp, chunk_rows);
    const D& dev = ctx.device;
    auto& tmp = ctx.scratch;
    float* losses = tmp.template push<float>(N, "per-token losses");
    Act* logits = tmp.template push<Act>(rows * Vp, "logits (one chunk)");
    for (std::int64_t r0 = 0; r0 < N; r0 += rows) {
        const std::int64_t n = std::min(rows, N - r0);
        const Act* x = normed + r0 * C;
        linear_forward(dev, logits, x, weight, static_cast<const Act*>(nullptr), n, C, Vp);
        softmax_cross_entropy(dev, losses + r0, logits, targets + r0, n, V, Vp, dloss);
        if (training)
            linear_backward(dev, dnormed + r0 * C, dweight, static_cast<float*>(nullptr), logits, x, weight, n, C, Vp);
    }
    tmp.pop(logits);
    if (loss_sum != nullptr) {
        accumulate_sum(dev, loss_sum, losses, N);
        tmp.pop(losses);
        return std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<float> host_losses(static_cast<std::size_t>(N));
    download(dev, host_losses.data(), losses, N);
    tmp.pop(losses);
    double sum = 0.0;
    for (const float l : host_losses) sum += l;
    return static_cast<float>(sum / static_cast<double>(N));
}

// logits (B, Vp) of each sequence's last position, from the hidden states
// normed (B, T, C) and the head weight (Vp, C): what sampling the next token
// needs, B rows instead of B·T.
template <class Act, DeviceTag D>
void last_position_logits(const D& dev, Act* logits,  // (B, Vp)
                          const Act* normed,          // (B, T, C)
                          const Act* weight,          // (Vp, C)
                          int B, int T, int C, int Vp) {
    for (int b = 0; b < B; ++b)
        linear_forward(dev, logits + std::int64_t{b} * Vp, normed + (std::int64_t{b} * T + T - 1) * C, weight,
                       static_cast<const Act*>(nullptr), 1, C, Vp);
}

}  // namespace snug
