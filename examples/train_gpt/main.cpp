// train_gpt: the main job. Trains a GPT-2-style model with every knob that
// decides memory and speed on the command line, logs each update (one JSON
// line per step, a progress display, a summary table) and samples text at the
// end. With no arguments it trains a small model on the built-in synthetic
// corpus (20-60 s on two CPU cores) and prints its validation loss next
// to the corpus's exact entropy floor.
//
// Built by g++ from this file it runs on the host backend; built by nvcc
// (main.cu includes this file) it also runs on snug::Cuda, and --device auto
// picks the GPU when one exists.
//
// Exit codes: 0 done, 1 runtime error (file, numerics), 2 bad command line or
// configuration (also --device cuda without a GPU), 3 out of the memory budget.
//
// Not here yet (a later change): saving and resuming checkpoints, llm.c model
// files (--init-from, eval-only), safetensors export, llm.c tokenizer files
// for decoding samples of GPT-2 token data.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/data/loader.hpp"
#include "snug/data/synthetic_corpus.hpp"
#include "snug/data/text_file.hpp"
#include "snug/data/token_file.hpp"
#include "snug/io/file.hpp"
#include "snug/snug.hpp"
#include "snug/train/lr_schedule.hpp"
#include "snug/train/metrics.hpp"

namespace {

// ---- the command line --------------------------------------------------------

enum class CheckpointKind { none, full, every2, every3, every4, selective, automatic };

struct Options {
    std::string model;  // a preset; empty: layers / heads / channels
    int layers = 2, heads = 4, channels = 128;
    std::string precision = "fp32";
    int batch = 32, seq = 32;
    int accum = 1;
    std::int64_t batch_tokens = 0;
    std::string checkpoint = "none";
    float lr = 3e-3f;
    int warmup = 20;
    float min_lr_frac = 0.1f;
    float weight_decay = 0.1f;
    float clip = 1.0f;
    int steps = 1000;
    int eval_every = 100;
    int eval_batches = 4;
    std::uint64_t seed = 1337;
    std::string out;
    std::string vram_budget = "12GiB";
    std::string device = "auto";
    std::string data = "builtin";
    std::string val;
    int sample = 256;
    std::string prompt;
    float temperature = 0.8f;
    int top_k = 0;
    double flops_budget = 0.0;
    int alphabet = 8;

