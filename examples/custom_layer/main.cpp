// custom_layer: a model built from a user's own layer, trained by snug's
// TrainStep under each of the three policies — the shape of program a
// downstream user copies. What to copy, and why each piece is there:
//
//   gated_residual.hpp   the layer: its math, its kernels (host loop, CUDA
//                        kernel), and the class that models snug::Layer.
//   TinyLM<Act, D>       (below) a model that models snug::TrainableModel, so
//                        that TrainStep can drive it:
//                          - parameters (Act) and their fp32 gradients in one
//                            contiguous Buffer each: the optimizer, the loss
//                            scaler's unscale and the gradient norm each run
//                            over one array, and parameter_groups() tells
//                            AdamW which ranges are decayed;
//                          - snug's own kernels where they exist (token
//                            embedding, LayerNorm, the tied output head,
//                            cross-entropy), called with ctx.device first;
//                          - the user's layers in a snug::LayerStack, which
//                            applies the CheckpointPolicy's plan
//                            (set_recompute) and keeps each layer's input;
//                          - on_device<E> and config(): the same model on
//                            another device tag, built from its config, so
//                            that snug runs it on snug::Meter (no memory, no
//                            work) to measure its memory: the Budget policy's
//                            activation peaks and the whole run's plan
//                            (snug::predict_training_memory) come from this
//                            code itself, not from a formula kept beside it;
//   main()               composes snug::TrainStep<TinyLM<Act, D>, Precision,
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
// exact.
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

struct TinyConfig {
    int vocab = 64;    // V
    int max_seq = 16;  // maxT
    int channels = 32; // C
    int layers = 4;    // L
};

// Where each tensor starts in the one parameter buffer (elements):
//   wte (V, C) | wpe (maxT, C) | per layer: g (C), w (C) | lnf weight (C), bias (C)
struct TinyLayout {
    std::int64_t wte, wpe, gates, lnfw, lnfb, total;
    explicit TinyLayout(const TinyConfig& c)
        : wte(0),
          wpe(wte + std::int64_t{c.vocab} * c.channels),
          gates(wpe + std::int64_t{c.max_seq} * c.channels),
          lnfw(gates + 2 * std::int64_t{c.layers} * c.channels),
          lnfb(lnfw + c.channels),
          total(lnfb + c.channels) {}
    std::int64_t gate_g(const TinyConfig& c, int l) const { return gates + 2 * std::int64_t{l} * c.channels; }
    std::int64_t gate_w(const TinyConfig& c, int l) const { return gate_g(c, l) + c.channels; }
};

//   Act: activation and working-weight type (float, snug::bfloat16, snug::half)
//   D:   device tag (snug::Host, snug::Cuda)
template <class Act, snug::DeviceTag D>
class TinyLM {
public:
    using value_type = Act;
    using device_type = D;

    TinyLM(const TinyConfig& c, snug::MemoryTracker& tracker)
        : c_(c),
          layout_(c),
          params_(tracker, snug::MemoryCategory::parameters, static_cast<std::size_t>(layout_.total),
                  "TinyLM parameters"),
          grads_(tracker, snug::MemoryCategory::gradients, static_cast<std::size_t>(layout_.total), "TinyLM gradients"),
          stack_(make_layers()) {}

    // Host fp32 starting weights: embeddings N(0, 0.02), gates g = 1, w = 0.1,
    // LayerNorm weight 1, bias 0.
    static std::vector<float> initial_weights(const TinyConfig& c, std::uint64_t seed) {
        const TinyLayout l(c);
        std::vector<float> w(static_cast<std::size_t>(l.total), 0.0f);
        snug::Generator rng(seed);
        for (std::int64_t i = l.wte; i < l.gates; ++i) w[std::size_t(i)] = 0.02f * rng.normal();
        for (int k = 0; k < c.layers; ++k)
            for (int j = 0; j < c.channels; ++j) {
                w[std::size_t(l.gate_g(c, k) + j)] = 1.0f;
                w[std::size_t(l.gate_w(c, k) + j)] = 0.1f;
            }
        std::fill(w.begin() + l.lnfw, w.begin() + l.lnfb, 1.0f);
        return w;
    }

