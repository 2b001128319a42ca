// custom_layer: a model built from a user's own block, trained by snug's
// TrainStep under each of the three policies — the shape of program a
// downstream user copies. What to copy, and why each piece is there:
//
//   gated_residual.hpp   the block (its math, its kernels: host loop, CUDA
//                        kernel; the class that models snug::Layer and
//                        declares its tensors) and TinyFamily, which makes
//                        snug::CausalLM<TinyFamily, Act, D> a whole model:
//                        embeddings, the blocks in a LayerStack (so every
//                        checkpoint policy applies), a final norm, the tied
//                        head and the loss, a TrainableModel that TrainStep
//                        drives and snug::Meter measures (the Budget policy's
//                        activation peaks and the whole run's plan come from
//                        this code itself, not from a formula kept beside it);
//   main()               first holds the block's backward to finite
//                        differences in double (snug::check_gradients), then
//                        composes snug::TrainStep<TinyLM<Act>, Precision,
//                        Accumulation, Checkpoint> for fp32, bf16 and fp16 with
//                        a dynamic loss scaler, trains each on a synthetic
//                        next-token task (target = (7 token + 3) mod V) and
//                        prints the loss, the peak bytes per memory category
//                        (each checked against the planner's prediction) and
//                        the skipped steps.
//
// Built by g++ it runs on snug::Host; main.cu is this file built by nvcc, on
// snug::Cuda; built against snug::cuda_emulated (CMake target
// custom_layer_emulated) it runs snug::Cuda on the emulated GPU, so the
// layer's CUDA kernel is tested where no GPU exists. Exit code 0 when every
// loss fell, every checkpoint plan gave the plain gradients bit for bit, and
// every predicted peak (activations, and each category of the whole run) was
// exact, and the gradient check passed.
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gated_residual.hpp"
#include "snug/snug.hpp"
#include "snug/train/session.hpp"

