// The fuzz targets' bodies: for each file snug reads, how an input's bytes
// become that file and which reader reads it. The libFuzzer executables
// (tests/fuzz/fuzz_target.cpp), the seed maker (tests/fuzz/make_seeds.cpp)
// and the regression test (tests/host/fuzz_regression_test.cpp) share these
// definitions, so a committed finding replays exactly as the fuzzer saw it.
//
// Each target writes the input to a file in a scratch directory and calls the
// real reader on it. Exceptions are left to the caller: the contract is that
// every input either loads or throws snug::Error (or a subclass) whose message
// names the file it read.
//
// Input formats (a target's input is the file itself unless said otherwise):
//   llmc_model   an llm.c model file                     -> io::read_llmc_model
//   token_file   an llm.c token file, or any text        -> data::read_token_file (vocab 50257, then 256)
//                                                           and data::read_text_file
//   tokenizer    an llm.c tokenizer file                 -> data::Tokenizer, then decode() of every id
//   safetensors  a safetensors file                      -> io::SafetensorsFile, then values<float>,
//                                                           values<int32>, meta() of what it holds
//   hf_import    config.json, the line hf_split, then    -> io::import_hf_gpt2 of the directory
//                model.safetensors (without the line:
//                config.json alone, no weights file)
//   hf_llama     as hf_import                           -> io::import_hf_llama of the directory
//   state_file   one mode byte, then a training-state    -> read_training_state_info, then
//                file; mode bit 0 set: the target first     load_training_state into a tiny GPT step
//                rewrites every CRC-32 the file has, so     of the file's dtype (fp32, bf16, fp16 with a
//                the fuzzer reaches what lies behind them   dynamic or a static loss scaler), or a
//                                                           tiny Llama's where it names a model identity
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/data/text_file.hpp"
#include "snug/data/token_file.hpp"
#include "snug/data/tokenizer.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/hf_llama.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/llama.hpp"
#include "snug/train/state_file.hpp"

namespace snug::fuzz {

using Bytes = std::span<const unsigned char>;

// Where a target writes its files: one directory, the same names every time.
class Scratch {
public:
    explicit Scratch(std::filesystem::path dir) : dir_(std::move(dir)) { std::filesystem::create_directories(dir_); }

    const std::filesystem::path& dir() const { return dir_; }

