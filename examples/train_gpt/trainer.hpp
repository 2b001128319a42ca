// train_gpt's engine, shared by the train_gpt program (main.cpp) and the VRAM
// ladder (examples/vram_ladder): the command-line options, the data sources,
// the device session, sampling, and one training run — from a fresh model,
// an llm.c model file or a saved training state — that returns what it
// measured instead of exiting.
//
// One run, top to bottom (train<Dev, Precision, Checkpoint>):
//   the tracker (the --vram-budget), the model, the token buffers, TrainStep;
//   --resume: the saved state replaces weights, optimizer, scaler, data position;
//   each update: LR from the schedule, n micro-batches, TrainStep::step, a record
//   (JSON line + progress), validation at the interval, the state saved every
//   --save-every updates and when Ctrl-C asks to stop;
//   the end: the summary, the state and model files asked for, a sample.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
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
#include "snug/data/tokenizer.hpp"
#include "snug/io/file.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/snug.hpp"
#include "snug/train/lr_schedule.hpp"
#include "snug/train/metrics.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/state_file.hpp"

namespace train_gpt {

// ---- the command line --------------------------------------------------------

enum class CheckpointKind { none, full, every2, every3, every4, selective, automatic };

struct Options {
    // The model: a preset, a shape, or a file (--init-from: llm.c .bin or a Hugging Face directory).
    std::string model;
    int layers = 2, heads = 4, channels = 128;
    int vocab = 0;            // the model's vocabulary (0: the data's; more: e.g. GPT-2's 50257 on the built-in data)
    std::string init_from;
    // What decides memory and speed.
    std::string precision = "fp32";
    int batch = 32, seq = 32;
    int accum = 1;
    std::int64_t batch_tokens = 0;
    std::string checkpoint = "none";
    std::string vram_budget = "12GiB";
    std::string device = "auto";
    // The optimisation.
    float lr = 3e-3f;
    int warmup = 20;
    float min_lr_frac = 0.1f;
    float weight_decay = 0.1f;
    float clip = 1.0f;
    int steps = 1000;
    std::uint64_t seed = 1337;
    // Data and evaluation.
    std::string data = "builtin";
    std::string val;
    int alphabet = 8;
    int eval_every = 100;
    int eval_batches = 4;
    bool eval_only = false;
    // Files.
    std::string out;          // metrics.jsonl, summary.json, state.snug
    std::string resume;       // a training-state file to continue from
    int save_every = 0;       // updates between state saves (0: at the end and on Ctrl-C only)
    int stop_after = 0;       // stop (and save) after this update, as Ctrl-C would (0: run to --steps)
    std::string save_model;   // llm.c model file written at the end
    std::string model_dtype = "fp32";  // its parameters: fp32 (version 3) or bf16 (version 5)
    std::string export_hf;    // directory for model.safetensors + config.json
    std::string tokenizer;    // llm.c tokenizer file, to decode token samples
    // Sampling.
    int sample = 256;
    std::string prompt;
    float temperature = 0.8f;
    int top_k = 0;
    // Reporting.
    double flops_budget = 0.0;
    bool plan = false;
    bool quiet = false;       // the ladder: no per-update lines, no summary table, no sample

    CheckpointKind checkpoint_kind = CheckpointKind::none;
    std::optional<std::size_t> budget_bytes;