namespace tiny {

#if defined(SNUG_CUDA_BACKEND)
using Dev = snug::Cuda;
#else
using Dev = snug::Host;
#endif

// The model: snug::CausalLM of the user's family (gated_residual.hpp).
//   Act: activation and working-weight type (float, snug::bfloat16, snug::half)
template <class Act>
using TinyLM = snug::CausalLM<TinyFamily, Act, Dev>;

// V 64 (no padding), T at most 16, 4 blocks of width 32.
constexpr snug::CausalLMConfig<TinyFamily> config{
    .vocab_size = 64, .padded_vocab_size = 64, .max_seq_len = 16, .n_layer = 4, .block = {32}, .classifier_chunk = 0};

// ---- the driver -------------------------------------------------------------

// The tracker every byte goes through, the two arenas, cuBLASLt on CUDA (for
// the head's GEMMs) and the context, wired by snug::Session;
// no memory budget here.
using Session = snug::Session<Dev>;

constexpr int B = 4, T = 16, updates = 40;
constexpr float lr = 1e-2f;

// Micro-batches of the synthetic task in device memory: random tokens, each
// token's target (7 token + 3) mod V.
class Batches {
public:
    Batches(snug::MemoryTracker& tracker, int micro, std::uint64_t seed)
        : n_(std::int64_t{micro} * B * T),
          tokens_(tracker, snug::MemoryCategory::workspace, std::size_t(n_), "token ids"),
          targets_(tracker, snug::MemoryCategory::workspace, std::size_t(n_), "target ids"),
          rng_(seed) {
        for (int m = 0; m < micro; ++m)
            list_.push_back({tokens_.data() + m * B * T, targets_.data() + m * B * T});
    }
    std::span<const snug::MicroBatch> next(const Dev& dev) {
        std::vector<std::int32_t> t(static_cast<std::size_t>(n_)), y(t.size());
        for (std::size_t i = 0; i < t.size(); ++i) {
            t[i] = static_cast<std::int32_t>(rng_.below(config.vocab_size));
            y[i] = (t[i] * 7 + 3) % config.vocab_size;
        }
        upload(dev, tokens_.data(), t.data(), n_);
        upload(dev, targets_.data(), y.data(), n_);
        return list_;
    }

private:
    std::int64_t n_;
    snug::Buffer<std::int32_t, Dev> tokens_, targets_;
    snug::Generator rng_;
    std::vector<snug::MicroBatch> list_;
};

std::string plan_string(std::span<const snug::Recompute> plan) {
    std::string s;
    for (snug::Recompute r : plan) s += std::string(s.empty() ? "" : " ") + snug::recompute_name(r);
    return "[" + s + "]";
}

// One configuration: `updates` optimizer steps; true when the loss fell and
// the activation peak was as predicted.
template <class Precision, class Checkpoint>
bool train(int accumulation, Checkpoint checkpoint = {}) {
    using Act = typename Precision::compute_type;
    using Model = TinyLM<Act>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;

    Session s(std::nullopt);
    Model model(config, s.tracker);
    const std::vector<float> w0 = model.initial_weights(1);
    model.load_weights(s.ctx.device, w0);
    Step step(model, s.tracker, s.ctx.device, w0, {}, Precision{}, snug::accumulate::Steps(accumulation), checkpoint);
    Batches data(s.tracker, accumulation, 2);

    std::vector<float> losses;
    snug::StepResult last{};
    for (int u = 0; u < updates; ++u) {
        last = step.step(s.ctx, data.next(s.ctx.device), B, T, lr);
        if (!last.skipped) losses.push_back(last.loss);
    }

    // Falling: the mean of the last five updates under 60% of the first's.
    bool fell = losses.size() >= 10;
    float first = 0.0f, final_loss = 0.0f;
    if (fell) {
        first = losses.front();
        for (std::size_t i = losses.size() - 5; i < losses.size(); ++i) final_loss += losses[i] / 5.0f;
        fell = final_loss < 0.6f * first;
    }
    const std::size_t predicted = snug::predict_activation_peak(model, B, T, step.recompute_plan());
    const std::size_t measured = s.tracker.peak(snug::MemoryCategory::activations);
    const std::vector<snug::Recompute> keep_all(std::size_t(config.n_layer), snug::Recompute::none);
    const std::size_t plain = snug::predict_activation_peak(model, B, T, keep_all);
    // The whole run, planned by running this model on snug::Meter: every
    // category's peak and the total, to the byte.
    snug::RunShape shape;
    shape.micro_batch = B;
    shape.seq = T;
    shape.accumulation = accumulation;
    shape.recompute.assign(step.recompute_plan().begin(), step.recompute_plan().end());
    shape.backend_workspace = s.backend_workspace();
    const snug::MemoryPlan plan = snug::predict_training_memory<Model, Precision>(config, shape);
    bool planned = plan.total == s.tracker.peak_total();
    for (snug::MemoryCategory cat : snug::all_memory_categories)
        planned = planned && plan[cat] == s.tracker.peak(cat);

    std::printf("%-5s accumulate %d  checkpoint %-9s plan %s\n", Precision::name, accumulation, Checkpoint::name,
                plan_string(step.recompute_plan()).c_str());
    std::printf("  loss %.4f -> %.4f over %d updates of %d tokens, %" PRId64 " skipped, loss scale %g  %s\n", first,
                final_loss, updates, accumulation * B * T, step.skipped_steps(), step.loss_scale(),
                fell ? "(falls)" : "(DID NOT FALL)");
    std::printf("  activations %s predicted %s%s, without checkpointing %s\n", snug::format_bytes(measured).c_str(),
                snug::format_bytes(predicted).c_str(), measured == predicted ? "" : " (MISMATCH)",
                snug::format_bytes(plain).c_str());
    std::printf("  peak:");
    for (snug::MemoryCategory cat : snug::all_memory_categories) {
        const std::string_view name = snug::category_name(cat);
        std::printf(" %.*s %s%s", static_cast<int>(name.size()), name.data(),
                    snug::format_bytes(s.tracker.peak(cat)).c_str(),
                    cat == snug::MemoryCategory::temporaries ? "\n" : ",");
    }
    std::printf("  total %s, planned %s%s\n", snug::format_bytes(s.tracker.peak_total()).c_str(),
                snug::format_bytes(plan.total).c_str(), planned ? " (every category exact)" : " (MISMATCH)");
    return fell && measured == predicted && planned;
}

// Checkpointing must not change the numbers: one pass under several plans
// (mixing every mode) gives the plain run's gradients bit for bit, and each
// plan's activation peak is the one predicted.
template <class Act>
bool plans_agree() {
    using R = snug::Recompute;
    const std::vector<std::vector<R>> plans = {
        {R::none, R::none, R::none, R::none},
        {R::full, R::full, R::full, R::full},
        {R::full, R::none, R::full, R::none},
        {R::selective, R::selective, R::selective, R::selective},
        {R::selective, R::full, R::none, R::selective},
    };
    Session s(std::nullopt);
    TinyLM<Act> model(config, s.tracker);
    model.load_weights(s.ctx.device, model.initial_weights(3));
    Batches data(s.tracker, 1, 4);
    const snug::MicroBatch mb = data.next(s.ctx.device)[0];
    const auto P = static_cast<std::size_t>(model.num_parameters());
    std::vector<float> plain, grads(P);
    bool ok = true;
    for (const auto& plan : plans) {
        model.set_recompute(plan);
        model.zero_grad(s.ctx.device);
        s.tracker.reset_peaks();
        model.forward(s.ctx, mb.tokens, mb.targets, B, T, 1.0f / (B * T));
        model.backward(s.ctx, mb.tokens);
        download(s.ctx.device, grads.data(), model.gradients(), std::int64_t(P));
        if (plain.empty()) plain = grads;
        const bool same = grads == plain;
        const bool exact =
            s.tracker.peak(snug::MemoryCategory::activations) == snug::predict_activation_peak(model, B, T, plan);
        if (!same || !exact)
            std::printf("  plan %s: %s\n", plan_string(plan).c_str(),
                        !same ? "gradients differ from the plain run" : "activation peak differs from the prediction");
        ok = ok && same && exact;
    }
    return ok;
}

}  // namespace tiny

