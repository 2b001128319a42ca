// ModelSummary: what reports and the run's FLOP counts need of a model,
// whatever its family — its sizes, parameter counts and model FLOPs per token.
// Each model's config gives one: model_summary(const GPTConfig&)
// (nn/gpt_config.hpp), model_summary(const CausalLMConfig<Family>&)
// (nn/causal_lm.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "snug/checkpoint/recompute.hpp"
#include "snug/nn/attention_kind.hpp"

namespace snug {

struct ModelSummary {
    std::string family;  // "gpt2", "llama", a user's family's name; empty when the family gives none
    int layers = 0;      // L
    int heads = 0;       // NH (0: the family's blocks do not say)
    int kv_heads = 0;    // key/value heads, NH unless the blocks group queries (GQA)
    int channels = 0;    // C
    int context = 0;     // maxT
    int vocab = 0;       // V
    AttentionKind attention = AttentionKind::flash;
    std::int64_t parameters = 0;        // stored, padded vocabulary rows included (what memory holds)
    std::int64_t block_parameters = 0;  // one block's
    double matmul_parameters = 0.0;     // those a token's forward multiplies by (no padding, no position table)

    // Model FLOPs per trained token at sequence length T (forward + backward),
    // the PaLM convention llm.c also uses: 6 N for the matmuls of N parameters
    // plus 12·L·C·T for attention's QKᵀ and AV (where the blocks have heads).
    // Recomputation is not model FLOPs (it counts toward hardware FLOPs).
    double flops_per_token(int T) const {
        return 6.0 * matmul_parameters + 3.0 * layers * attention_flops(T);
    }

    // FLOPs that recomputation adds per trained token at T under a recompute
    // plan (one mode per block): a block's forward for full, attention's for
    // selective.
    double recompute_flops_per_token(int T, std::span<const Recompute> modes) const {
        const double block_forward = 2.0 * static_cast<double>(block_parameters) + attention_flops(T);
        double total = 0.0;
        for (Recompute m : modes) {
            if (m == Recompute::full) total += block_forward;
            if (m == Recompute::selective) total += attention_flops(T);
        }
        return total;
    }

    // One block's attention forward per token at T: QKᵀ and AV, 4·C·T
    // (0 for blocks without heads).
    double attention_flops(int T) const {
        return heads > 0 ? 4.0 * static_cast<double>(channels) * static_cast<double>(T) : 0.0;
    }
};

}  // namespace snug