    CheckpointKind checkpoint_kind = CheckpointKind::none;
    std::optional<std::size_t> budget_bytes;
};

CheckpointKind parse_checkpoint(const std::string& s) {
    if (s == "none") return CheckpointKind::none;
    if (s == "full") return CheckpointKind::full;
    if (s == "selective") return CheckpointKind::selective;
    if (s == "auto") return CheckpointKind::automatic;
    if (s == "every:2") return CheckpointKind::every2;
    if (s == "every:3") return CheckpointKind::every3;
    if (s == "every:4") return CheckpointKind::every4;
    if (s.rfind("every:", 0) == 0)
        throw snug::ConfigError("--checkpoint " + s + ": every:K is compiled for K = 2, 3, 4 only "
                                "(every:1 is 'full'; use 'auto' to fit a budget)");
    throw snug::ConfigError("--checkpoint " + s + ": expected none, full, every:K (K = 2, 3, 4), selective or auto");
}

// ---- data ----------------------------------------------------------------------

struct Data {
    std::vector<std::int32_t> train, val;
    int vocab = 256;
    bool bytes = true;                // tokens are bytes: samples print as text
    std::optional<double> floor;      // exact loss floor (built-in corpus)
    std::string description;
};

constexpr int gpt2_vocab = 50257;

std::vector<std::int32_t> read_token_glob(const std::string& pattern, int vocab) {
    std::vector<std::int32_t> all;
    for (const auto& path : snug::data::expand_glob(pattern)) {
        const auto part = snug::data::read_token_file(path, vocab);
        all.insert(all.end(), part.begin(), part.end());
    }
    return all;
}

Data load_data(const Options& o, std::int64_t train_tokens_needed) {
    Data d;
    const std::int64_t val_needed = std::int64_t{o.eval_batches} * o.batch * o.seq + 1;
    if (o.data == "builtin") {
        snug::data::SyntheticCorpusConfig corpus_config;
        corpus_config.alphabet = o.alphabet;
        const snug::data::SyntheticCorpus corpus(corpus_config);
        // Enough for every update once (the loader wraps after), at most 16M tokens.
        d.train = corpus.generate(std::min<std::int64_t>(train_tokens_needed, std::int64_t{16} << 20), 0);
        d.val = corpus.generate(val_needed, 1);
        d.vocab = corpus.vocab_size();
        d.floor = corpus.window_floor(o.seq);
        char line[200];
        std::snprintf(line, sizeof line,
                      "built-in synthetic corpus (order-2 Markov, %d characters, entropy rate %.4f nats/token; "
                      "floor at T = %d: %.4f)",
                      corpus.alphabet(), corpus.entropy_rate(), o.seq, *d.floor);
        d.description = line;
    } else if (o.data.rfind("text:", 0) == 0) {
        const std::string path = o.data.substr(5);
        const auto tokens = snug::data::read_text_file(path);
        auto split = snug::data::split_train_val(tokens, 0.1);
        d.train = std::move(split.train);
        d.val = std::move(split.val);
        d.vocab = snug::data::byte_vocab_size;
        d.description = "text file " + path + " as bytes (" + std::to_string(tokens.size()) +
                        " tokens; the last 10% for validation)";
    } else if (o.data.rfind("tokens:", 0) == 0) {
        const std::string pattern = o.data.substr(7);
        d.vocab = gpt2_vocab;
        d.bytes = false;
        d.train = read_token_glob(pattern, d.vocab);
        if (!o.val.empty()) {
            if (o.val.rfind("tokens:", 0) != 0) throw snug::ConfigError("--val " + o.val + ": expected tokens:GLOB");
            d.val = read_token_glob(o.val.substr(7), d.vocab);
            d.description = "llm.c token files " + pattern + " (" + std::to_string(d.train.size()) +
                            " tokens), validation " + o.val.substr(7) + " (" + std::to_string(d.val.size()) +
                            " tokens)";
        } else {
            auto split = snug::data::split_train_val(d.train, 0.1);
            d.train = std::move(split.train);
            d.val = std::move(split.val);
            d.description = "llm.c token files " + pattern + " (the last 10% for validation)";
        }
    } else {
        throw snug::ConfigError("--data " + o.data + ": expected builtin, text:PATH or tokens:GLOB");
    }
    if (!o.val.empty() && o.data.rfind("tokens:", 0) != 0)
        throw snug::ConfigError("--val is for --data tokens:GLOB (the other sources split off their own)");
    return d;
}

// ---- the device ------------------------------------------------------------------

struct DeviceInfo {
    std::string name = "host";   // what the peak-FLOP/s table is asked about
    std::string description;
};

// The tracker, the arenas, the cuBLASLt context on CUDA, the Context layers get.
template <class Dev>
struct Session {
    snug::MemoryTracker tracker;
#if defined(__CUDACC__)
    std::optional<snug::cuda::Blas> blas;
#endif
    snug::ActivationArena<Dev> activations;
    snug::ActivationArena<Dev> scratch;
    snug::Context<Dev> ctx;

    explicit Session(std::optional<std::size_t> budget)
        : tracker(budget),
          activations(tracker),
          scratch(tracker, snug::ActivationArena<Dev>::default_chunk_bytes, snug::MemoryCategory::temporaries),
          ctx{Dev{}, activations, scratch} {
#if defined(__CUDACC__)
        if constexpr (std::is_same_v<Dev, snug::Cuda>) {
            blas.emplace(tracker);
            ctx.device.blas = &*blas;
        }
#endif
    }
};

std::string format_double(const char* format, double v) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, v);
    return buffer;
}

bool stdout_is_terminal() { return ::isatty(::fileno(stdout)) != 0; }

