// CheckpointPolicy: which blocks of a model keep their activations for
// backward and which recompute them. A policy is a small class whose plan()
// returns one Recompute mode per block; TrainStep applies it to the model.
//   None          keep everything (fastest, most memory)
//   Full          every block keeps only its input, recomputes all in backward
//   EveryNth<K>   blocks 0, K, 2K, ... fully checkpointed, the rest kept
//   Selective     every block keeps its GEMM outputs, recomputes LayerNorm,
//                 GELU and the attention probabilities (the T² part)
//   Budget        the cheapest plan whose predicted activation peak fits a byte budget
//   Given         the modes it was given (a plan chosen elsewhere)
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"
#include "snug/checkpoint/recompute.hpp"

namespace snug {

// What a policy may ask about the model it plans for.
struct CheckpointQuery {
    int blocks;
    // Predicted peak activation bytes of one forward + backward under a plan.
    std::function<std::size_t(std::span<const Recompute>)> activation_peak;
    // Whether the model's blocks can recompute selectively (SelectiveLayer).
    bool selective_available = true;
};

template <class P>
concept CheckpointPolicy = requires(const P& policy, const CheckpointQuery& q) {
    { policy.plan(q) } -> std::same_as<std::vector<Recompute>>;
};

namespace checkpoint {

struct None {
    static constexpr const char* name = "none";
    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        return std::vector<Recompute>(static_cast<std::size_t>(q.blocks), Recompute::none);
    }
};

struct Full {
    static constexpr const char* name = "full";
    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        return std::vector<Recompute>(static_cast<std::size_t>(q.blocks), Recompute::full);
    }
};

//   K: every K-th block, starting with the first, is fully checkpointed
template <int K>
struct EveryNth {
    static_assert(K >= 1, "snug::checkpoint::EveryNth<K>: K must be at least 1 (EveryNth<1> is Full)");
    static constexpr const char* name = "every-nth";
    static constexpr int k = K;
    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        std::vector<Recompute> modes(static_cast<std::size_t>(q.blocks), Recompute::none);
        for (std::size_t i = 0; i < modes.size(); i += K) modes[i] = Recompute::full;
        return modes;
    }
};

struct Selective {
    static constexpr const char* name = "selective";
    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        return std::vector<Recompute>(static_cast<std::size_t>(q.blocks), Recompute::selective);
    }
};

// The modes it was given, one per block: a plan chosen elsewhere (by the
// planner's search, or read from a saved run), applied as it is.
struct Given {
    static constexpr const char* name = "given";
    std::vector<Recompute> modes;
    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        if (modes.size() != static_cast<std::size_t>(q.blocks))
            throw ConfigError("checkpoint::Given: " + std::to_string(modes.size()) + " recompute modes for a model of " +
                              std::to_string(q.blocks) + " blocks");
        for (Recompute r : modes)
            if (r == Recompute::selective && !q.selective_available)
                throw ConfigError("checkpoint::Given: a selective mode for a model whose blocks cannot recompute "
                                  "selectively");
        return modes;
    }
};

// Chooses, for a byte budget on activations, the plan that recomputes least:
// it tries, in order of growing recompute cost, the first k blocks selective
// (k = 0 .. L), then every block selective with the first k fully
// checkpointed (earlier blocks' activations live longest), and takes the
// first plan whose predicted peak fits. For blocks that cannot recompute
// selectively, only the full-checkpointing plans are tried. None fits: OutOfMemory, naming the
// budget and the smallest peak any plan reaches.
class Budget {
public:
    static constexpr const char* name = "budget";
    explicit Budget(std::size_t activation_bytes = 0) : bytes_(activation_bytes) {}
    std::size_t bytes() const { return bytes_; }

    std::vector<Recompute> plan(const CheckpointQuery& q) const {
        const auto n = static_cast<std::size_t>(q.blocks);
        std::vector<Recompute> modes(n, Recompute::none);
        std::size_t smallest = q.activation_peak(modes);
        if (smallest <= bytes_) return modes;
        for (Recompute level : {Recompute::selective, Recompute::full}) {
            if (level == Recompute::selective && !q.selective_available) continue;
            for (std::size_t k = 0; k < n; ++k) {
                modes[k] = level;
                const std::size_t peak = q.activation_peak(modes);
                smallest = std::min(smallest, peak);
                if (peak <= bytes_) return modes;
            }
        }
        throw OutOfMemory("checkpoint::Budget: no recompute plan fits the activation budget of " +
                          format_bytes(bytes_) + "; the smallest predicted peak of any plan is " + format_bytes(smallest) +
                          ": use a smaller micro-batch or a shorter context");
    }

private:
    std::size_t bytes_;
};

}  // namespace checkpoint
}  // namespace snug