    // Writes `bytes` to dir/name (replacing it) and returns the path.
    std::filesystem::path write(const std::string& name, Bytes bytes) const {
        const std::filesystem::path p = dir_ / name;
        std::FILE* f = std::fopen(p.c_str(), "wb");
        if (f == nullptr) throw std::runtime_error("fuzz scratch: cannot write " + p.string());
        const bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
        if (std::fclose(f) != 0 || !ok) throw std::runtime_error("fuzz scratch: write failed: " + p.string());
        return p;
    }
    void remove(const std::string& name) const {
        std::error_code ec;
        std::filesystem::remove(dir_ / name, ec);
    }

private:
    std::filesystem::path dir_;
};

// A broken contract: an error without a message, or one that does not name
// the file it is about. Not a snug::Error, so nothing mistakes it for one.
class ContractViolation : public std::logic_error {
public:
    using std::logic_error::logic_error;
};

// Checks what the contract asks of an error snug threw while reading `file`.
inline void check_error(const Error& e, const std::filesystem::path& file) {
    const std::string_view what = e.what();
    if (what.empty()) throw ContractViolation("snug::Error with an empty message while reading " + file.string());
    if (what.find(file.string()) == std::string_view::npos)
        throw ContractViolation("snug::Error that does not name the file " + file.string() + ": " + std::string(what));
}

// Runs f(); a snug::Error from it is checked and swallowed (so the target can
// go on with another reader), anything else propagates.
template <class F>
void tolerate(const std::filesystem::path& file, F&& f) {
    try {
        f();
    } catch (const Error& e) {
        check_error(e, file);
    }
}

// ---- the shapes the seeds use -------------------------------------------------------

// 1 layer, 1 head, 4 channels, vocabulary 8, context 4: 300 parameters, so a
// whole model file is a couple of KiB.
inline GPTConfig tiny_gpt() {
    GPTConfig c;
    c.vocab_size = 8;
    c.padded_vocab_size = 8;
    c.max_seq_len = 4;
    c.n_layer = 1;
    c.n_head = 1;
    c.channels = 4;
    return c;
}

// ---- llm.c files ---------------------------------------------------------------------

inline void llmc_model(Bytes in, const Scratch& s) {
    const io::LlmcModel m = io::read_llmc_model(s.write("model.bin", in));
    (void)m;
}

inline void token_file(Bytes in, const Scratch& s) {
    const std::filesystem::path p = s.write("tokens.bin", in);
    // The text reader takes any non-empty file; the token reader checks every id.
    tolerate(p, [&] { (void)data::read_token_file(p, 50257); });
    tolerate(p, [&] { (void)data::read_token_file(p, 256); });
    (void)data::read_text_file(p);
}

inline void tokenizer(Bytes in, const Scratch& s) {
    const data::Tokenizer t(s.write("tokenizer.bin", in));
    std::size_t total = 0;
    for (int id = 0; id < t.vocab_size(); ++id) total += t.decode(id).size();
    (void)total;
    (void)t.eot_token();
}

// ---- safetensors and Hugging Face directories ----------------------------------------

inline void safetensors(Bytes in, const Scratch& s) {
    const std::filesystem::path p = s.write("model.safetensors", in);
    const io::SafetensorsFile f(p);
    for (const auto& [name, t] : f.tensors()) {
        // Each dtype reads as float, or as int32 (I32), and as nothing else.
        tolerate(p, [&] { (void)f.values<float>(name); });
        tolerate(p, [&] { (void)f.values<std::int32_t>(name); });
    }
    for (const auto& [key, value] : f.metadata()) (void)f.meta(key);
}

// Separates config.json from model.safetensors in a hf_import input.
inline constexpr std::string_view hf_split = "\n#snug-fuzz model.safetensors#\n";

// Writes a hf_import / hf_llama input into the scratch directory as
// config.json and (after hf_split) model.safetensors.
inline void write_hf_directory(Bytes in, const Scratch& s) {
    const std::string_view all(reinterpret_cast<const char*>(in.data()), in.size());
    const std::size_t at = all.find(hf_split);
    const Bytes config = at == std::string_view::npos ? in : in.first(at);
    s.write(io::hf_config_file, config);
    if (at == std::string_view::npos)
        s.remove(io::hf_weights_file);
    else
        s.write(io::hf_weights_file, in.subspan(at + hf_split.size()));
}

inline void hf_import(Bytes in, const Scratch& s) {
    write_hf_directory(in, s);
    const io::HFModel m = io::import_hf_gpt2(s.dir());
    (void)m;
}

inline void hf_llama(Bytes in, const Scratch& s) {
    write_hf_directory(in, s);
    const io::HFLlama m = io::import_hf_llama(s.dir());
    (void)m;
}

// ---- training-state files --------------------------------------------------------------

// A tiny GPT and its TrainStep, for one precision policy.
template <class Precision>
struct TinyStep {
    using Act = typename Precision::compute_type;
    using Model = GPT<Act, Host>;
    using Step = TrainStep<Model, Precision, accumulate::None, checkpoint::None>;

    MemoryTracker tracker;
    Host device;
    Model model;
    Step step;

    explicit TinyStep(Precision precision = {})
        : model(tiny_gpt(), tracker),
          step(model, tracker, device, gpt_initial_weights(tiny_gpt(), 1), TrainConfig{}, std::move(precision)) {
        model.load_weights(device, gpt_initial_weights(tiny_gpt(), 1));
    }
};

// A tiny Llama's fp32 step: its state files carry the model's identity
// (family, config fields, tensors), which the reader parses too.
struct TinyLlamaStep {
    using Model = Llama<float, Host>;
    using Step = TrainStep<Model, precision::Fp32, accumulate::None, checkpoint::None>;