// ---- sampling --------------------------------------------------------------------

// Draws the next token from logits (vocab): greedy for temperature <= 0, else
// softmax(logits / temperature) restricted to the top_k largest (top_k <= 0: all).
int sample_token(const std::vector<float>& logits, float temperature, int top_k, snug::Generator& rng) {
    const int V = static_cast<int>(logits.size());
    if (temperature <= 0.0f)
        return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const int k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
    const double top = logits[static_cast<std::size_t>(order[0])];
    std::vector<double> weights(static_cast<std::size_t>(k));
    double sum = 0.0;
    for (int i = 0; i < k; ++i) {
        weights[static_cast<std::size_t>(i)] =
            std::exp((logits[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] - top) / temperature);
        sum += weights[static_cast<std::size_t>(i)];
    }
    double u = static_cast<double>(rng.uniform()) * sum;
    for (int i = 0; i < k; ++i) {
        u -= weights[static_cast<std::size_t>(i)];
        if (u < 0.0) return order[static_cast<std::size_t>(i)];
    }
    return order[static_cast<std::size_t>(k - 1)];
}

std::string render_tokens(const std::vector<std::int32_t>& tokens, bool bytes) {
    std::string out;
    for (std::int32_t t : tokens) {
        if (bytes) {
            const auto c = static_cast<unsigned char>(t);
            if (c == '\n' || (c >= 32 && c < 127)) {
                out += static_cast<char>(c);
            } else {
                char esc[8];
                std::snprintf(esc, sizeof esc, "\\x%02x", c);
                out += esc;
            }
        } else {
            if (!out.empty()) out += ' ';
            out += std::to_string(t);
        }
    }
    return out;
}

template <class Model, class Dev>
std::vector<std::int32_t> generate(Model& model, Session<Dev>& s, std::vector<std::int32_t> tokens, int n,
                                   const Options& o, int vocab) {
    const int max_T = model.config().max_seq_len;
    const int Vp = model.config().padded_vocab_size;
    snug::Buffer<std::int32_t, Dev> window(s.tracker, snug::MemoryCategory::workspace,
                                           static_cast<std::size_t>(max_T), "sampling window");
    snug::Generator rng(o.seed, /*offset=*/0x5a3e);
    using Act = typename Model::value_type;
    std::vector<Act> row(static_cast<std::size_t>(Vp));
    std::vector<float> logits(static_cast<std::size_t>(vocab));
    const std::size_t prompt = tokens.size();
    for (int i = 0; i < n; ++i) {
        const int T = static_cast<int>(std::min<std::size_t>(tokens.size(), static_cast<std::size_t>(max_T)));
        upload(s.ctx.device, window.data(), tokens.data() + (tokens.size() - static_cast<std::size_t>(T)), T);
        model.forward(s.ctx, window.data(), nullptr, 1, T, 0.0f);
        const auto view = model.logits();  // (1, T, Vp)
        download(s.ctx.device, row.data(), view.data() + std::int64_t{T - 1} * Vp, Vp);
        model.release(s.ctx);
        for (int v = 0; v < vocab; ++v) logits[static_cast<std::size_t>(v)] = static_cast<float>(row[static_cast<std::size_t>(v)]);
        tokens.push_back(sample_token(logits, o.temperature, o.top_k, rng));
    }
    return std::vector<std::int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(prompt), tokens.end());
}

// ---- training ----------------------------------------------------------------------

template <class Precision>
constexpr bool is_16_bit = sizeof(typename Precision::compute_type) < 4;

