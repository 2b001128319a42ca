// The training-state file: everything a run needs to continue bit for bit
// (working weights, fp32 master weights, AdamW moments and step count, the
// loss scaler, TrainStep's skipped-update count, the data and random-stream
// positions, the step and token counters), written by save_training_state()
// and read back into a TrainStep by load_training_state() (its checksum:
// io/crc32.hpp). This comment is the file format's specification.
//
// ---- Format, version 1 ----------------------------------------------------------
// Byte order: every integer is unsigned little-endian unless said otherwise;
// every section element is little-endian in its own type (f32: IEEE binary32,
// f16: IEEE binary16, bf16: the high 16 bits of a binary32).
// CRC-32: the zlib / PNG / ISO-HDLC CRC: reflected polynomial 0xEDB88320,
// initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF; CRC-32("123456789") = 0xCBF43926.
//
//   offset          bytes  field
//   0               8      magic: the ASCII bytes "SNUGTRST" (53 4E 55 47 54 52 53 54)
//   8               4      version: 1
//   12              4      header_bytes H: length of the JSON header, 2 <= H <= 2^24
//   16              8      file_bytes: size of the whole file in bytes
//   24              4      header_crc: CRC-32 of the H bytes of the JSON header
//   28              4      fixed_crc: CRC-32 of bytes [0, 28)
//   32              H      the JSON header: UTF-8 JSON text (RFC 8259), one object, below
//   32 + H                 zero bytes up to data_offset = round_up(32 + H, 64)
//   data_offset            the section records, back to back, in the order the
//                          header's "sections" lists them; record i starts at
//                          data_offset + sum over j < i of round_up(bytes_j + 4, 64),
//                          so every record starts at a multiple of 64:
//                            payload  bytes_i = count_i x element size bytes
//                            crc      4 bytes: CRC-32 of the payload
//                            padding  zero bytes up to the next multiple of 64
//   file_bytes = data_offset + sum over all sections of round_up(bytes_i + 4, 64)
//
// Magic and version keep these places in every version: a reader checks the
// magic, then the version, and interprets nothing else of a version it does
// not know. Padding bytes carry no information (writers write zeros, readers
// do not check them).
//
// The JSON header: exactly H bytes (no terminator, no padding inside), one
// object. A reader ignores keys it does not know. Floating-point values are
// JSON numbers that read back exactly as a double (a float field holds the
// double of the same value). Integers are exact and non-negative: seed,
// rng_offset and sampler_position in [0, 2^64), the other counters, counts,
// sizes and offsets in [0, 2^63), the GPT dimensions, steps, growth_tracker,
// growth_interval and accumulation_steps in [0, 2^31).
//   "model": {
//     "num_parameters": N, the model's parameter count (num_parameters())
//     "dtype":          the working weights' element type: "f32", "bf16" or "f16"
//     "precision":      the precision policy's name: "fp32", "bf16" or "fp16"
//     "gpt":            for a model whose config() is a GPTConfig, its shape:
//                       {"vocab_size", "padded_vocab_size", "max_seq_len",
//                        "n_layer", "n_head", "channels", "attention",
//                        "classifier_chunk"}; absent for other models ("attention",
//                       "flash", "cudnn" or "materialized", and "classifier_chunk", the head's
//                       tokens per chunk with 0 for automatic, are for information: a
//                       run may resume with others, which change only rounding)
//     "family", "config", "tensors": for a model with identity() (a CausalLM
//                       of any family, nn/model_identity.hpp): the family's
//                       name ("" where it names none), {"field": number, ...}
//                       (vocab_size, padded_vocab_size, max_seq_len, n_layer,
//                       then the family's fields), and [{"name", "shape": [dims]},
//                       ...] the registry's tensors in buffer order (1 to 4
//                       dimensions each, every one in [1, 2^62]); absent for a GPT
//                       and in files written before them (which load on the
//                       parameter count alone)
//   }
//   "optimizer": {
//     "name": "adamw",
//     "steps": updates applied so far (AdamW's bias-correction t), 0 .. 2^31-1
//     "beta1", "beta2", "eps", "weight_decay": its AdamWConfig (the learning
//     rate is the schedule's, not saved; files that still hold "lr" load),
//     "moments" ("fp32" | "bf16" | "int8"), "master" ("fp32" | "none"), "rounding_seed":
//     the state's storage (absent in older files: fp32, fp32, the default seed)
//   }
//   "max_grad_norm":      TrainConfig's clipping threshold (<= 0: no clipping)
//   "accumulation_steps": micro-batches per update (for the reader's information)
//   "checkpoint_policy":  the activation-checkpoint policy's name (for information;
//                         train_gpt's is "given": its plan, chosen from --checkpoint)
//   "recompute_plan":     the plan in force, one mode per block (for information)
//   "loss_scaler": null when the precision policy has none, else {
//     "kind": "dynamic" (DynamicLossScaler), "static" (StaticLossScaler) or "custom",
//     "scale", "growth_tracker", "skipped", "steps": its LossScalerState,
//     "config": for "dynamic" only: {"init_scale", "growth_factor",
//               "backoff_factor", "growth_interval"}
//   }
//   "skipped_steps": TrainStep's count of updates skipped for a non-finite gradient
//   "progress": {"step", "tokens", "train_position", "seed", "rng_offset",
//                "sampler_position", "wall_clock_seconds", "run_config"}:
//               the TrainingProgress below, field for field (run_config a string)
//   "sections": [{"name", "dtype", "count", "offset", "bytes"}, ...]: each record's
//               name, element type (as "model.dtype"), element count, start
//               relative to data_offset, and payload size in bytes
//
// The sections, in this order (N = model.num_parameters):
//   "weights"         N elements of model.dtype: the working weights, in the
//                     model's own order (llm.c's for a GPT)
//   "master_weights"  N f32: AdamW's master weights; present only when
//                     model.dtype is not f32 (fp32 weights are their own master)
//                     and optimizer.master is "fp32"
//   then AdamW's moments m and v, as optimizer.moments stores them:
//   "fp32", "bf16":
//     "first_moment"    N f32 (optimizer.moments "fp32") or bf16 ("bf16"): m
//     "second_moment"   N of the same type: v
//   "int8": the parameter groups with weight decay (the model's, in order; Q
//   parameters in all, each group cut into blocks of 256 from its own start:
//   B blocks in all) keep 8-bit codes and one absmax per block; the other
//   groups' N - Q parameters keep fp32 moments, group by group in order:
//     "first_moment_codes"    Q u8: bit 7 the sign, bits 0-6 an index into the
//                             first moment's code table
//     "first_moment_absmax"   B f32: the block's largest |m|
//     "second_moment_codes"   Q u8: an index into the second moment's table
//     "second_moment_absmax"  B f32: the block's largest v
//     "first_moment"          N - Q f32
//     "second_moment"         N - Q f32
//   A code's value is table[code] x absmax; the tables (value / absmax, each
//   ascending to 1) are defined in include/snug/ops/moment_quantization.hpp.
//   Where the state lived (on the device, or offloaded to the host) is not
//   recorded: the bytes are the same either way, and a state saved one way
//   resumes the other.
//
// Loading checks, in this order, and throws snug::FileError naming the file and
// the problem: the magic ("not a snug training-state file"), the version, the
// fixed header's checksum, the file size against file_bytes (a truncated file),
// the JSON header's checksum and content, the model's identity against the
// step's (family, config fields and tensors where the file has them, parameter
// count, dtype, precision, GPT shape, loss scaler kind and
// knobs, optimizer hyper-parameters and max_grad_norm: both values named), the
// section table, then every section's checksum. All of that happens before
// anything in the step is written, so a file that fails any check leaves the
// step exactly as it was.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/io/crc32.hpp"
#include "snug/io/file.hpp"
#include "snug/io/json_fields.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/model_identity.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/precision/loss_scaler.hpp"
#include "snug/train/train_step.hpp"

