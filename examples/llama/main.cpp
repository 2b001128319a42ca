// llama: a Llama-style decoder — RMSNorm, attention with rotary embeddings,
// a SwiGLU MLP, no learned positions, an untied head — built from snug's
// modules and trained by snug's TrainStep on the built-in corpus. What to
// copy, and why each piece is there:
//
//   snug::Llama<Act, D>  (include/snug/nn/llama.hpp) a CausalLM of
//                        LlamaBlocks: the CausalLM shell gives the embedding,
//                        the LayerStack every checkpoint policy works on, the
//                        final norm, the head and the loss; LlamaBlock
//                        (nn/llama_block.hpp, ~100 lines) composes RMSNorm,
//                        CausalSelfAttention<RoPE> and SwiGLUMLP. To change
//                        the block, copy it and name your own Family (see
//                        nn/causal_lm.hpp): the rest stays as it is.
//   presets              Llama-style shapes of 60M, 350M and 1B parameters
//                        (GaLore's; vocabulary 32000) and a tiny one for the
//                        built-in corpus.
//   --plan               the memory each precision and checkpoint policy
//                        needs at the preset's shape, measured by running the
//                        model on snug::Meter (no memory, no work): the same
//                        code the training runs, so the numbers are exact;
//                        and the largest micro-batch that fits a 12 GiB card.
//   (no flag)            trains `tiny` under fp32, bf16 with every second
//                        block checkpointed and two micro-batches, fp16 with
//                        a dynamic loss scaler fully checkpointed, and the
//                        Budget policy; exits 0 when every loss fell and every
//                        predicted activation peak was exact.
//
// Usage: llama [--plan] [--model tiny|60M|350M|1B] [--batch B] [--seq T]
// Built by g++ it runs on snug::Host; main.cu is this file built by nvcc
// (snug::Cuda); llama_emulated runs snug::Cuda on the emulated GPU.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "snug/data/loader.hpp"
#include "snug/data/synthetic_corpus.hpp"
#include "snug/nn/llama.hpp"
#include "snug/snug.hpp"
#include "snug/train/session.hpp"