    // Where the training state goes: --out DIR/state.snug (none without --out).
    std::string state_path() const { return out.empty() ? std::string() : (std::filesystem::path(out) / "state.snug").string(); }
};

inline CheckpointKind parse_checkpoint(const std::string& s) {
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

// The model's shape options both programs take; returns --model, which
// the shape options exclude (and --init-from too).
inline CLI::Option* add_model_options(CLI::App& app, Options& o) {
    auto* model_opt = app.add_option("--model", o.model, "preset: d2 d4 d6 d12 d24 d36 d48 124M 350M 774M 1558M");
    app.add_option("--layers", o.layers, "layers (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--heads", o.heads, "attention heads (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--channels", o.channels, "channels (without --model)")->excludes(model_opt)->check(CLI::PositiveNumber);
    app.add_option("--vocab", o.vocab, "the model's vocabulary (0: the data's; e.g. 50257 for GPT-2's shape on any data)")
        ->check(CLI::NonNegativeNumber);
    return model_opt;
}

// The shape asked for: a preset, or layers / heads / channels.
inline snug::GPTConfig model_shape(const Options& o) {
    if (!o.model.empty()) return snug::GPTConfig::preset(o.model);
    snug::GPTConfig shape;
    shape.n_layer = o.layers;
    shape.n_head = o.heads;
    shape.channels = o.channels;
    return shape;
}

// main() of both programs: runs `run` and turns what escapes into the exit
// codes 1 (runtime error), 2 (configuration) and 3 (memory budget).
template <class Run>
int guarded_main(const char* program, Run&& run) {
    try {
        return run();
    } catch (const snug::OutOfMemory& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: OutOfMemory: %s\n", program, e.what());
        return 3;
    } catch (const snug::NoCudaDevice& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    } catch (const snug::ConfigError& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: error: %s\n", program, e.what());
        return 1;
    }
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

inline std::vector<std::int32_t> read_token_glob(const std::string& pattern, int vocab) {
    std::vector<std::int32_t> all;
    for (const auto& path : snug::data::expand_glob(pattern)) {
        const auto part = snug::data::read_token_file(path, vocab);
        all.insert(all.end(), part.begin(), part.end());
    }
    return all;
}

inline Data load_data(const Options& o, std::int64_t train_tokens_needed) {
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
    bool cuda = false;
    std::string name = "host";   // what the peak-FLOP/s table is asked about
    std::string description;
};

// --device cuda|host|auto: which backend runs, and a line saying why.
inline DeviceInfo choose_device(const std::string& wanted) {
    DeviceInfo device;
#if defined(SNUG_CUDA_BACKEND)
    if (wanted == "cuda") {
        snug::cuda::require_device();
        device.cuda = true;
    } else if (wanted == "auto") {
        device.cuda = snug::cuda::device_count() > 0;
    }
    if (device.cuda) {
        cudaDeviceProp prop{};
        snug::cuda::check(cudaGetDeviceProperties(&prop, 0));
        device.name = prop.name;
        device.description = "cuda (" + device.name + ")";
    } else {
        device.description = wanted == "host" ? "host (as asked)" : "host (auto: no CUDA device found)";
    }
#else
    if (wanted == "cuda")
        throw snug::NoCudaDevice("--device cuda: this program was built without CUDA (no nvcc at build time); "
                                 "use --device host or auto");
    device.description = wanted == "host" ? "host (as asked)" : "host (auto: this build has no CUDA)";
#endif
    return device;
}

// The tracker, the arenas, the cuBLASLt context on CUDA, the Context layers get.
template <class Dev>
struct Session {
    snug::MemoryTracker tracker;
#if defined(SNUG_CUDA_BACKEND)
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
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, snug::Cuda>) {
            driver_baseline = driver_used_bytes();  // the context exists; nothing of this session yet
            blas.emplace(tracker);
            ctx.device.blas = &*blas;
        }
#endif
    }

    // The device memory the driver reports in use (CUDA; 0 on the host).
    static std::size_t driver_used_bytes() {
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, snug::Cuda>) {
            snug::cuda::check(cudaFree(nullptr));  // creates the context if it does not exist yet
            std::size_t free_bytes = 0, total_bytes = 0;
            snug::cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes));
            return total_bytes - free_bytes;
        }
#endif
        return 0;
    }
    // What the driver has given this session so far (CUDA; 0 on the host):
    // sampled after each update, and the arenas keep their chunks, so the
    // highest sample is the session's high-water mark as the driver sees it
    // (tracked bytes, arena chunk slack, cuBLASLt's own allocations).
    std::size_t driver_used_by_session() const {
        const std::size_t used = driver_used_bytes();
        return used > driver_baseline ? used - driver_baseline : 0;
    }
    std::size_t driver_baseline = 0;

    // The backend's own long-lived bytes (cuBLASLt's workspace on CUDA; none on the host).
    std::size_t backend_workspace() const {
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, snug::Cuda>) return blas->workspace_bytes();
#endif
        return 0;
    }
};

inline std::string format_double(const char* format, double v) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, v);
    return buffer;
}

inline bool stdout_is_terminal() { return ::isatty(::fileno(stdout)) != 0; }

// ---- sampling --------------------------------------------------------------------

// Draws the next token from logits (vocab): greedy for temperature <= 0, else
// softmax(logits / temperature) restricted to the top_k largest (top_k <= 0: all).
inline int sample_token(const std::vector<float>& logits, float temperature, int top_k, snug::Generator& rng) {
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

// Printable text: bytes as characters (\xNN for the unprintable); token ids
// through the llm.c tokenizer when there is one, else as numbers.
inline std::string printable(std::string_view bytes) {
    std::string out;
    for (const char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\n' || c >= 128 || (c >= 32 && c < 127)) {  // UTF-8 passes through
            out += ch;
        } else {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            out += esc;
        }
    }
    return out;
}

inline std::string render_tokens(const std::vector<std::int32_t>& tokens, bool bytes,
                                 const snug::data::Tokenizer* tokenizer) {
    if (bytes) {
        std::string raw;
        for (std::int32_t t : tokens) raw += static_cast<char>(static_cast<unsigned char>(t));
        return printable(raw);
    }
    if (tokenizer != nullptr) return printable(tokenizer->decode(tokens));
    std::string out;
    for (std::int32_t t : tokens) {
        if (!out.empty()) out += ' ';
        out += std::to_string(t);
    }
    return out;
}