namespace snug {

static_assert(std::endian::native == std::endian::little,
              "snug/train/state_file.hpp writes sections as the host's bytes: it needs a little-endian host");

// Where a run stands besides what TrainStep owns; the trainer fills it before
// saving and applies it after loading.
struct TrainingProgress {
    std::int64_t step = 0;               // updates done (skipped ones included): the next LR-schedule index
    std::int64_t tokens = 0;             // training tokens consumed so far
    std::int64_t train_position = 0;     // the training BatchLoader's position()
    std::uint64_t seed = 0;              // Context::seed
    std::uint64_t rng_offset = 0;        // Context::rng_offset
    std::uint64_t sampler_position = 0;  // the text sampler's Generator::position()
    double wall_clock_seconds = 0.0;     // training time so far (finite, >= 0)
    std::string run_config;              // opaque UTF-8 text, e.g. the trainer's options as JSON
};

// Knobs of the streaming save and load.
struct StateFileOptions {
    // Host staging per transfer: at most this many bytes of a section are in
    // host memory at a time (at least one element).
    std::size_t chunk_bytes = std::size_t{16} << 20;
    // Save only: called after every chunk written, with bytes written so far
    // and the file's total. An exception from it abandons the save; the file
    // at `path` stays as it was.
    std::function<void(std::uint64_t written, std::uint64_t total)> on_progress;
    // Save only: the optimizer's buffers to write instead of the step's own
    // (whole, in host memory): a sharded optimizer's state gathered on the
    // writing rank (dist/sharded_state.hpp). Empty: the step's.
    std::vector<StateBuffer> optimizer_state;
};

// One section record of a training-state file.
struct StateSection {
    std::string name;
    DType dtype;
    std::int64_t count;    // elements
    std::uint64_t offset;  // absolute offset of the payload in the file
    std::uint64_t bytes;   // payload bytes (count x element size)
};

// A training-state file's header: what read_training_state_info() returns
// without touching any model (to print it, or to build the matching step).
struct TrainingStateInfo {
    std::uint32_t version = 0;
    std::uint64_t file_bytes = 0;
    std::int64_t num_parameters = 0;
    DType dtype = DType::f32;
    std::string precision;
    std::optional<GPTConfig> gpt;
    std::optional<ModelIdentity> identity;  // a CausalLM's family, config and tensors
    AdamWConfig adamw{};
    int optimizer_steps = 0;
    float max_grad_norm = 0.0f;
    int accumulation_steps = 1;
    std::string checkpoint_policy;
    std::string loss_scaler_kind;                            // empty: no loss scaler
    std::optional<LossScalerState> loss_scaler;              // present with a loss scaler
    std::optional<DynamicLossScalerConfig> dynamic_scaler;   // present for kind "dynamic"
    std::int64_t skipped_steps = 0;
    TrainingProgress progress;
    std::vector<StateSection> sections;
};

namespace detail::state_file {

inline constexpr unsigned char magic[8] = {'S', 'N', 'U', 'G', 'T', 'R', 'S', 'T'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::uint64_t fixed_bytes = 32;
inline constexpr std::uint64_t alignment = 64;
inline constexpr std::uint64_t max_header_bytes = std::uint64_t{1} << 24;

constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

template <class U>
void put_le(unsigned char* out, U v) {
    for (std::size_t i = 0; i < sizeof(U); ++i) out[i] = static_cast<unsigned char>((v >> (8 * i)) & 0xff);
}
template <class U>
U get_le(const unsigned char* in) {
    U v = 0;
    for (std::size_t i = sizeof(U); i-- > 0;) v = static_cast<U>((v << 8) | in[i]);
    return v;
}

inline std::string hex32(std::uint32_t v) {
    static constexpr char digits[] = "0123456789ABCDEF";
    std::string s = "0x";
    for (int i = 7; i >= 0; --i) s += digits[(v >> (4 * i)) & 0xf];
    return s;
}

// A section's name, type and count before it has a place in a file.
struct SectionSpec {
    std::string name;
    DType dtype;
    std::int64_t count;
};

// The records' places for the given data_offset.
inline std::vector<StateSection> layout(std::uint64_t data_offset, const std::vector<SectionSpec>& specs) {
    std::vector<StateSection> out;
    std::uint64_t at = data_offset;
    for (const SectionSpec& s : specs) {
        const std::uint64_t bytes = static_cast<std::uint64_t>(s.count) * dtype_size(s.dtype);
        out.push_back({s.name, s.dtype, s.count, at, bytes});
        at += round_up(bytes + 4, alignment);
    }
    return out;
}

inline std::uint64_t end_of(std::uint64_t data_offset, const std::vector<StateSection>& sections) {
    return sections.empty() ? data_offset : round_up(sections.back().offset + sections.back().bytes + 4, alignment);
}

// ---- what a TrainStep is, as the file describes it ----------------------------

template <class Model>
concept HasGPTConfig = requires(const Model& m) {
    { m.config() } -> std::convertible_to<const GPTConfig&>;
};

template <class Model>
concept HasModelIdentity = requires(const Model& m) {
    { m.identity() } -> std::convertible_to<ModelIdentity>;
};

template <class S>
constexpr const char* scaler_kind() {
    if constexpr (std::is_same_v<S, DynamicLossScaler>)
        return "dynamic";
    else if constexpr (std::is_same_v<S, StaticLossScaler>)
        return "static";
    else
        return "custom";
}

// The sections of a step: its working weights, then every buffer of its
// optimizer's state (AdamW::state_buffers, in that order).
template <class Act, class Opt>
std::vector<SectionSpec> section_specs(std::int64_t n, Opt& opt) {
    std::vector<SectionSpec> s{{"weights", dtype_of<Act>, n}};
    for (const StateBuffer& b : opt.state_buffers()) s.push_back({b.name, b.dtype, b.whole()});
    return s;
}

// Calls f(T*) with the element type of `d`, one of the types a state file's
// sections hold (f32, bf16, f16, u8).
template <class F>
decltype(auto) with_section_type(DType d, F&& f) {
    switch (d) {
        case DType::bf16: return f(static_cast<bfloat16*>(nullptr));
        case DType::f16: return f(static_cast<half*>(nullptr));
        case DType::u8: return f(static_cast<std::uint8_t*>(nullptr));
        default: return f(static_cast<float*>(nullptr));
    }
}

inline nlohmann::ordered_json gpt_json(const GPTConfig& c) {
    return {{"vocab_size", c.vocab_size}, {"padded_vocab_size", c.padded_vocab_size},
            {"max_seq_len", c.max_seq_len}, {"n_layer", c.n_layer},
            {"n_head", c.n_head},           {"channels", c.channels},
            {"attention", attention_kind_name(c.attention)}, {"classifier_chunk", c.classifier_chunk}};
}

inline std::string gpt_text(const GPTConfig& c) {
    return "(vocab_size " + std::to_string(c.vocab_size) + ", padded_vocab_size " +
           std::to_string(c.padded_vocab_size) + ", max_seq_len " + std::to_string(c.max_seq_len) + ", n_layer " +
           std::to_string(c.n_layer) + ", n_head " + std::to_string(c.n_head) + ", channels " +
           std::to_string(c.channels) + ")";
}

// The JSON header of `step` with `progress`; the section offsets are relative
// to data_offset, so the header does not depend on its own length.
template <class Model, class Precision, class Accumulation, class Checkpoint>
nlohmann::ordered_json header_json(TrainStep<Model, Precision, Accumulation, Checkpoint>& step,
                                   const TrainingProgress& progress, const std::vector<StateSection>& sections,
                                   std::uint64_t data_offset) {
    using Act = typename Model::value_type;
    using nlohmann::ordered_json;
    Model& model = step.model();
    ordered_json m{{"num_parameters", model.num_parameters()},
                   {"dtype", std::string(dtype_name(dtype_of<Act>))},
                   {"precision", std::string(Precision::name)}};
    if constexpr (HasGPTConfig<Model>) m["gpt"] = gpt_json(model.config());
    if constexpr (HasModelIdentity<Model>) {
        const ModelIdentity id = model.identity();
        m["family"] = id.family;
        ordered_json config = ordered_json::object();
        for (const ModelField& f : id.config) config[f.name] = f.value;
        m["config"] = std::move(config);
        ordered_json tensors = ordered_json::array();
        for (const ModelTensor& t : id.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}});
        m["tensors"] = std::move(tensors);
    }
    const AdamWConfig& a = step.optimizer().config();
    ordered_json scaler = nullptr;
    if constexpr (Precision::has_loss_scaler) {
        using S = typename Precision::scaler_type;
        const LossScalerState st = step.scaler.state();
        scaler = ordered_json{{"kind", scaler_kind<S>()},
                              {"scale", st.scale},
                              {"growth_tracker", st.growth_tracker},
                              {"skipped", st.skipped},
                              {"steps", st.steps}};
        if constexpr (std::is_same_v<S, DynamicLossScaler>) {
            const DynamicLossScalerConfig& c = step.scaler.config();
            scaler["config"] = ordered_json{{"init_scale", c.init_scale},
                                            {"growth_factor", c.growth_factor},
                                            {"backoff_factor", c.backoff_factor},
                                            {"growth_interval", c.growth_interval}};
        }
    }
    ordered_json secs = ordered_json::array();
    for (const StateSection& s : sections)
        secs.push_back({{"name", s.name},
                        {"dtype", std::string(dtype_name(s.dtype))},
                        {"count", s.count},
                        {"offset", s.offset - data_offset},
                        {"bytes", s.bytes}});
    return ordered_json{
        {"model", std::move(m)},
        {"optimizer",
         {{"name", "adamw"},
          {"steps", step.optimizer().steps()},
          {"beta1", a.beta1},
          {"beta2", a.beta2},
          {"eps", a.eps},
          {"weight_decay", a.weight_decay},
          {"moments", std::string(moment_storage_name(a.moments))},
          {"master", std::string(master_storage_name(a.master))},
          {"rounding_seed", a.rounding_seed}}},
        {"max_grad_norm", step.config().max_grad_norm},
        {"accumulation_steps", static_cast<int>(step.steps())},
        {"checkpoint_policy", std::string(Checkpoint::name)},
        {"recompute_plan", describe_plan(step.recompute_plan())},
        {"loss_scaler", std::move(scaler)},
        {"skipped_steps", step.skipped_steps()},
        {"progress",
         {{"step", progress.step},
          {"tokens", progress.tokens},
          {"train_position", progress.train_position},
          {"seed", progress.seed},
          {"rng_offset", progress.rng_offset},
          {"sampler_position", progress.sampler_position},
          {"wall_clock_seconds", progress.wall_clock_seconds},
          {"run_config", progress.run_config}}},
        {"sections", std::move(secs)},
    };
}

// ---- reading -------------------------------------------------------------------

// The shortest decimal that reads back as v.
inline std::string double_text(double v) {
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc{} ? std::string(buf, end) : std::string("?");
}

// A dtype named in the header (dtype_name's spelling).
inline DType header_dtype(const io::JsonFields& F, const nlohmann::json& obj, const char* key, const std::string& where) {
    const std::string s = F.string(obj, key, where);
    for (DType t : all_dtypes)
        if (s == dtype_name(t)) return t;
    F.fail(where + key, "names an unknown dtype '" + s + "'");
}

inline TrainingStateInfo read_info(io::FileReader& f) {
    const std::string& file = f.name();
    const std::uint64_t size = f.size();
    unsigned char fixed[fixed_bytes] = {};
    const std::size_t have = static_cast<std::size_t>(std::min<std::uint64_t>(size, fixed_bytes));
    if (have > 0) f.read_at(0, fixed, have, "the fixed header");
    if (have == 0 || std::memcmp(fixed, magic, std::min<std::size_t>(have, sizeof magic)) != 0)
        throw FileError(file + ": not a snug training-state file (it does not start with the magic bytes \"SNUGTRST\")");
    if (have < fixed_bytes)
        throw FileError(file + ": truncated: the fixed header needs " + std::to_string(fixed_bytes) +
                        " bytes, the file has " + std::to_string(size));
    TrainingStateInfo info;
    info.version = get_le<std::uint32_t>(fixed + 8);
    if (info.version != version)
        throw FileError(file + ": unsupported training-state format version " + std::to_string(info.version) +
                        " (this build reads version " + std::to_string(version) + ")");
    const std::uint32_t fixed_crc = get_le<std::uint32_t>(fixed + 28);
    if (io::Crc32::of(fixed, 28) != fixed_crc)
        throw FileError(file + ": checksum mismatch in the fixed header (stored " + hex32(fixed_crc) + ", computed " +
                        hex32(io::Crc32::of(fixed, 28)) + "): the file is corrupt");
    const std::uint64_t header_bytes = get_le<std::uint32_t>(fixed + 12);
    info.file_bytes = get_le<std::uint64_t>(fixed + 16);
    if (size < info.file_bytes)
        throw FileError(file + ": truncated: the header says " + std::to_string(info.file_bytes) +
                        " bytes, the file has " + std::to_string(size));
    if (size > info.file_bytes)
        throw FileError(file + ": the header says " + std::to_string(info.file_bytes) + " bytes, the file has " +
                        std::to_string(size) + " (bytes appended after the end)");
    if (header_bytes < 2 || header_bytes > max_header_bytes || fixed_bytes + header_bytes > info.file_bytes)
        throw FileError(file + ": JSON header length " + std::to_string(header_bytes) +
                        " is outside [2, 2^24] or runs past the end of the " + std::to_string(info.file_bytes) +
                        "-byte file");
    std::string text(static_cast<std::size_t>(header_bytes), '\0');
    f.read_at(fixed_bytes, text.data(), text.size(), "the JSON header");
    const std::uint32_t header_crc = get_le<std::uint32_t>(fixed + 24);
    if (io::Crc32::of(text.data(), text.size()) != header_crc)
        throw FileError(file + ": checksum mismatch in the JSON header (stored " + hex32(header_crc) + ", computed " +
                        hex32(io::Crc32::of(text.data(), text.size())) + "): the file is corrupt");
    const nlohmann::json j = io::parse_json_object(file, text.begin(), text.end(), "header");
    const io::JsonFields F(file, "header field");

    const nlohmann::json& m = F.object(j, "model", "");
    info.num_parameters = F.i64(m, "num_parameters", "model.", 0, std::numeric_limits<std::int64_t>::max() / 8);
    info.dtype = header_dtype(F, m, "dtype", "model.");
    info.precision = F.string(m, "precision", "model.");
    if (m.contains("gpt")) {
        const nlohmann::json& g = F.object(m, "gpt", "model.");
        GPTConfig c;
        c.vocab_size = F.i32(g, "vocab_size", "model.gpt.");
        c.padded_vocab_size = F.i32(g, "padded_vocab_size", "model.gpt.");
        c.max_seq_len = F.i32(g, "max_seq_len", "model.gpt.");
        c.n_layer = F.i32(g, "n_layer", "model.gpt.");
        c.n_head = F.i32(g, "n_head", "model.gpt.");
        c.channels = F.i32(g, "channels", "model.gpt.");
        info.gpt = c;
    }
    if (m.contains("family") || m.contains("config") || m.contains("tensors")) {
        ModelIdentity id;
        id.family = F.string(m, "family", "model.");
        const nlohmann::json& c = F.object(m, "config", "model.");
        for (const auto& [name, value] : c.items())
            id.config.push_back({name, F.number(c, name.c_str(), "model.config.")});
        const nlohmann::json& ts = F.array(m, "tensors", "model.");
        for (std::size_t i = 0; i < ts.size(); ++i) {
            const std::string where = "model.tensors[" + std::to_string(i) + "]";
            F.as_object(ts[i], where);
            ModelTensor t;
            t.name = F.string(ts[i], "name", where + ".");
            const nlohmann::json& shape = F.at(ts[i], "shape", where + ".");
            if (!shape.is_array() || shape.empty() || shape.size() > 4)
                F.fail(where + ".shape", "is not an array of 1 to 4 dimensions");
            for (std::size_t d = 0; d < shape.size(); ++d) {
                if (!shape[d].is_number_integer() || shape[d].get<std::int64_t>() < 1 ||
                    shape[d].get<std::int64_t>() > (std::int64_t{1} << 62))
                    F.fail(where + ".shape", "has a dimension that is not an integer in [1, 2^62]");
                t.shape.push_back(shape[d].get<std::int64_t>());
            }
            id.tensors.push_back(std::move(t));
        }
        info.identity = std::move(id);
    }

    const nlohmann::json& o = F.object(j, "optimizer", "");
    if (const std::string name = F.string(o, "name", "optimizer."); name != "adamw")
        F.fail("optimizer.name", "is '" + name + "'; this build knows only 'adamw'");
    info.optimizer_steps = F.i32(o, "steps", "optimizer.");
    info.adamw.beta1 = F.float32(o, "beta1", "optimizer.");
    info.adamw.beta2 = F.float32(o, "beta2", "optimizer.");
    info.adamw.eps = F.float32(o, "eps", "optimizer.");
    info.adamw.weight_decay = F.float32(o, "weight_decay", "optimizer.");
    // The state's storage (files from before lean storage hold fp32 everything).
    try {
        if (o.contains("moments")) info.adamw.moments = parse_moment_storage(F.string(o, "moments", "optimizer."));
        if (o.contains("master")) info.adamw.master = parse_master_storage(F.string(o, "master", "optimizer."));
    } catch (const ConfigError& e) {
        F.fail("optimizer", e.what());
    }
    if (o.contains("rounding_seed")) info.adamw.rounding_seed = F.u64(o, "rounding_seed", "optimizer.");
    info.max_grad_norm = F.float32(j, "max_grad_norm", "");
    info.accumulation_steps = F.i32(j, "accumulation_steps", "", 1);
    info.checkpoint_policy = F.string(j, "checkpoint_policy", "");

    const nlohmann::json& s = F.at(j, "loss_scaler", "");
    if (!s.is_null()) {
        if (!s.is_object()) F.fail("loss_scaler", "is neither null nor an object");
        info.loss_scaler_kind = F.string(s, "kind", "loss_scaler.");
        LossScalerState st{};
        st.scale = F.float32(s, "scale", "loss_scaler.");
        st.growth_tracker = F.i32(s, "growth_tracker", "loss_scaler.");
        st.skipped = F.i64(s, "skipped", "loss_scaler.", 0, std::numeric_limits<std::int64_t>::max());
        st.steps = F.i64(s, "steps", "loss_scaler.", 0, std::numeric_limits<std::int64_t>::max());
        info.loss_scaler = st;
        if (info.loss_scaler_kind == "dynamic") {
            const nlohmann::json& c = F.object(s, "config", "loss_scaler.");
            DynamicLossScalerConfig dc;
            dc.init_scale = F.float32(c, "init_scale", "loss_scaler.config.");
            dc.growth_factor = F.float32(c, "growth_factor", "loss_scaler.config.");
            dc.backoff_factor = F.float32(c, "backoff_factor", "loss_scaler.config.");
            dc.growth_interval = F.i32(c, "growth_interval", "loss_scaler.config.", 1);
            info.dynamic_scaler = dc;
        }
    }
    info.skipped_steps = F.i64(j, "skipped_steps", "", 0, std::numeric_limits<std::int64_t>::max());

    const nlohmann::json& p = F.object(j, "progress", "");
    constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
    info.progress.step = F.i64(p, "step", "progress.", 0, i64_max);
    info.progress.tokens = F.i64(p, "tokens", "progress.", 0, i64_max);
    info.progress.train_position = F.i64(p, "train_position", "progress.", 0, i64_max);
    info.progress.seed = F.u64(p, "seed", "progress.");
    info.progress.rng_offset = F.u64(p, "rng_offset", "progress.");
    info.progress.sampler_position = F.u64(p, "sampler_position", "progress.");
    info.progress.wall_clock_seconds = F.number(p, "wall_clock_seconds", "progress.");
    if (info.progress.wall_clock_seconds < 0.0)
        F.fail("progress.wall_clock_seconds", "is " + double_text(info.progress.wall_clock_seconds) + ", not >= 0");
    info.progress.run_config = F.string(p, "run_config", "progress.");

    // The section table: records back to back from data_offset, ending at file_bytes.
    const nlohmann::json& secs = F.array(j, "sections");
    const std::uint64_t data_offset = round_up(fixed_bytes + header_bytes, alignment);
    std::uint64_t at = data_offset;
    for (std::size_t i = 0; i < secs.size(); ++i) {
        const std::string where = "sections[" + std::to_string(i) + "].";
        F.as_object(secs[i], "sections[" + std::to_string(i) + "]");
        StateSection sec;
        sec.name = F.string(secs[i], "name", where);
        sec.dtype = header_dtype(F, secs[i], "dtype", where);
        sec.count = F.i64(secs[i], "count", where, 0, std::numeric_limits<std::int64_t>::max() / 8);
        sec.offset = data_offset + F.u64(secs[i], "offset", where);
        sec.bytes = F.u64(secs[i], "bytes", where);
        if (sec.offset != at)
            F.fail(where + "offset", "places the record at byte " + std::to_string(sec.offset) + ", expected " +
                                         std::to_string(at) + " (records are back to back from " +
                                         std::to_string(data_offset) + ")");
        if (sec.bytes != static_cast<std::uint64_t>(sec.count) * dtype_size(sec.dtype))
            F.fail(where + "bytes", "is " + std::to_string(sec.bytes) + ", expected count x element size = " +
                                        std::to_string(static_cast<std::uint64_t>(sec.count) * dtype_size(sec.dtype)));
        at += round_up(sec.bytes + 4, alignment);
        if (at > info.file_bytes)
            F.fail(where + "bytes", "runs the record past the end of the " + std::to_string(info.file_bytes) +
                                        "-byte file");
        info.sections.push_back(std::move(sec));
    }
    if (at != info.file_bytes)
        throw FileError(file + ": the section records end at byte " + std::to_string(at) +
                        ", but the header says the file has " + std::to_string(info.file_bytes) + " bytes");
    return info;
}

// Streams one section through its checksum in chunks; with dst, its elements
// [keep_from, keep_from + keep) (keep -1: all) are also uploaded to dst on
// the device (a shard's part of a section). Returns whether the checksum matched.
template <class T, class D>
bool stream_section(io::FileReader& f, const StateSection& s, std::size_t chunk_bytes, const D& dev, T* dst,
                    std::int64_t keep_from = 0, std::int64_t keep = -1) {
    if (keep < 0) keep = s.count - keep_from;
    static_assert(std::is_trivially_copyable_v<T>);
    const auto chunk = static_cast<std::int64_t>(std::max<std::size_t>(1, chunk_bytes / sizeof(T)));
    std::vector<T> buf(static_cast<std::size_t>(std::min(s.count, chunk)));
    io::Crc32 crc;
    for (std::int64_t done = 0; done < s.count;) {
        const std::int64_t k = std::min(chunk, s.count - done);
        const auto bytes = static_cast<std::size_t>(k) * sizeof(T);
        f.read_at(s.offset + static_cast<std::uint64_t>(done) * sizeof(T), buf.data(), bytes,
                  "section '" + s.name + "'");
        crc.update(buf.data(), bytes);
        const std::int64_t a = std::max(done, keep_from), b = std::min(done + k, keep_from + keep);
        if (dst != nullptr && a < b) upload(dev, dst + (a - keep_from), buf.data() + (a - done), b - a);
        done += k;
    }
    unsigned char stored[4];
    f.read_at(s.offset + s.bytes, stored, 4, "the checksum of section '" + s.name + "'");
    return crc.value() == get_le<std::uint32_t>(stored);
}

[[noreturn]] inline void mismatch(const std::string& file, const std::string& what, const std::string& in_file,
                                  const std::string& in_step) {
    throw FileError(file + ": " + what + " does not match: the file has " + in_file + ", this training step has " +
                    in_step);
}

inline void check_float(const std::string& file, const std::string& what, float in_file, float in_step) {
    if (std::bit_cast<std::uint32_t>(in_file) != std::bit_cast<std::uint32_t>(in_step))
        mismatch(file, what, float_text(in_file), float_text(in_step));
}

}  // namespace detail::state_file