    MemoryTracker tracker;
    Host device;
    Model model;
    Step step;

    TinyLlamaStep()
        : model(make_llama_config(8, 4, 1, 4, 2, 8), tracker),
          step(model, tracker, device, model.initial_weights(1), TrainConfig{}, precision::Fp32{}) {
        model.load_weights(device, model.initial_weights(1));
    }
};

// The kinds of step a state file may belong to, built once.
struct TinySteps {
    TinyStep<precision::Fp32> fp32;
    TinyStep<precision::Bf16> bf16;
    TinyStep<precision::Fp16<DynamicLossScaler>> fp16_dynamic;
    TinyStep<precision::Fp16<StaticLossScaler>> fp16_static;
    TinyLlamaStep llama;
};

inline TinySteps& tiny_steps() {
    static TinySteps steps;
    return steps;
}

namespace detail {

inline void put_crc(std::vector<unsigned char>& b, std::size_t at, std::uint32_t crc) {
    for (std::size_t i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(crc >> (8 * i));
}

inline std::uint32_t get_u32(const std::vector<unsigned char>& b, std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 4; i-- > 0;) v = (v << 8) | b[at + i];
    return v;
}

}  // namespace detail

inline void state_file(Bytes in, const Scratch& s) {
    const bool fix_crcs = !in.empty() && (in[0] & 1u) != 0;
    std::vector<unsigned char> b(in.begin() + (in.empty() ? 0 : 1), in.end());
    const std::string name = "state.snug";
    if (fix_crcs && b.size() >= 32) {
        // The JSON header's CRC (when its length stays inside the file), then the fixed header's.
        const std::uint64_t h = detail::get_u32(b, 12);
        if (32 + h <= b.size()) detail::put_crc(b, 24, io::Crc32::of(b.data() + 32, static_cast<std::size_t>(h)));
        detail::put_crc(b, 28, io::Crc32::of(b.data(), 28));
    }
    std::filesystem::path p = s.write(name, b);
    const TrainingStateInfo info = read_training_state_info(p);
    if (fix_crcs) {
        for (const StateSection& sec : info.sections)
            detail::put_crc(b, static_cast<std::size_t>(sec.offset + sec.bytes),
                            io::Crc32::of(b.data() + sec.offset, static_cast<std::size_t>(sec.bytes)));
        p = s.write(name, b);
    }
    TinySteps& t = tiny_steps();
    StateFileOptions small;
    small.chunk_bytes = 256;  // several chunks per section
    if (info.identity) {
        (void)load_training_state(p, t.llama.step, t.llama.device, small);
        return;
    }
    switch (info.dtype) {
        case DType::bf16: (void)load_training_state(p, t.bf16.step, t.bf16.device, small); break;
        case DType::f16:
            if (info.loss_scaler_kind == "static")
                (void)load_training_state(p, t.fp16_static.step, t.fp16_static.device, small);
            else
                (void)load_training_state(p, t.fp16_dynamic.step, t.fp16_dynamic.device, small);
            break;
        default: (void)load_training_state(p, t.fp32.step, t.fp32.device, small); break;
    }
}

// ---- the list ---------------------------------------------------------------------------

struct Target {
    const char* name;
    void (*run)(Bytes, const Scratch&);
};

inline constexpr Target targets[] = {
    {"llmc_model", llmc_model}, {"token_file", token_file}, {"tokenizer", tokenizer},
    {"safetensors", safetensors}, {"hf_import", hf_import},   {"hf_llama", hf_llama},
    {"state_file", state_file},
};

inline const Target* find_target(std::string_view name) {
    for (const Target& t : targets)
        if (name == t.name) return &t;
    return nullptr;
}

}  // namespace snug::fuzz