template <class Model, class Dev>
inline std::vector<std::int32_t> generate(Model& model, Session<Dev>& s, std::vector<std::int32_t> tokens, int n,
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

// ---- Ctrl-C --------------------------------------------------------------------

// Set by SIGINT/SIGTERM; the loop finishes the update in flight, saves the
// state and stops. A second Ctrl-C kills as usual.
inline std::atomic<bool> stop_requested{false};

extern "C" inline void on_stop_signal(int) {
    stop_requested.store(true);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
}

inline void install_stop_handler() {
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
}

// ---- the model's source ------------------------------------------------------------

// The shape and the fp32 weights a run starts from.
struct ModelSource {
    snug::GPTConfig config;
    std::vector<float> weights;
    std::string description;
};

// An llm.c model file, or a Hugging Face GPT-2 directory (model.safetensors
// + config.json): its shape and fp32 weights.
inline ModelSource read_model_file(const std::string& path) {
    if (std::filesystem::is_directory(path)) {
        auto hf = snug::io::import_hf_gpt2(path);
        return {hf.config, std::move(hf.weights), "Hugging Face GPT-2 directory " + path};
    }
    auto file = snug::io::read_llmc_model(path);
    return {file.config, std::move(file.weights), "llm.c model file " + path};
}

// --init-from FILE (an llm.c model file) or DIR (Hugging Face GPT-2 safetensors
// + config.json), else a fresh GPT-2 initialisation of `shape` sized for the data.
inline ModelSource model_source(const Options& o, const snug::GPTConfig& shape, int data_vocab) {
    ModelSource m;
    if (o.init_from.empty()) {
        if (o.vocab != 0 && o.vocab < data_vocab)
            throw snug::ConfigError("--vocab " + std::to_string(o.vocab) + " is smaller than the data's vocabulary of " +
                                    std::to_string(data_vocab) + " tokens");
        m.config = shape.with_vocab(o.vocab != 0 ? o.vocab : data_vocab).with_context(o.seq);
        m.config.validate();
        m.weights = snug::gpt_initial_weights(m.config, o.seed);
        m.description = "fresh (GPT-2 initialisation, seed " + std::to_string(o.seed) + ")";
        return m;
    }
    if (o.vocab != 0)
        throw snug::ConfigError("--vocab and --init-from: the vocabulary comes from " + o.init_from);
    m = read_model_file(o.init_from);
    if (data_vocab > m.config.vocab_size)
        throw snug::ConfigError("--init-from " + o.init_from + ": the model's vocabulary has " +
                                std::to_string(m.config.vocab_size) + " tokens but the data's has " +
                                std::to_string(data_vocab));
    if (o.seq > m.config.max_seq_len)
        throw snug::ConfigError("--seq " + std::to_string(o.seq) + " is longer than the context of " + o.init_from +
                                " (" + std::to_string(m.config.max_seq_len) + ")");
    return m;
}

// ---- what a run is, for the state file -----------------------------------------------

// The options a resumed run must share with the run that saved the state.
// The rest may change on resume: steps, schedule, evaluation, files, and the
// checkpoint policy (recomputation gives the same gradients bit for bit, so
// a run may move to a smaller card with --checkpoint auto and continue).
// The optimizer's settings are checked by load_training_state itself.
inline nlohmann::json run_identity(const Options& o, const snug::GPTConfig& c) {
    return {{"layers", c.n_layer},   {"heads", c.n_head},       {"channels", c.channels},
            {"vocab", c.vocab_size}, {"context", c.max_seq_len}, {"precision", o.precision},
            {"batch", o.batch},      {"seq", o.seq},             {"accum", o.accum},
            {"data", o.data},        {"val", o.val},             {"alphabet", o.alphabet}};
}

// Throws ConfigError naming the first option that differs from the saved run's.
inline void check_resume_identity(const std::string& path, const std::string& saved_text, const nlohmann::json& now) {
    nlohmann::json saved;
    try {
        saved = nlohmann::json::parse(saved_text);
    } catch (const nlohmann::json::exception&) {
        throw snug::FileError(path + ": its run description is not JSON; was it written by train_gpt?");
    }
    for (const auto& [key, value] : now.items()) {
        if (!saved.contains(key))
            throw snug::ConfigError("--resume " + path + ": the saved run does not record '" + key + "'");
        if (saved[key] != value)
            throw snug::ConfigError("--resume " + path + ": " + key + " was " + saved[key].dump() +
                                    " in the saved run but is " + value.dump() + " now; resume with the same value");
    }
}

// ---- one run -----------------------------------------------------------------------

// What a run measured: the ladder reads it; train_gpt prints it.
struct RunResult {
    int exit_code = 0;              // 0 done, 1 numerics, 3 out of the memory budget, 130 stopped by Ctrl-C
    bool fit = true;                // false: OutOfMemory (out_of_memory says where)
    std::string out_of_memory;      // the tracker's breakdown
    bool interrupted = false;
    std::vector<snug::StepRecord> records;
    snug::RunSummary summary;
    std::optional<double> first_val_loss;
    std::string recompute_plan;
    snug::MemoryBreakdown peak_bytes{};  // each category's own peak
    snug::MemoryBreakdown at_peak{};     // the categories at the moment of the total's peak (they sum to it)
    std::size_t peak_total = 0;
    std::size_t driver_peak = 0;         // CUDA: the driver's used memory for this run (Session); 0 on the host
};

template <class Precision>
constexpr bool is_16_bit = sizeof(typename Precision::compute_type) < 4;

inline std::string describe_plan(std::span<const snug::Recompute> plan) {
    std::string out;
    for (std::size_t i = 0; i < plan.size(); ++i) {
        if (i > 0) out += ' ';
        out += snug::recompute_name(plan[i]);
    }
    return out;
}

// cuBLASLt's workspace on the GPU (the planner counts it); none on the host.
inline std::size_t backend_workspace_bytes([[maybe_unused]] const DeviceInfo& device) {
#if defined(SNUG_CUDA_BACKEND)
    if (device.cuda) return snug::cuda::Blas::workspace_bytes_for_current_device();
#endif
    return 0;
}

// The memory planner's view of a run (snug/train/planner.hpp): what train()
// below allocates for the options' precision and shapes, before a recompute
// plan is chosen (the input snug::activation_budget takes).
inline snug::MemoryPlanInput plan_base(const Options& o, const snug::GPTConfig& config, std::size_t backend_workspace) {
    snug::MemoryPlanInput in;
    in.model = config;
    in.precision = snug::parse_precision_kind(o.precision);
    in.micro_batch = o.batch;
    in.seq = o.seq;
    in.accumulation = o.accum;
    in.backend_workspace = backend_workspace;
    in.sampling_window = !o.quiet && o.sample > 0 ? config.max_seq_len : 0;
    return in;
}

// plan_base with the options' checkpoint policy (--checkpoint auto: the plan
// checkpoint::Budget picks for the budget).
inline snug::MemoryPlanInput plan_input(const Options& o, const snug::GPTConfig& config, std::size_t backend_workspace) {
    snug::MemoryPlanInput in = plan_base(o, config, backend_workspace);
    if (o.checkpoint_kind != CheckpointKind::automatic) {
        in.recompute = snug::recompute_plan_for(o.checkpoint, config.n_layer);
    } else if (o.budget_bytes) {
        const std::size_t bytes = snug::activation_budget(in, *o.budget_bytes);
        in.recompute = snug::plan_recompute(snug::checkpoint::Budget(bytes), config, in.precision, o.batch, o.seq);
    }
    return in;
}

// Before training: the predicted peak, the memory per sequence, and the
// largest micro-batch the budget allows.
inline void print_memory_outlook(const Options& o, const snug::GPTConfig& config, const DeviceInfo& device) {
    std::printf("%s", snug::memory_forecast(plan_input(o, config, backend_workspace_bytes(device)), o.budget_bytes).c_str());
}

// The model's vocabulary without reading the data (for --plan).
inline int data_vocab(const Options& o) {
    if (o.data == "builtin") {
        snug::data::SyntheticCorpusConfig c;
        c.alphabet = o.alphabet;
        return snug::data::SyntheticCorpus(c).vocab_size();
    }
    if (o.data.rfind("tokens:", 0) == 0) return gpt2_vocab;
    return snug::data::byte_vocab_size;
}

// --plan: for the budget, the fastest configuration that fits (the order of
// operations: the largest micro-batch, accumulation up to the wanted batch of
// --batch x --accum sequences, the cheapest checkpoint policy), and the
// largest model of the shape's depth family. Nothing is allocated.
inline int print_plan(const Options& o, const snug::GPTConfig& shape, const DeviceInfo& device) {
    if (!o.budget_bytes) throw snug::ConfigError("--plan needs a memory budget (--vram-budget 12GiB, say), not 'none'");
    snug::GPTConfig config;
    if (o.init_from.empty()) {
        config = shape.with_vocab(o.vocab != 0 ? o.vocab : data_vocab(o)).with_context(o.seq);
    } else {
        config = read_model_file(o.init_from).config;
    }
    config.validate();
    const std::size_t budget = *o.budget_bytes;
    const snug::MemoryPlanInput in = plan_input(o, config, backend_workspace_bytes(device));
    std::printf("device: %s; budget %s\n", device.description.c_str(), snug::format_bytes(budget).c_str());
    std::printf("model: %d layers, %d heads, %d channels, context %d, vocab %d (%.2fM parameters), %s\n",
                config.n_layer, config.n_head, config.channels, config.max_seq_len, config.vocab_size,
                static_cast<double>(config.num_parameters()) / 1e6, o.precision.c_str());
    std::printf("\nas asked (micro-batch %d x %d, checkpoint %s):\n%s%s", o.batch, o.accum, o.checkpoint.c_str(),
                snug::memory_forecast(in, budget).c_str(), snug::predict_memory(in).report().c_str());
    const int wanted = o.batch * o.accum;
    std::printf("\nfastest configuration for %d sequences of %d tokens per update:\n%s", wanted, o.seq,
                snug::plan_for_budget(in, wanted, budget).report().c_str());
    snug::MemoryPlanInput one = in;
    one.micro_batch = 1;
    one.accumulation = 1;
    std::printf("\nlargest model of the family (L = d, C = 64 d, NH = d) that fits at micro-batch 1:\n%s",
                snug::largest_model_that_fits(snug::gpt_depth_family(config), one, budget).report().c_str());
    return 0;
}

// The fp32 weights of a model being trained: the optimizer's master copy for
// 16-bit types, the parameters themselves for fp32.
template <class Step, class Dev>
std::vector<float> master_weights(Step& step, const Dev& dev) {
    const std::int64_t P = step.model().num_parameters();
    std::vector<float> w(static_cast<std::size_t>(P));
    if constexpr (std::is_same_v<typename Step::Act, float>)
        download(dev, w.data(), step.model().parameters(), P);
    else
        download(dev, w.data(), step.optimizer().master(), P);
    return w;
}

// The model files asked for at the end: --save-model (llm.c) and --export-hf.
inline void write_model_files(const Options& o, const snug::GPTConfig& config, const std::vector<float>& weights) {
    if (!o.save_model.empty()) {
        const auto version = o.model_dtype == "bf16" ? snug::io::LlmcVersion::bf16 : snug::io::LlmcVersion::fp32;
        snug::io::write_llmc_model(o.save_model, config, weights, version);
        std::printf("model: %s (llm.c, version %d, %s)\n", o.save_model.c_str(), static_cast<int>(version),
                    o.model_dtype.c_str());
    }
    if (!o.export_hf.empty()) {
        snug::io::export_hf_gpt2(o.export_hf, config, weights);
        std::printf("model: %s/model.safetensors + config.json (Hugging Face GPT-2)\n", o.export_hf.c_str());
    }
}

template <class Dev, class Precision, class Checkpoint>
RunResult train(const Options& o, const Data& data, const ModelSource& source, const DeviceInfo& device,
                const snug::data::Tokenizer* tokenizer) {
    using Model = snug::GPT<typename Precision::compute_type, Dev>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;
    const snug::GPTConfig& config = source.config;
    const int B = o.batch, T = o.seq, n = o.accum;
    const std::int64_t BT = std::int64_t{B} * T;
    RunResult result;
    Session<Dev> s(o.budget_bytes);
    try {
        Model model(config, s.tracker);
        model.load_weights(s.ctx.device, source.weights);
        snug::Buffer<std::int32_t, Dev> tokens_dev(s.tracker, snug::MemoryCategory::workspace,
                                                   static_cast<std::size_t>(n * BT), "token ids");
        snug::Buffer<std::int32_t, Dev> targets_dev(s.tracker, snug::MemoryCategory::workspace,
                                                    static_cast<std::size_t>(n * BT), "target ids");

        Checkpoint checkpoint{};
        if constexpr (std::is_same_v<Checkpoint, snug::checkpoint::Budget>) {
            // What is left for activations once everything else the planner
            // predicts is counted; no memory budget: no limit.
            std::size_t bytes = std::numeric_limits<std::size_t>::max();
            if (o.budget_bytes) bytes = snug::activation_budget(plan_base(o, config, s.backend_workspace()), *o.budget_bytes);
            checkpoint = snug::checkpoint::Budget(bytes);
            if (!o.quiet)
                std::printf("checkpoint auto: %s for activations\n",
                            o.budget_bytes ? snug::format_bytes(bytes).c_str() : "no memory budget, no limit");
        }
        snug::TrainConfig tc;
        tc.adamw.lr = o.lr;
        tc.adamw.weight_decay = o.weight_decay;
        tc.max_grad_norm = o.clip;
        Step step(model, s.tracker, s.ctx.device, source.weights, tc, {}, snug::accumulate::Steps(n), checkpoint);

        const snug::LrSchedule schedule{o.lr, o.warmup, o.steps, o.min_lr_frac};
        schedule.validate();
        snug::data::BatchLoader train_loader(data.train, B, T, "training data");
        snug::data::BatchLoader val_loader(data.val, B, T, "validation data");
        std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(n * BT)), host_targets(host_tokens.size());
        std::vector<snug::MicroBatch> batches;
        for (int m = 0; m < n; ++m) batches.push_back({tokens_dev.data() + m * BT, targets_dev.data() + m * BT});

        // --resume: weights, master weights, moments, scaler, data position, step.
        const nlohmann::json identity = run_identity(o, config);
        std::int64_t first_step = 0;
        double wall_offset = 0.0;
        if (!o.resume.empty()) {
            const snug::TrainingProgress p = snug::load_training_state(o.resume, step, s.ctx.device);
            check_resume_identity(o.resume, p.run_config, identity);
            first_step = p.step;
            wall_offset = p.wall_clock_seconds;
            train_loader.set_position(p.train_position);
            s.ctx.seed = p.seed;
            s.ctx.rng_offset = p.rng_offset;
            if (!o.quiet)
                std::printf("resumed from %s at update %lld (%.1f s of training so far)\n", o.resume.c_str(),
                            static_cast<long long>(first_step), wall_offset);
            if (first_step >= o.steps)
                throw snug::ConfigError("--resume " + o.resume + ": the saved run already did " +
                                        std::to_string(first_step) + " updates; ask for more with --steps");
        }
        const std::string state_path = o.state_path();
        auto save_state = [&](std::int64_t done, double wall) {
            if (state_path.empty()) return;
            snug::TrainingProgress p;
            p.step = done;
            p.tokens = done * n * BT;
            p.train_position = train_loader.position();
            p.seed = s.ctx.seed;
            p.rng_offset = s.ctx.rng_offset;
            p.wall_clock_seconds = wall;
            p.run_config = identity.dump();
            snug::save_training_state(state_path, step, s.ctx.device, p);
        };

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
        if (!o.out.empty()) jsonl.emplace(std::filesystem::path(o.out) / "metrics.jsonl", /*append=*/!o.resume.empty());
        const bool live = !o.quiet && stdout_is_terminal();
        snug::ProgressDisplay display(stdout, live, o.quiet ? std::numeric_limits<std::int64_t>::max()
                                                             : std::max(1, o.steps / 20));
        const auto peak = snug::peak_flops(device.name, Precision::name);
        const double flops_per_token = config.flops_per_token(T);

        // The first evaluation comes before the first update: it runs under
        // the plan the update will use (TrainStep applies it at its first step).
        model.set_recompute(snug::plan_recompute(checkpoint, config, snug::precision_kind<Precision>(), B, T));
        if (first_step == 0) {
            result.first_val_loss = evaluate();
            if (!o.quiet) display.print("step 0: " + val_text(*result.first_val_loss));
        }

        result.records.reserve(static_cast<std::size_t>(o.steps - first_step));
        using clock = std::chrono::steady_clock;
        const auto start = clock::now();
        auto wall = [&] { return wall_offset + std::chrono::duration<double>(clock::now() - start).count(); };
        for (std::int64_t i = first_step; i < o.steps; ++i) {
            const float lr = schedule(static_cast<int>(i));
            const auto t0 = clock::now();
            for (int m = 0; m < n; ++m) {
                train_loader.next(host_tokens.data() + m * BT, host_targets.data() + m * BT);
                upload(s.ctx.device, tokens_dev.data() + m * BT, host_tokens.data() + m * BT, BT);
                upload(s.ctx.device, targets_dev.data() + m * BT, host_targets.data() + m * BT, BT);
            }
            const snug::StepResult r = step.step(s.ctx, batches, B, T, lr);
            const auto t1 = clock::now();
            result.driver_peak = std::max(result.driver_peak, s.driver_used_by_session());
            if (i == first_step) {
                result.recompute_plan = describe_plan(step.recompute_plan());
                if (!o.quiet) std::printf("recompute plan: %s\n", result.recompute_plan.c_str());
            }

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
            rec.hardware_flops = rec.model_flops + snug::recompute_flops_per_token(config, T, step.recompute_plan()) *
                                                       static_cast<double>(r.tokens);
            rec.peak_flops_per_second = peak;
            for (snug::MemoryCategory c : snug::all_memory_categories)
                rec.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
            rec.peak_total = s.tracker.peak_total();
            if ((i + 1) % o.eval_every == 0 || i + 1 == o.steps) rec.val_loss = evaluate();
            rec.wall_clock = wall();
            result.records.push_back(rec);

            if (jsonl) jsonl->write(snug::to_json(rec));
            if (!o.quiet) display.update(rec.step, snug::progress_line(rec, o.steps));
            if (rec.val_loss && !o.quiet) display.print("step " + std::to_string(rec.step) + ": " + val_text(*rec.val_loss));
            if (!std::isfinite(r.loss) && !Precision::has_loss_scaler) {
                display.finish();
                std::fprintf(stderr, "train_gpt: the training loss is %f at update %lld; stopping (try a lower --lr)\n",
                             static_cast<double>(r.loss), static_cast<long long>(i + 1));
                result.exit_code = 1;
                break;
            }
            const bool signalled = stop_requested.load();
            const bool stopping = signalled || (o.stop_after > 0 && i + 1 == o.stop_after && i + 1 < o.steps);
            if (stopping || (o.save_every > 0 && (i + 1) % o.save_every == 0 && i + 1 < o.steps)) {
                save_state(i + 1, rec.wall_clock);
                if (stopping) {
                    display.finish();
                    std::printf("stopped %s after update %lld; %s\n", signalled ? "by a signal" : "as asked (--stop-after)",
                                static_cast<long long>(i + 1),
                                state_path.empty() ? "no state saved (no --out)"
                                                   : ("state saved to " + state_path + " (continue with --resume " +
                                                      state_path + ")").c_str());
                    result.interrupted = true;
                    result.exit_code = signalled ? 130 : 0;
                    break;
                }
            }
        }
        display.finish();
        for (snug::MemoryCategory c : snug::all_memory_categories)
            result.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
        result.at_peak = s.tracker.peak_breakdown();
        result.peak_total = s.tracker.peak_total();
        result.summary = snug::summarize(
            result.records, o.flops_budget > 0.0 ? std::optional<double>(o.flops_budget) : std::nullopt, data.floor);
        result.summary.first_val_loss = result.first_val_loss;
        if (result.interrupted || result.exit_code != 0) return result;

        save_state(o.steps, wall());
        if (o.quiet) return result;
        std::printf("\n%s", snug::render_summary(result.summary).c_str());
        if (step.skipped_steps() > 0)
            std::printf("  skipped updates          %lld (non-finite gradients)\n",
                        static_cast<long long>(step.skipped_steps()));
        if (!state_path.empty()) std::printf("state: %s\n", state_path.c_str());
        if (!o.out.empty()) write_summary_json(o, result, data, device, Precision::name);
        if (!o.save_model.empty() || !o.export_hf.empty())
            write_model_files(o, config, master_weights(step, s.ctx.device));

        if (o.sample > 0) print_sample(model, s, o, data, tokenizer);
    } catch (const snug::OutOfMemory& e) {
        result.fit = false;
        result.exit_code = 3;
        result.out_of_memory = e.what();
        for (snug::MemoryCategory c : snug::all_memory_categories)
            result.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
        result.at_peak = s.tracker.peak_breakdown();
        result.peak_total = s.tracker.peak_total();
    }
    return result;
}