// --checkpoint auto: the activation bytes left for checkpoint::Budget once the
// model, the token buffers, the optimizer (fp32 moments, master weights for
// 16-bit) and backward's temporaries (an estimate of their peak: 11 (B, T, C)
// tensors and one (B, NH, T, T) in the compute type) are counted.
template <class Precision>
std::optional<std::size_t> auto_activation_budget(const snug::MemoryTracker& tracker, const snug::GPTConfig& c,
                                                  std::int64_t P, int B, int T) {
    const auto headroom = tracker.headroom();
    if (!headroom) return std::nullopt;
    const std::size_t act = sizeof(typename Precision::compute_type);
    const auto N = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::size_t optimizer = static_cast<std::size_t>(P) * (8 + (is_16_bit<Precision> ? 4 : 0));
    const std::size_t temporaries =
        act * (11 * N * static_cast<std::size_t>(c.channels) +
               static_cast<std::size_t>(B) * static_cast<std::size_t>(c.n_head) * static_cast<std::size_t>(T) *
                   static_cast<std::size_t>(T));
    const std::size_t margin = std::size_t{64} << 10;  // gradient-norm result, loss-scaler flag, slack
    const std::size_t reserved = optimizer + temporaries + margin;
    if (*headroom <= reserved)
        throw snug::OutOfMemory("--checkpoint auto: the budget leaves " + snug::format_bytes(*headroom) +
                                " after the model, but the optimizer and backward's temporaries need about " +
                                snug::format_bytes(reserved) + " before any activation\n" + tracker.report());
    return *headroom - reserved;
}

std::string describe_plan(std::span<const snug::Recompute> plan) {
    std::string out;
    for (std::size_t i = 0; i < plan.size(); ++i) {
        if (i > 0) out += ' ';
        out += snug::recompute_name(plan[i]);
    }
    return out;
}