int main() {
    using namespace snug;
    try {
#if defined(SNUG_CUDA_BACKEND)
        snug::cuda::require_device();
#endif
        std::printf("custom_layer on %s%s: TinyLM (V %d, C %d, %d GatedResidual blocks), B %d, T %d\n",
                    tiny::Dev::name, snug::cuda_emulated ? " (emulated)" : "", tiny::config.vocab_size,
                    tiny::config.block.channels, tiny::config.n_layer, tiny::B, tiny::T);
        // The block's backward against finite differences, in double on the
        // host, before anything trains. Its math is fp32 inside, so the
        // forward is exact to ~1e-7 and the differences to ~1e-4 of each
        // tensor's largest gradient; a wrong term in a backward is off by far
        // more (snug's own blocks, double throughout, check to ~1e-7).
        const GradientCheck g = check_gradients<tiny::TinyFamily>(tiny::GatedShape{8});
        bool ok = g.passes(1e-3);
        std::printf("gradient check (double, host): worst %s, relative error %.2g%s\n", g.worst().name.c_str(),
                    g.worst().error, ok ? "" : " (FAILED)");
        if (!ok) std::fputs(g.summary().c_str(), stdout);
        const bool agree = tiny::plans_agree<float>() && tiny::plans_agree<snug::bfloat16>() &&
                           tiny::plans_agree<snug::half>();
        std::printf("checkpoint plans none/full/every-nth/selective/mixed: %s\n\n",
                    agree ? "same gradients, bit for bit, and the predicted activation peaks"
                          : "MISMATCH");
        ok = ok && agree;
        // Each policy varied at least once: the fp32 baseline first, as the
        // recommended order of operations says.
        ok = tiny::train<precision::Fp32, checkpoint::None>(1) && ok;
        ok = tiny::train<precision::Bf16, checkpoint::EveryNth<2>>(2) && ok;
        ok = tiny::train<precision::Fp16<DynamicLossScaler>, checkpoint::EveryNth<2>>(1) && ok;
        ok = tiny::train<precision::Fp16<DynamicLossScaler>, checkpoint::Full>(2) && ok;
        // The budget policy: the plan that recomputes least among those whose
        // predicted activation peak fits 80 KiB (the plain run needs 80.25 KiB).
        ok = tiny::train<precision::Fp32, checkpoint::Budget>(1, checkpoint::Budget(80 * 1024)) && ok;
        std::printf("\n%s\n", ok ? "ok" : "FAILED");
        return ok ? 0 : 1;
    } catch (const snug::NoCudaDevice& e) {
        std::fprintf(stderr, "custom_layer: %s\n", e.what());
        return 77;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "custom_layer: %s\n", e.what());
        return 1;
    }
}