// summary.json: the summary table's numbers and the run's configuration.
inline void write_summary_json(const Options& o, const RunResult& r, const Data& data, const DeviceInfo& device,
                               const char* precision) {
    const snug::RunSummary& summary = r.summary;
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    const nlohmann::json j = {
        {"steps", summary.steps},
        {"tokens", summary.tokens},
        {"wall_clock_seconds", summary.wall_clock},
        {"median_tokens_per_second", opt(summary.median_tokens_per_second)},
        {"median_mfu", opt(summary.median_mfu)},
        {"final_train_loss", opt(summary.final_train_loss)},
        {"first_val_loss", opt(r.first_val_loss)},
        {"final_val_loss", opt(summary.final_val_loss)},
        {"loss_floor", opt(data.floor)},
        {"total_model_flops", summary.total_model_flops},
        {"flops_budget", summary.flops_budget},
        {"loss_at_equal_flops", opt(summary.loss_at_equal_flops)},
        {"peak_bytes_total", r.peak_total},
        {"device", device.description},
        {"precision", precision},
        {"checkpoint", o.checkpoint},
        {"recompute_plan", r.recompute_plan},
        {"micro_batch", o.batch},
        {"seq", o.seq},
        {"accumulation", o.accum},
    };
    const std::string text = j.dump(2) + "\n";
    snug::io::atomic_write(std::filesystem::path(o.out) / "summary.json",
                           [&](snug::io::FileWriter& w) { w.write(text.data(), text.size()); });
    std::printf("metrics: %s/metrics.jsonl, %s/summary.json\n", o.out.c_str(), o.out.c_str());
}