template <class Dev, class Precision, class Checkpoint>
int train(const Options& o, const Data& data, const snug::GPTConfig& config, const DeviceInfo& device) {
    using Model = snug::GPT<typename Precision::compute_type, Dev>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;
    const int B = o.batch, T = o.seq, n = o.accum;
    const std::int64_t BT = std::int64_t{B} * T;

    Session<Dev> s(o.budget_bytes);
    Model model(config, s.tracker);
    const auto weights = snug::gpt_initial_weights(config, o.seed);
    model.load_weights(s.ctx.device, weights);
    snug::Buffer<std::int32_t, Dev> tokens_dev(s.tracker, snug::MemoryCategory::workspace,
                                               static_cast<std::size_t>(n * BT), "token ids");
    snug::Buffer<std::int32_t, Dev> targets_dev(s.tracker, snug::MemoryCategory::workspace,
                                                static_cast<std::size_t>(n * BT), "target ids");

    Checkpoint checkpoint{};
    if constexpr (std::is_same_v<Checkpoint, snug::checkpoint::Budget>) {
        const auto bytes = auto_activation_budget<Precision>(s.tracker, config, model.num_parameters(), B, T);
        // No memory budget: nothing to fit, keep every activation.
        checkpoint = snug::checkpoint::Budget(bytes.value_or(std::numeric_limits<std::size_t>::max()));
        std::printf("checkpoint auto: %s for activations\n",
                    bytes ? snug::format_bytes(*bytes).c_str() : "no memory budget, no limit");
    }
    snug::TrainConfig tc;
    tc.adamw.lr = o.lr;
    tc.adamw.weight_decay = o.weight_decay;
    tc.max_grad_norm = o.clip;
    Step step(model, s.tracker, s.ctx.device, weights, tc, {}, snug::accumulate::Steps(n), checkpoint);

    const snug::LrSchedule schedule{o.lr, o.warmup, o.steps, o.min_lr_frac};
    schedule.validate();
    snug::data::BatchLoader train_loader(data.train, B, T, "training data");
    snug::data::BatchLoader val_loader(data.val, B, T, "validation data");
    std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(n * BT)), host_targets(host_tokens.size());
    std::vector<snug::MicroBatch> batches;
    for (int m = 0; m < n; ++m) batches.push_back({tokens_dev.data() + m * BT, targets_dev.data() + m * BT});

    auto evaluate = [&]() {
        val_loader.set_position(0);  // the same batches every time: losses compare
        double sum = 0.0;
        for (int i = 0; i < o.eval_batches; ++i) {
            val_loader.next(host_tokens.data(), host_targets.data());
            upload(s.ctx.device, tokens_dev.data(), host_tokens.data(), BT);
            upload(s.ctx.device, targets_dev.data(), host_targets.data(), BT);
            sum += model.evaluate(s.ctx, tokens_dev.data(), targets_dev.data(), B, T);
        }
        return sum / o.eval_batches;
    };
    auto val_text = [&](double loss) {
        std::string t = format_double("val loss %.4f nats", loss);
        if (data.floor) t += format_double(" (floor %.4f)", *data.floor);
        return t;
    };

    std::optional<snug::JsonLinesFile> jsonl;
    if (!o.out.empty()) jsonl.emplace(std::filesystem::path(o.out) / "metrics.jsonl");
    const bool live = stdout_is_terminal();
    snug::ProgressDisplay display(stdout, live, std::max(1, o.steps / 20));
    const auto peak = snug::peak_flops(device.name, Precision::name);
    const double flops_per_token = config.flops_per_token(T);

    const double first_val = evaluate();
    display.print("step 0: " + val_text(first_val));

    std::vector<snug::StepRecord> records;
    records.reserve(static_cast<std::size_t>(o.steps));
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (int i = 0; i < o.steps; ++i) {
        const float lr = schedule(i);
        const auto t0 = clock::now();
        for (int m = 0; m < n; ++m) {
            train_loader.next(host_tokens.data() + m * BT, host_targets.data() + m * BT);
            upload(s.ctx.device, tokens_dev.data() + m * BT, host_tokens.data() + m * BT, BT);
            upload(s.ctx.device, targets_dev.data() + m * BT, host_targets.data() + m * BT, BT);
        }
        const snug::StepResult r = step.step(s.ctx, batches, B, T, lr);
        const auto t1 = clock::now();
        if (i == 0) std::printf("recompute plan: %s\n", describe_plan(step.recompute_plan()).c_str());

        snug::StepRecord rec;
        rec.step = i + 1;
        rec.train_loss = r.loss;
        rec.lr = lr;
        rec.grad_norm = r.grad_norm;
        rec.loss_scale = r.loss_scale;
        rec.skipped = r.skipped;
        rec.tokens = r.tokens;
        rec.seconds = std::chrono::duration<double>(t1 - t0).count();
        rec.model_flops = flops_per_token * static_cast<double>(r.tokens);
        rec.hardware_flops =
            rec.model_flops + snug::recompute_flops_per_token(config, T, step.recompute_plan()) * static_cast<double>(r.tokens);
        rec.peak_flops_per_second = peak;
        for (snug::MemoryCategory c : snug::all_memory_categories)
            rec.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
        rec.peak_total = s.tracker.peak_total();
        if ((i + 1) % o.eval_every == 0 || i + 1 == o.steps) rec.val_loss = evaluate();
        rec.wall_clock = std::chrono::duration<double>(clock::now() - start).count();
        records.push_back(rec);

        if (jsonl) jsonl->write(snug::to_json(rec));
        display.update(rec.step, snug::progress_line(rec, o.steps));
        if (rec.val_loss) display.print("step " + std::to_string(rec.step) + ": " + val_text(*rec.val_loss));
        if (!std::isfinite(r.loss) && !Precision::has_loss_scaler) {
            display.finish();
            std::fprintf(stderr, "train_gpt: the training loss is %f at step %d; stopping (try a lower --lr)\n",
                         static_cast<double>(r.loss), i + 1);
            return 1;
        }
    }
    display.finish();

    snug::RunSummary summary = snug::summarize(
        records, o.flops_budget > 0.0 ? std::optional<double>(o.flops_budget) : std::nullopt, data.floor);
    summary.first_val_loss = first_val;
    std::printf("\n%s", snug::render_summary(summary).c_str());
    if (step.skipped_steps() > 0)
        std::printf("  skipped updates          %lld (non-finite gradients)\n",
                    static_cast<long long>(step.skipped_steps()));

    if (!o.out.empty()) {
        const nlohmann::json j = {
            {"steps", summary.steps},
            {"tokens", summary.tokens},
            {"wall_clock_seconds", summary.wall_clock},
            {"median_tokens_per_second", summary.median_tokens_per_second.value_or(0.0)},
            {"median_mfu", summary.median_mfu ? nlohmann::json(*summary.median_mfu) : nlohmann::json(nullptr)},
            {"final_train_loss", summary.final_train_loss.value_or(NAN)},
            {"first_val_loss", first_val},
            {"final_val_loss", summary.final_val_loss ? nlohmann::json(*summary.final_val_loss) : nlohmann::json(nullptr)},
            {"loss_floor", data.floor ? nlohmann::json(*data.floor) : nlohmann::json(nullptr)},
            {"total_model_flops", summary.total_model_flops},
            {"flops_budget", summary.flops_budget},
            {"loss_at_equal_flops",
             summary.loss_at_equal_flops ? nlohmann::json(*summary.loss_at_equal_flops) : nlohmann::json(nullptr)},
            {"peak_bytes_total", summary.peak_total},
            {"device", device.description},
            {"precision", Precision::name},
            {"checkpoint", o.checkpoint},
            {"recompute_plan", describe_plan(step.recompute_plan())},
            {"micro_batch", B},
            {"seq", T},
            {"accumulation", n},
        };
        const std::string text = j.dump(2) + "\n";
        snug::io::atomic_write(std::filesystem::path(o.out) / "summary.json",
                               [&](snug::io::FileWriter& w) { w.write(text.data(), text.size()); });
        std::printf("metrics: %s/metrics.jsonl, %s/summary.json\n", o.out.c_str(), o.out.c_str());
    }

    if (o.sample > 0) {
        std::vector<std::int32_t> prompt;
        if (!o.prompt.empty()) {
            if (!data.bytes)
                throw snug::ConfigError("--prompt needs byte-level data (builtin or text:); token data samples "
                                        "start from the validation tokens");
            prompt.assign(o.prompt.begin(), o.prompt.end());
            for (auto& t : prompt) t = static_cast<unsigned char>(t);
        } else {
            const std::size_t k = std::min<std::size_t>(8, data.val.size());
            prompt.assign(data.val.begin(), data.val.begin() + static_cast<std::ptrdiff_t>(k));
        }
        const auto out = generate(model, s, prompt, o.sample, o, data.vocab);
        const std::string shown_prompt = render_tokens(prompt, data.bytes);
        const std::string text = shown_prompt + (data.bytes ? "" : " ") + render_tokens(out, data.bytes);
        std::printf("\nsample (temperature %.2f, top-k %s), prompt \"%s\":\n%s\n", static_cast<double>(o.temperature),
                    o.top_k > 0 ? std::to_string(o.top_k).c_str() : "all", shown_prompt.c_str(), text.c_str());
    }
    return 0;
}