    void load_weights(const D& dev, const std::vector<float>& host) {
        snug::upload_weights(dev, params_.data(), layout_.total, host, "TinyLM");
    }

    // ---- what snug::TrainableModel asks for ----
    std::int64_t num_parameters() const { return layout_.total; }
    Act* parameters() { return params_.data(); }
    float* gradients() { return grads_.data(); }
    void zero_grad(const D& dev) { fill_zero(dev, grads_.data(), layout_.total); }
    // AdamW decays the two embedding matrices, not the gates or LayerNorm.
    std::vector<snug::ParameterGroup> parameter_groups() const {
        return {{0, layout_.gates, true}, {layout_.gates, layout_.total - layout_.gates, false}};
    }
    int num_blocks() const { return c_.layers; }
    void set_recompute(std::span<const snug::Recompute> modes) { stack_.set_modes(modes); }
    // GatedResidual can recompute selectively, so the Budget policy may choose it.
    static constexpr bool supports_selective() { return snug::SelectiveLayer<GatedResidual<Act, D>>; }

    // What snug::MeterableModel asks for: this model on another device tag
    // (snug::Meter measures it), and the config to build it from.
    template <snug::DeviceTag E>
    using on_device = TinyLM<Act, E>;
    const TinyConfig& config() const { return c_; }

    // tokens, targets: (B, T) in D's memory. Returns the mean loss; the logits
    // become their gradient times dloss (= d objective / d each token's loss),
    // for the backward() that must follow. With loss_sum (one double in D's
    // memory; TrainStep passes it) the token losses are added there instead,
    // on the device, and NaN is returned: one read per update, not per pass.
    float forward(snug::Context<D>& ctx, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                  float dloss, double* loss_sum = nullptr) {
        if (B <= 0 || T <= 0 || T > c_.max_seq)
            throw snug::ShapeError("TinyLM: B = " + std::to_string(B) + ", T = " + std::to_string(T) +
                                   " (T at most " + std::to_string(c_.max_seq) + ")");
        B_ = B;
        T_ = T;
        const std::int64_t N = std::int64_t{B} * T, C = c_.channels, V = c_.vocab;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        const Act* p = params_.data();
        mark_ = a.mark();

        Act* x0 = a.template push<Act>(std::size_t(N * C), "embedding");  // (B, T, C)
        encoder_forward(dev, x0, tokens, p + layout_.wte, p + layout_.wpe, B, T, c_.channels);
        x_last_ = stack_.forward(ctx, snug::TensorView<const Act, D>(x0, {B, T, C})).data();  // (B, T, C)

        head_mark_ = a.mark();
        lnf_ = a.template push<Act>(std::size_t(N * C), "ln_f");  // (B, T, C)
        mean_ = a.template push<float>(std::size_t(N), "ln_f mean");
        rstd_ = a.template push<float>(std::size_t(N), "ln_f rstd");
        layernorm_forward(dev, lnf_, mean_, rstd_, x_last_, p + layout_.lnfw, p + layout_.lnfb, N, c_.channels);
        logits_ = a.template push<Act>(std::size_t(N * V), "logits");  // (B, T, V), the head tied to wte
        linear_forward(dev, logits_, lnf_, p + layout_.wte, static_cast<const Act*>(nullptr), N, c_.channels, c_.vocab);

        float* losses = a.template push<float>(std::size_t(N), "losses");  // (B, T)
        softmax_cross_entropy(dev, losses, logits_, targets, N, c_.vocab, c_.vocab, dloss);
        if (loss_sum != nullptr) {
            accumulate_sum(dev, loss_sum, losses, N);
            a.pop(losses);
            return std::numeric_limits<float>::quiet_NaN();
        }
        std::vector<float> host(static_cast<std::size_t>(N));
        download(dev, host.data(), losses, N);
        a.pop(losses);
        double sum = 0.0;
        for (float l : host) sum += l;
        return static_cast<float>(sum / static_cast<double>(N));
    }