// The header of the training-state file at `path`, checked (magic, version,
// size, checksums of the fixed and JSON headers, the section table) but with
// the sections' payloads not read. Throws FileError as load_training_state does.
inline TrainingStateInfo read_training_state_info(const std::filesystem::path& path) {
    io::FileReader f(path);
    return detail::state_file::read_info(f);
}

// Writes step's whole state and `progress` to `path` in the format above,
// streaming: at most options.chunk_bytes of one section is staged in host
// memory at a time. The file is written under a temporary name and renamed
// over `path` only once complete (io::atomic_write): a failure at any point,
// an exception from options.on_progress included, leaves `path` as it was.
// Throws ConfigError for a progress that cannot be stored (negative counters,
// wall_clock_seconds not finite or negative, run_config not valid UTF-8), and
// FileError when writing fails.
template <class Model, class Precision, class Accumulation, class Checkpoint>
void save_training_state(const std::filesystem::path& path,
                         TrainStep<Model, Precision, Accumulation, Checkpoint>& step,
                         const typename Model::device_type& dev, const TrainingProgress& progress,
                         const StateFileOptions& options = {}) {
    namespace sf = detail::state_file;
    using Act = typename Model::value_type;
    auto bad = [](const std::string& field, const std::string& value, const char* must) {
        throw ConfigError("save_training_state: progress." + field + " = " + value + " " + must);
    };
    if (progress.step < 0) bad("step", std::to_string(progress.step), "must be >= 0");
    if (progress.tokens < 0) bad("tokens", std::to_string(progress.tokens), "must be >= 0");
    if (progress.train_position < 0) bad("train_position", std::to_string(progress.train_position), "must be >= 0");
    if (!std::isfinite(progress.wall_clock_seconds) || progress.wall_clock_seconds < 0.0)
        bad("wall_clock_seconds", std::to_string(progress.wall_clock_seconds), "must be finite and >= 0");

    Model& model = step.model();
    auto& opt = step.optimizer();
    const std::int64_t n = model.num_parameters();
    // The header does not depend on data_offset (offsets are relative), so
    // lay the sections out at 0 first, then shift them once its length is known.
    const std::vector<sf::SectionSpec> specs = sf::section_specs<Act>(n, opt);
    std::string header;
    try {
        header = sf::header_json(step, progress, sf::layout(0, specs), 0).dump(1);
    } catch (const nlohmann::json::type_error& e) {
        throw ConfigError(std::string("save_training_state: progress.run_config is not valid UTF-8 (") + e.what() +
                          ")");
    }
    if (header.size() > sf::max_header_bytes)
        throw ConfigError("save_training_state: the JSON header has " + std::to_string(header.size()) +
                          " bytes, more than the format's 2^24 (is progress.run_config that long?)");
    const std::uint64_t data_offset = sf::round_up(sf::fixed_bytes + header.size(), sf::alignment);
    const std::vector<StateSection> sections = sf::layout(data_offset, specs);
    const std::uint64_t file_bytes = sf::end_of(data_offset, sections);

    unsigned char fixed[sf::fixed_bytes] = {};
    std::memcpy(fixed, sf::magic, sizeof sf::magic);
    sf::put_le<std::uint32_t>(fixed + 8, sf::version);
    sf::put_le<std::uint32_t>(fixed + 12, static_cast<std::uint32_t>(header.size()));
    sf::put_le<std::uint64_t>(fixed + 16, file_bytes);
    sf::put_le<std::uint32_t>(fixed + 24, io::Crc32::of(header.data(), header.size()));
    sf::put_le<std::uint32_t>(fixed + 28, io::Crc32::of(fixed, 28));

    const std::string file = path.string();
    io::atomic_write(path, [&](io::FileWriter& w) {
        std::uint64_t written = 0;
        auto put = [&](const void* data, std::size_t bytes) {
            w.write(data, bytes);
            if (w.failed())
                throw FileError(file + ": write failed: " + std::strerror(errno) +
                                "; the previous file, if any, is unchanged");
            written += bytes;
        };
        static constexpr unsigned char zeros[sf::alignment] = {};
        auto pad = [&] { put(zeros, static_cast<std::size_t>(sf::round_up(written, sf::alignment) - written)); };
        auto report = [&] {
            if (options.on_progress) options.on_progress(written, file_bytes);
        };
        put(fixed, sizeof fixed);
        put(header.data(), header.size());
        pad();
        report();
        auto section = [&]<class T>(const T* src, std::int64_t count, bool on_host) {
            const auto chunk = static_cast<std::int64_t>(std::max<std::size_t>(1, options.chunk_bytes / sizeof(T)));
            std::vector<T> buf(static_cast<std::size_t>(std::min(count, chunk)));
            io::Crc32 crc;
            for (std::int64_t done = 0; done < count;) {
                const std::int64_t k = std::min(chunk, count - done);
                if (on_host)
                    download(Host{}, buf.data(), src + done, k);
                else
                    download(dev, buf.data(), src + done, k);
                const auto bytes = static_cast<std::size_t>(k) * sizeof(T);
                crc.update(buf.data(), bytes);
                put(buf.data(), bytes);
                done += k;
                report();
            }
            unsigned char c[4];
            sf::put_le<std::uint32_t>(c, crc.value());
            put(c, 4);
            pad();
            report();
        };
        section(static_cast<const Act*>(model.parameters()), n, false);
        const std::vector<StateBuffer> buffers =
            options.optimizer_state.empty() ? opt.state_buffers() : options.optimizer_state;
        for (std::size_t k = 0; k < buffers.size(); ++k) {
            const StateBuffer& b = buffers[k];
            if (b.count != specs[k + 1].count)
                throw Error(file + ": the optimizer's buffer '" + b.name + "' holds " + std::to_string(b.count) +
                            " of its " + std::to_string(specs[k + 1].count) +
                            " elements: a sharded optimizer's state is saved gathered (dist/sharded_state.hpp)");
            sf::with_section_type(b.dtype,
                                  [&]<class T>(T*) { section(static_cast<const T*>(b.data), b.count, b.on_host); });
        }
        if (written != file_bytes)
            throw Error(file + ": wrote " + std::to_string(written) + " bytes, the header says " +
                        std::to_string(file_bytes) + " (a bug in save_training_state)");
    });
}