template <class Dev, class Precision>
int dispatch_checkpoint(const Options& o, const Data& data, const snug::GPTConfig& config, const DeviceInfo& device) {
    namespace ck = snug::checkpoint;
    switch (o.checkpoint_kind) {
        case CheckpointKind::none: return train<Dev, Precision, ck::None>(o, data, config, device);
        case CheckpointKind::full: return train<Dev, Precision, ck::Full>(o, data, config, device);
        case CheckpointKind::every2: return train<Dev, Precision, ck::EveryNth<2>>(o, data, config, device);
        case CheckpointKind::every3: return train<Dev, Precision, ck::EveryNth<3>>(o, data, config, device);
        case CheckpointKind::every4: return train<Dev, Precision, ck::EveryNth<4>>(o, data, config, device);
        case CheckpointKind::selective: return train<Dev, Precision, ck::Selective>(o, data, config, device);
        case CheckpointKind::automatic: return train<Dev, Precision, ck::Budget>(o, data, config, device);
    }
    return 2;
}

template <class Dev>
int dispatch(const Options& o, const Data& data, const snug::GPTConfig& config, const DeviceInfo& device) {
    if (o.precision == "fp32") return dispatch_checkpoint<Dev, snug::precision::Fp32>(o, data, config, device);
    if (o.precision == "bf16") return dispatch_checkpoint<Dev, snug::precision::Bf16>(o, data, config, device);
    return dispatch_checkpoint<Dev, snug::precision::Fp16<snug::DynamicLossScaler>>(o, data, config, device);
}