namespace {

#if defined(SNUG_CUDA_BACKEND)
using Dev = snug::Cuda;
#else
using Dev = snug::Host;
#endif

struct Preset {
    const char* name;
    int layers, channels, heads, hidden, vocab, seq, batch;
};
// GaLore's Llama shapes (hidden widths rounded to a multiple of 64 so every
// GEMM operand stays 16-byte aligned in 16-bit types); tiny reads the
// built-in corpus as bytes (vocabulary 256).
constexpr Preset presets[] = {
    {"tiny", 4, 64, 4, 192, 256, 64, 8},
    {"60M", 8, 512, 8, 1408, 32000, 1024, 8},
    {"350M", 24, 1024, 16, 2752, 32000, 1024, 4},
    {"1B", 24, 2048, 32, 5504, 32000, 1024, 2},
};

snug::LlamaConfig config_of(const Preset& p) {
    return snug::make_llama_config(p.vocab, p.seq, p.layers, p.channels, p.heads, p.hidden);
}

// A 12 GiB card, as --plan counts it: what the CUDA context and page
// granularity add, and cuBLASLt's workspace (snug::Card).
using namespace snug::literals;
constexpr snug::Card card_12gib = snug::card(12_GiB);

// --plan: each precision, without and with full checkpointing.
template <class Precision>
void plan_row(const snug::LlamaConfig& c, int B, int T, snug::Recompute mode) {
    using Model = snug::Llama<typename Precision::compute_type, Dev>;
    snug::RunShape shape;
    shape.micro_batch = B;
    shape.seq = T;
    shape.recompute.assign(static_cast<std::size_t>(c.n_layer), mode);
    const snug::MemoryPlan plan = snug::predict_training_memory<Model, Precision>(c, shape);
    using Cat = snug::MemoryCategory;
    const int largest = snug::largest_micro_batch<Model, Precision>(c, shape, card_12gib);
    std::printf("  %-5s %-5s  weights+master+grads %10s  optimizer %10s  activations %10s  total %10s  "
                "largest micro-batch in 12 GiB %d\n",
                Precision::name, snug::recompute_name(mode),
                snug::format_bytes(plan[Cat::parameters] + plan[Cat::master_weights] + plan[Cat::gradients]).c_str(),
                snug::format_bytes(plan[Cat::optimizer_state]).c_str(),
                snug::format_bytes(plan[Cat::activations]).c_str(),
                snug::format_bytes(plan.total).c_str(), largest);
}

// One training run of `updates` steps; true when the loss fell and the
// activation peak was the one predicted.
template <class Precision, class Checkpoint>
bool train(const snug::LlamaConfig& c, int B, int T, int accumulation, Checkpoint checkpoint = {}) {
    using Model = snug::Llama<typename Precision::compute_type, Dev>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;
    constexpr int updates = 30;
    snug::Session<Dev> s(std::nullopt);
    Model model(c, s.tracker);
    const std::vector<float> w0 = model.initial_weights(1);
    model.load_weights(s.ctx.device, w0);
    Step step(model, s.tracker, s.ctx.device, w0, {}, Precision{}, snug::accumulate::Steps(accumulation), checkpoint);

    const snug::data::SyntheticCorpus corpus(snug::data::SyntheticCorpusConfig{});
    if (corpus.vocab_size() != c.vocab_size)
        throw snug::ConfigError("llama: the built-in corpus has " + std::to_string(corpus.vocab_size()) +
                                " characters, the model's vocabulary " + std::to_string(c.vocab_size));
    snug::data::BatchLoader loader(corpus.generate(std::int64_t{updates} * accumulation * B * T + 1, 0), B, T,
                                   "built-in corpus");
    const auto n = static_cast<std::size_t>(accumulation) * B * T;
    snug::Buffer<std::int32_t, Dev> tokens(s.tracker, snug::MemoryCategory::workspace, n, "token ids");
    snug::Buffer<std::int32_t, Dev> targets(s.tracker, snug::MemoryCategory::workspace, n, "target ids");
    std::vector<snug::MicroBatch> batches;
    for (int m = 0; m < accumulation; ++m) batches.push_back({tokens.data() + m * B * T, targets.data() + m * B * T});
    std::vector<std::int32_t> x(n), y(n);

    float first = 0.0f, last = 0.0f;
    for (int u = 0; u < updates; ++u) {
        for (int m = 0; m < accumulation; ++m) loader.next(x.data() + m * B * T, y.data() + m * B * T);
        upload(s.ctx.device, tokens.data(), x.data(), static_cast<std::int64_t>(n));
        upload(s.ctx.device, targets.data(), y.data(), static_cast<std::int64_t>(n));
        const snug::StepResult r = step.step(s.ctx, batches, B, T, 3e-3f);
        (u == 0 ? first : last) = r.loss;
    }
    const std::size_t measured = s.tracker.peak(snug::MemoryCategory::activations);
    const std::size_t predicted = snug::predict_activation_peak(model, B, T, step.recompute_plan());
    const bool fell = last < 0.8f * first;
    std::printf("%-5s checkpoint %-9s accumulate %d: loss %.3f -> %.3f %s, activations %s (predicted %s), "
                "%" PRId64 " skipped\n",
                Precision::name, Checkpoint::name, accumulation, first, last, fell ? "" : "(DID NOT FALL)",
                snug::format_bytes(measured).c_str(), snug::format_bytes(predicted).c_str(), step.skipped_steps());
    return fell && measured == predicted;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace snug;
    try {
        bool plan = false;
        std::string model = "tiny";
        int B = 0, T = 0;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            const bool has_value = i + 1 < argc;
            if (a == "--plan") plan = true;
            else if (a == "--model" && has_value) model = argv[++i];
            else if (a == "--batch" && has_value) B = std::atoi(argv[++i]);
            else if (a == "--seq" && has_value) T = std::atoi(argv[++i]);
            else throw ConfigError("llama: unknown argument '" + a + "' (usage: llama [--plan] [--model tiny|60M|350M|1B] [--batch B] [--seq T])");
        }
        const Preset* p = nullptr;
        for (const Preset& q : presets) if (model == q.name) p = &q;
        if (p == nullptr) throw ConfigError("llama: no preset '" + model + "' (tiny, 60M, 350M, 1B)");
        const LlamaConfig c = config_of(*p);
        B = B > 0 ? B : p->batch;
        T = T > 0 ? T : p->seq;
#if defined(SNUG_CUDA_BACKEND)
        if (!plan) snug::cuda::require_device();
#endif
        {
            MemoryTracker t;
            const Llama<float, Meter> m(c, t);
            std::printf("llama %s on %s%s: %" PRId64 " parameters (L %d, C %d, heads %d, MLP %d, V %d), B %d, T %d\n",
                        p->name, Dev::name, snug::cuda_emulated ? " (emulated)" : "", m.num_parameters(), c.n_layer,
                        c.block.channels, c.block.heads, c.block.hidden, c.vocab_size, B, T);
        }
        if (plan) {
            for (const Recompute mode : {Recompute::none, Recompute::full}) {
                plan_row<precision::Fp32>(c, B, T, mode);
                plan_row<precision::Bf16>(c, B, T, mode);
                plan_row<precision::Fp16<DynamicLossScaler>>(c, B, T, mode);
            }
            // The fastest bf16 configuration for 64 sequences per update on the card.
            snug::RunShape at_T;
            at_T.seq = T;
            const snug::BudgetPlan fastest =
                snug::plan_for_budget<Llama<snug::bfloat16, Dev>, precision::Bf16>(c, at_T, 64, card_12gib);
            if (fastest.fits)
                std::printf("  fastest bf16 plan for 64 sequences per update in 12 GiB: micro-batch %d x %d, "
                            "checkpoint %s, %s\n",
                            fastest.micro_batch, fastest.accumulation, fastest.checkpoint.c_str(),
                            snug::format_bytes(fastest.memory.required).c_str());
            else
                std::printf("  no bf16 plan fits 12 GiB (micro-batch 1, full checkpointing: %s)\n",
                            snug::format_bytes(fastest.tried.back().bytes).c_str());
            return 0;
        }
        if (model != "tiny") throw ConfigError("llama: only `tiny` trains here; the others are for --plan");
        bool ok = train<precision::Fp32, checkpoint::None>(c, B, T, 1);
        ok = train<precision::Bf16, checkpoint::EveryNth<2>>(c, B, T, 2) && ok;
        ok = train<precision::Fp16<DynamicLossScaler>, checkpoint::Full>(c, B, T, 1) && ok;
        // The plan that recomputes least among those whose activations fit in
        // 60% of the plain run's.
        const std::vector<Recompute> none(static_cast<std::size_t>(c.n_layer), Recompute::none);
        const std::size_t plain = metered_activation_peak<Llama<float, Meter>>(c, B, T, none);
        ok = train<precision::Fp32, checkpoint::Budget>(c, B, T, 1, checkpoint::Budget(plain * 6 / 10)) && ok;
        std::printf("%s\n", ok ? "ok" : "FAILED");
        return ok ? 0 : 1;
    } catch (const snug::NoCudaDevice& e) {
        std::fprintf(stderr, "llama: %s\n", e.what());
        return 77;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "llama: %s\n", e.what());
        return 1;
    }
}