// Reads the file at `path` into `step` (working weights, master weights,
// moments, optimizer step count, loss-scaler state, skipped-update count) and
// returns the progress the trainer saved with it; the trainer applies that
// (loader.set_position(p.train_position), ctx.seed = p.seed, ...).
//
// Every check (see the format comment) comes first, every section's checksum
// included (a first streaming pass); only then is anything written into the
// step (a second pass). A file that fails a check throws FileError naming the
// file and the problem, and leaves the step unchanged. Should a section change
// on disk between the two passes, the second pass throws FileError saying the
// step is partly overwritten. The step's hyper-parameters must be the saved
// ones (AdamW's betas, eps, weight decay; max_grad_norm; a dynamic scaler's
// knobs): the continuation is bit-identical only then; read_training_state_info
// gives them to build a matching step.
template <class Model, class Precision, class Accumulation, class Checkpoint>
TrainingProgress load_training_state(const std::filesystem::path& path,
                                     TrainStep<Model, Precision, Accumulation, Checkpoint>& step,
                                     const typename Model::device_type& dev, const StateFileOptions& options = {}) {
    namespace sf = detail::state_file;
    using Act = typename Model::value_type;
    io::FileReader f(path);
    const TrainingStateInfo info = sf::read_info(f);
    const std::string& file = f.name();
    Model& model = step.model();
    auto& opt = step.optimizer();
    const std::int64_t n = model.num_parameters();

    // The model's identity: what it is first (a 4-head state has as many
    // parameters as a 2-head model of the same width), then its size.
    if constexpr (sf::HasModelIdentity<Model>) {
        const ModelIdentity id = model.identity();
        const std::string model_kind = "a " + (id.family.empty() ? std::string("CausalLM") : id.family) + " model";
        if (info.gpt) sf::mismatch(file, "the model kind", "a GPT " + sf::gpt_text(*info.gpt), model_kind);
        if (info.identity)
            if (const std::string d = first_difference(*info.identity, id); !d.empty())
                throw FileError(file + ": the model does not match: " + d);
    } else if (!sf::HasGPTConfig<Model> && info.identity) {
        sf::mismatch(file, "the model kind",
                     "a " + (info.identity->family.empty() ? std::string("CausalLM") : info.identity->family) +
                         " model",
                     "a model without a family");
    }
    if (info.num_parameters != n)
        sf::mismatch(file, "the parameter count", std::to_string(info.num_parameters), std::to_string(n));
    if (info.dtype != dtype_of<Act>)
        sf::mismatch(file, "the working weights' dtype", std::string(dtype_name(info.dtype)),
                     std::string(dtype_name(dtype_of<Act>)));
    if (info.precision != Precision::name)
        sf::mismatch(file, "the precision policy", info.precision, Precision::name);
    if constexpr (sf::HasGPTConfig<Model>) {
        const GPTConfig& c = model.config();
        if (!info.gpt) sf::mismatch(file, "the model kind", "a model without a GPT shape", "a GPT " + sf::gpt_text(c));
        const GPTConfig& g = *info.gpt;
        const std::pair<const char*, std::pair<int, int>> dims[] = {
            {"vocab_size", {g.vocab_size, c.vocab_size}}, {"padded_vocab_size", {g.padded_vocab_size, c.padded_vocab_size}},
            {"max_seq_len", {g.max_seq_len, c.max_seq_len}}, {"n_layer", {g.n_layer, c.n_layer}},
            {"n_head", {g.n_head, c.n_head}},              {"channels", {g.channels, c.channels}}};
        for (const auto& [name, v] : dims)
            if (v.first != v.second)
                sf::mismatch(file, std::string("the GPT shape's ") + name,
                             std::to_string(v.first) + " in " + sf::gpt_text(g),
                             std::to_string(v.second) + " in " + sf::gpt_text(c));
    } else {
        if (info.gpt) sf::mismatch(file, "the model kind", "a GPT " + sf::gpt_text(*info.gpt), "a model without a GPT shape");
    }

    // The loss scaler: present or not, its kind and knobs; the saved state
    // must be one this step's scaler accepts (tried on a copy).
    if constexpr (Precision::has_loss_scaler) {
        using S = typename Precision::scaler_type;
        if (!info.loss_scaler) sf::mismatch(file, "the loss scaler", "none", std::string(sf::scaler_kind<S>()));
        if (info.loss_scaler_kind != sf::scaler_kind<S>())
            sf::mismatch(file, "the loss scaler's kind", info.loss_scaler_kind, sf::scaler_kind<S>());
        if constexpr (std::is_same_v<S, DynamicLossScaler>) {
            if (!info.dynamic_scaler) sf::mismatch(file, "the loss scaler's config", "none", "a dynamic scaler's");
            const DynamicLossScalerConfig& a = *info.dynamic_scaler;
            const DynamicLossScalerConfig& b = step.scaler.config();
            sf::check_float(file, "the loss scaler's growth_factor", a.growth_factor, b.growth_factor);
            sf::check_float(file, "the loss scaler's backoff_factor", a.backoff_factor, b.backoff_factor);
            if (a.growth_interval != b.growth_interval)
                sf::mismatch(file, "the loss scaler's growth_interval", std::to_string(a.growth_interval),
                             std::to_string(b.growth_interval));
        }
        S probe = step.scaler;
        try {
            probe.restore(*info.loss_scaler);
        } catch (const ConfigError& e) {
            throw FileError(file + ": the saved loss-scaler state does not fit this step's scaler: " + e.what());
        }
    } else {
        if (info.loss_scaler)
            sf::mismatch(file, "the loss scaler", "a " + info.loss_scaler_kind + " loss scaler",
                         std::string("none (precision ") + Precision::name + ")");
    }

    // The hyper-parameters that shape the continuation.
    const AdamWConfig& a = opt.config();
    sf::check_float(file, "AdamW's beta1", info.adamw.beta1, a.beta1);
    sf::check_float(file, "AdamW's beta2", info.adamw.beta2, a.beta2);
    sf::check_float(file, "AdamW's eps", info.adamw.eps, a.eps);
    sf::check_float(file, "AdamW's weight_decay", info.adamw.weight_decay, a.weight_decay);
    sf::check_float(file, "max_grad_norm", info.max_grad_norm, step.config().max_grad_norm);
    if (info.adamw.moments != a.moments)
        sf::mismatch(file, "the optimizer's moment storage", std::string(moment_storage_name(info.adamw.moments)),
                     std::string(moment_storage_name(a.moments)));
    if (info.adamw.master != a.master)
        sf::mismatch(file, "the optimizer's master weights", std::string(master_storage_name(info.adamw.master)),
                     std::string(master_storage_name(a.master)));
    if (info.adamw.rounding_seed != a.rounding_seed)
        sf::mismatch(file, "the optimizer's rounding seed", std::to_string(info.adamw.rounding_seed),
                     std::to_string(a.rounding_seed));

    // The section table: exactly the sections this step has, in order.
    const std::vector<sf::SectionSpec> specs = sf::section_specs<Act>(n, opt);
    auto table = [](const auto& list) {
        std::string s;
        for (const auto& x : list)
            s += (s.empty() ? "" : ", ") + x.name + " (" + std::string(dtype_name(x.dtype)) + " x " +
                 std::to_string(x.count) + ")";
        return "[" + s + "]";
    };
    bool same = info.sections.size() == specs.size();
    for (std::size_t i = 0; same && i < specs.size(); ++i)
        same = info.sections[i].name == specs[i].name && info.sections[i].dtype == specs[i].dtype &&
               info.sections[i].count == specs[i].count;
    if (!same) sf::mismatch(file, "the section table", table(info.sections), table(specs));

    // Pass 1: every checksum, nothing written.
    for (const StateSection& s : info.sections) {
        const bool ok = sf::with_section_type(s.dtype, [&]<class T>(T*) {
            return sf::stream_section<T>(f, s, options.chunk_bytes, dev, nullptr);
        });
        if (!ok)
            throw FileError(file + ": checksum mismatch in section '" + s.name +
                            "': the file is corrupt; nothing was loaded");
    }

    // Pass 2: into the step (a sharded optimizer takes its part of each section).
    auto load = [&]<class T>(const StateSection& s, T* dst, bool on_host, std::int64_t from = 0,
                             std::int64_t count = -1) {
        const bool ok = on_host ? sf::stream_section<T>(f, s, options.chunk_bytes, Host{}, dst, from, count)
                                : sf::stream_section<T>(f, s, options.chunk_bytes, dev, dst, from, count);
        if (!ok)
            throw FileError(file + ": section '" + s.name +
                            "' changed on disk while it was being loaded; the training step is now partly "
                            "overwritten: load a good file again");
    };
    std::size_t i = 0;
    load(info.sections[i++], model.parameters(), false);
    opt.weights_loaded(dev, model.parameters());
    for (const StateBuffer& b : opt.state_buffers())
        sf::with_section_type(b.dtype, [&]<class T>(T*) {
            load(info.sections[i++], static_cast<T*>(b.data), b.on_host, b.offset, b.count);
        });
    opt.set_steps(info.optimizer_steps);
    if constexpr (Precision::has_loss_scaler) step.scaler.restore(*info.loss_scaler);
    step.restore_skipped_steps(info.skipped_steps);
    return info.progress;
}

}  // namespace snug