// ---- main ------------------------------------------------------------------------

int run(int argc, char** argv) {
    Options o;
    CLI::App app{
        "train_gpt: train a GPT-2-style model and measure what each memory/speed choice costs.\n"
        "With no arguments: a small model (2 layers, 4 heads, 128 channels; B 32, T 32, 1000 updates, fp32) on the\n"
        "built-in synthetic corpus.\n"
        "Not yet available (a later change): --resume / checkpoint saving, --init-from (llm.c model files),\n"
        "an eval-only mode, --export (safetensors), decoding GPT-2 token samples with llm.c's tokenizer.\n"};
    app.option_defaults()->always_capture_default();
    auto* model_opt = app.add_option("--model", o.model, "preset: d2 d4 d6 d12 d24 d36 d48 124M 350M 774M 1558M");
    app.add_option("--layers", o.layers, "layers (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--heads", o.heads, "attention heads (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--channels", o.channels, "channels (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--precision", o.precision, "fp32, bf16, or fp16 (dynamic loss scaling)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--batch", o.batch, "micro-batch B (sequences per forward)")->check(CLI::PositiveNumber);
    app.add_option("--seq", o.seq, "sequence length T (also the model's context)")->check(CLI::PositiveNumber);
    auto* accum_opt = app.add_option("--accum", o.accum, "micro-batches per update")->check(CLI::PositiveNumber);
    app.add_option("--batch-tokens", o.batch_tokens, "tokens per update; sets --accum = this / (B T), which must divide")
        ->excludes(accum_opt)
        ->check(CLI::PositiveNumber);
    app.add_option("--checkpoint", o.checkpoint, "none, full, every:K (K = 2, 3, 4), selective, auto (fit --vram-budget)");
    app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(CLI::NonNegativeNumber);
    app.add_option("--min-lr-frac", o.min_lr_frac, "cosine decay floor as a fraction of --lr")->check(CLI::Range(0.0, 1.0));
    app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights)")->check(CLI::NonNegativeNumber);
    app.add_option("--clip", o.clip, "gradient-norm clipping (<= 0: off)");
    app.add_option("--steps", o.steps, "optimizer updates")->check(CLI::PositiveNumber);
    app.add_option("--eval-every", o.eval_every, "updates between validation losses")->check(CLI::PositiveNumber);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches per evaluation")->check(CLI::PositiveNumber);
    app.add_option("--seed", o.seed, "weights and sampling seed");
    app.add_option("--out", o.out, "directory for metrics.jsonl and summary.json (empty: no files)");
    app.add_option("--vram-budget", o.vram_budget, "memory budget (e.g. 12GiB, 500MiB, none); over it: exit 3");
    app.add_option("--device", o.device, "cuda, host, or auto (the GPU if one exists)")
        ->check(CLI::IsMember({"cuda", "host", "auto"}));
    app.add_option("--data", o.data, "builtin, text:PATH (bytes), tokens:GLOB (llm.c token files)");
    app.add_option("--alphabet", o.alphabet, "characters of the built-in corpus (4..48; more: harder)")
        ->check(CLI::Range(4, 48));
    app.add_option("--val", o.val, "validation data for tokens: (tokens:GLOB); default: the last 10% of --data");
    app.add_option("--sample", o.sample, "tokens to generate at the end (0: none)")->check(CLI::NonNegativeNumber);
    app.add_option("--prompt", o.prompt, "prompt text for the sample (default: the start of the validation data)");
    app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
    app.add_option("--top-k", o.top_k, "sample among the k likeliest tokens (0: all)")->check(CLI::NonNegativeNumber);
    app.add_option("--flops-budget", o.flops_budget,
                   "model FLOPs at which 'loss at equal FLOPs' is read (0: the run's total); give two runs the same")
        ->check(CLI::NonNegativeNumber);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }

    o.checkpoint_kind = parse_checkpoint(o.checkpoint);
    if (o.vram_budget != "none") o.budget_bytes = snug::parse_bytes(o.vram_budget);
    if (o.batch_tokens > 0) {
        const std::int64_t bt = std::int64_t{o.batch} * o.seq;
        if (o.batch_tokens % bt != 0)
            throw snug::ConfigError("--batch-tokens " + std::to_string(o.batch_tokens) + " is not a multiple of B T = " +
                                    std::to_string(bt) + " tokens per micro-batch");
        o.accum = static_cast<int>(o.batch_tokens / bt);
    }

    snug::GPTConfig shape;
    if (!o.model.empty()) {
        shape = snug::GPTConfig::preset(o.model);
    } else {
        shape.n_layer = o.layers;
        shape.n_head = o.heads;
        shape.channels = o.channels;
    }

    // The device: say which, and why.
    DeviceInfo device;