    // Adds this pass's gradients into gradients() and frees its activations.
    void backward(snug::Context<D>& ctx, const std::int32_t* tokens) {
        const std::int64_t N = std::int64_t{B_} * T_;
        const int C = c_.channels;
        const D& dev = ctx.device;
        const Act* p = params_.data();
        float* g = grads_.data();
        auto& tmp = ctx.scratch;
        const auto scratch_mark = tmp.mark();

        Act* dres = tmp.template push<Act>(std::size_t(N * C), "d residual");   // (B, T, C)
        Act* dother = tmp.template push<Act>(std::size_t(N * C), "d residual (other)");
        Act* dlnf = tmp.template push<Act>(std::size_t(N * C), "d ln_f");
        linear_backward(dev, dlnf, g + layout_.wte, static_cast<float*>(nullptr), logits_, lnf_, p + layout_.wte, N, C,
                        c_.vocab);
        fill_zero(dev, dres, N * C);
        layernorm_backward(dev, dres, g + layout_.lnfw, g + layout_.lnfb, dlnf, x_last_, p + layout_.lnfw, mean_, rstd_,
                           N, C);
        tmp.pop(dlnf);
        ctx.activations.release_to(head_mark_);  // before the layers' backward, which may recompute
        dres = stack_.backward(ctx, dres, dother);
        encoder_backward(dev, g + layout_.wte, g + layout_.wpe, dres, tokens, B_, T_, C);
        tmp.release_to(scratch_mark);
        ctx.activations.release_to(mark_);
    }

private:
    snug::LayerStack<GatedResidual<Act, D>> make_layers() {
        std::vector<GatedResidual<Act, D>> layers;
        for (int l = 0; l < c_.layers; ++l)
            layers.emplace_back(c_.channels, params_.data() + layout_.gate_g(c_, l),
                                params_.data() + layout_.gate_w(c_, l), grads_.data() + layout_.gate_g(c_, l),
                                grads_.data() + layout_.gate_w(c_, l));
        return snug::LayerStack<GatedResidual<Act, D>>(std::move(layers));
    }

    TinyConfig c_;
    TinyLayout layout_;
    snug::Buffer<Act, D> params_;
    snug::Buffer<float, D> grads_;
    snug::LayerStack<GatedResidual<Act, D>> stack_;
    // The pass in flight.
    int B_ = 0, T_ = 0;
    typename snug::ActivationArena<D>::Mark mark_{}, head_mark_{};
    Act* x_last_ = nullptr;  // (B, T, C)
    Act* lnf_ = nullptr;     // (B, T, C)
    float* mean_ = nullptr;  // (B, T)
    float* rstd_ = nullptr;  // (B, T)
    Act* logits_ = nullptr;  // (B, T, V)
};

static_assert(snug::TrainableModel<TinyLM<float, Dev>>);

// ---- the driver -------------------------------------------------------------

// The tracker every byte goes through, the two arenas, cuBLASLt on CUDA (for
// linear_forward / linear_backward) and the context, wired by snug::Session;
// no memory budget here.
using Session = snug::Session<Dev>;

constexpr TinyConfig config{};
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
            t[i] = static_cast<std::int32_t>(rng_.below(config.vocab));
            y[i] = (t[i] * 7 + 3) % config.vocab;
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
    using Model = TinyLM<Act, Dev>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;

    Session s(std::nullopt);
    Model model(config, s.tracker);
    const std::vector<float> w0 = Model::initial_weights(config, 1);
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
    const std::vector<snug::Recompute> keep_all(std::size_t(config.layers), snug::Recompute::none);
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
    TinyLM<Act, Dev> model(config, s.tracker);
    model.load_weights(s.ctx.device, TinyLM<Act, Dev>::initial_weights(config, 3));
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
        std::printf("custom_layer on %s%s: TinyLM (V %d, C %d, %d GatedResidual layers), B %d, T %d\n",
                    tiny::Dev::name, snug::cuda_emulated ? " (emulated)" : "", tiny::config.vocab, tiny::config.channels, tiny::config.layers, tiny::B, tiny::T);
        bool ok = true;
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
        // predicted activation peak fits 80 KiB (the plain run needs 96.75 KiB).
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