// The sample at the end: from --prompt (byte data) or the start of the
// validation data, decoded by the llm.c tokenizer when token data has one.
template <class Model, class Dev>
void print_sample(Model& model, Session<Dev>& s, const Options& o, const Data& data,
                  const snug::data::Tokenizer* tokenizer) {
    std::vector<std::int32_t> prompt;
    if (!o.prompt.empty()) {
        if (!data.bytes)
            throw snug::ConfigError("--prompt needs byte-level data (builtin or text:); token data samples "
                                    "start from the validation tokens");
        for (const char c : o.prompt) prompt.push_back(static_cast<unsigned char>(c));
    } else {
        const std::size_t k = std::min<std::size_t>(8, data.val.size());
        prompt.assign(data.val.begin(), data.val.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const auto out = generate(model, s, prompt, o.sample, o, data.vocab);
    const std::string shown_prompt = render_tokens(prompt, data.bytes, tokenizer);
    const bool spaced = !data.bytes && tokenizer == nullptr;
    const std::string text = shown_prompt + (spaced ? " " : "") + render_tokens(out, data.bytes, tokenizer);
    std::printf("\nsample (temperature %.2f, top-k %s), prompt \"%s\":\n%s\n", static_cast<double>(o.temperature),
                o.top_k > 0 ? std::to_string(o.top_k).c_str() : "all", shown_prompt.c_str(), text.c_str());
}

// --eval-only: the validation loss of a model (--init-from, or a fresh one)
// over --eval-batches windows of the validation data; nothing is trained.
template <class Dev, class Act>
int evaluate_only(const Options& o, const Data& data, const ModelSource& source, const snug::data::Tokenizer* tokenizer) {
    const int B = o.batch, T = o.seq;
    const std::int64_t BT = std::int64_t{B} * T;
    Session<Dev> s(o.budget_bytes);
    snug::GPT<Act, Dev> model(source.config, s.tracker);
    model.load_weights(s.ctx.device, source.weights);
    snug::Buffer<std::int32_t, Dev> tokens_dev(s.tracker, snug::MemoryCategory::workspace, static_cast<std::size_t>(BT),
                                               "token ids");
    snug::Buffer<std::int32_t, Dev> targets_dev(s.tracker, snug::MemoryCategory::workspace,
                                                static_cast<std::size_t>(BT), "target ids");
    snug::data::BatchLoader loader(data.val, B, T, "validation data");
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(BT)), targets(tokens.size());
    // Whole windows only, each once: at most --eval-batches of them.
    const std::int64_t windows = std::min<std::int64_t>(o.eval_batches, (std::int64_t(data.val.size()) - 1) / BT);
    double sum = 0.0;
    for (std::int64_t i = 0; i < windows; ++i) {
        loader.next(tokens.data(), targets.data());
        upload(s.ctx.device, tokens_dev.data(), tokens.data(), BT);
        upload(s.ctx.device, targets_dev.data(), targets.data(), BT);
        sum += model.evaluate(s.ctx, tokens_dev.data(), targets_dev.data(), B, T);
    }
    const double loss = sum / static_cast<double>(windows);
    std::printf("eval: loss %.4f nats (perplexity %.2f) over %lld tokens (%lld windows of %d x %d)",
                loss, std::exp(loss), static_cast<long long>(windows * BT), static_cast<long long>(windows), B, T);
    if (data.floor) std::printf(", floor %.4f", *data.floor);
    std::printf("; peak memory %s\n", snug::format_bytes(s.tracker.peak_total()).c_str());
    if (o.sample > 0) print_sample(model, s, o, data, tokenizer);
    return std::isfinite(loss) ? 0 : 1;
}

template <class Dev, class Precision>
RunResult dispatch_checkpoint(const Options& o, const Data& data, const ModelSource& source, const DeviceInfo& device,
                              const snug::data::Tokenizer* tokenizer) {
    namespace ck = snug::checkpoint;
    switch (o.checkpoint_kind) {
        case CheckpointKind::none: return train<Dev, Precision, ck::None>(o, data, source, device, tokenizer);
        case CheckpointKind::full: return train<Dev, Precision, ck::Full>(o, data, source, device, tokenizer);
        case CheckpointKind::every2: return train<Dev, Precision, ck::EveryNth<2>>(o, data, source, device, tokenizer);
        case CheckpointKind::every3: return train<Dev, Precision, ck::EveryNth<3>>(o, data, source, device, tokenizer);
        case CheckpointKind::every4: return train<Dev, Precision, ck::EveryNth<4>>(o, data, source, device, tokenizer);
        case CheckpointKind::selective: return train<Dev, Precision, ck::Selective>(o, data, source, device, tokenizer);
        case CheckpointKind::automatic: return train<Dev, Precision, ck::Budget>(o, data, source, device, tokenizer);
    }
    throw snug::ConfigError("unknown --checkpoint kind");
}

// One training run on device Dev with the options' precision and checkpoint policy.
template <class Dev>
RunResult run_training(const Options& o, const Data& data, const ModelSource& source, const DeviceInfo& device,
                       const snug::data::Tokenizer* tokenizer = nullptr) {
    if (o.precision == "fp32") return dispatch_checkpoint<Dev, snug::precision::Fp32>(o, data, source, device, tokenizer);
    if (o.precision == "bf16") return dispatch_checkpoint<Dev, snug::precision::Bf16>(o, data, source, device, tokenizer);
    return dispatch_checkpoint<Dev, snug::precision::Fp16<snug::DynamicLossScaler>>(o, data, source, device, tokenizer);
}

template <class Dev>
int run_evaluation(const Options& o, const Data& data, const ModelSource& source, const snug::data::Tokenizer* tokenizer) {
    if (o.precision == "fp32") return evaluate_only<Dev, float>(o, data, source, tokenizer);
    if (o.precision == "bf16") return evaluate_only<Dev, snug::bfloat16>(o, data, source, tokenizer);
    return evaluate_only<Dev, snug::half>(o, data, source, tokenizer);
}

}  // namespace train_gpt