#if defined(__CUDACC__)
    bool use_cuda = false;
    if (o.device == "cuda") {
        snug::cuda::require_device();
        use_cuda = true;
    } else if (o.device == "auto") {
        use_cuda = snug::cuda::device_count() > 0;
    }
    if (use_cuda) {
        cudaDeviceProp prop{};
        snug::cuda::check(cudaGetDeviceProperties(&prop, 0));
        device.name = prop.name;
        device.description = "cuda (" + device.name + ")";
    } else {
        device.description = o.device == "host" ? "host (as asked)" : "host (auto: no CUDA device found)";
    }
#else
    if (o.device == "cuda")
        throw snug::NoCudaDevice("--device cuda: this train_gpt was built without CUDA (no nvcc at build time); "
                                 "use --device host or auto");
    device.description = o.device == "host" ? "host (as asked)" : "host (auto: this build has no CUDA)";
#endif

    const std::int64_t tokens_per_update = std::int64_t{o.accum} * o.batch * o.seq;
    const Data data = load_data(o, tokens_per_update * o.steps + 1);
    const snug::GPTConfig config = shape.with_vocab(data.vocab).with_context(o.seq);
    config.validate();

    std::printf("device: %s\n", device.description.c_str());
    std::printf("model: %d layers, %d heads, %d channels, context %d, vocab %d: %.2fM parameters, %.3g FLOPs/token\n",
                config.n_layer, config.n_head, config.channels, config.max_seq_len, config.vocab_size,
                static_cast<double>(config.num_parameters()) / 1e6, config.flops_per_token(o.seq));
    std::printf("precision %s, checkpoint %s, micro-batch %d x %d, %d per update: %lld tokens/update, %d updates\n",
                o.precision.c_str(), o.checkpoint.c_str(), o.batch, o.seq, o.accum,
                static_cast<long long>(tokens_per_update), o.steps);
    std::printf("lr %.3g (warmup %d, cosine to %.3g x), weight decay %.3g, clip %.3g; memory budget %s\n",
                static_cast<double>(o.lr), o.warmup, static_cast<double>(o.min_lr_frac),
                static_cast<double>(o.weight_decay), static_cast<double>(o.clip),
                o.budget_bytes ? snug::format_bytes(*o.budget_bytes).c_str() : "none");
    std::printf("data: %s\n", data.description.c_str());
    if (!o.out.empty()) std::filesystem::create_directories(o.out);
    std::fflush(stdout);

#if defined(__CUDACC__)
    if (use_cuda) return dispatch<snug::Cuda>(o, data, config, device);
#endif
    return dispatch<snug::Host>(o, data, config, device);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const snug::OutOfMemory& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\ntrain_gpt: OutOfMemory: %s\n", e.what());
        return 3;
    } catch (const snug::NoCudaDevice& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        return 2;
    } catch (const snug::ConfigError& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\ntrain_gpt: error: %s\n", e.what());
        return 1;
    }
}
