// The training-state file's format: everything a run needs to continue bit
// for bit (working weights, fp32 master weights, AdamW moments and step count,
// the loss scaler, TrainStep's skipped-update count, the data and
// random-stream positions, the step and token counters). Here: this comment,
// the format's specification; the header's types; read_training_state_info(),
// which reads and checks a file's header without any model (its checksum:
// io/crc32.hpp). train/state_file.hpp writes a TrainStep in this format
// (save_training_state) and reads it back (load_training_state).
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
#include "snug/optim/adamw.hpp"
#include "snug/precision/loss_scaler.hpp"

namespace snug {

static_assert(std::endian::native == std::endian::little,
              "the training-state file holds sections as the host's bytes: it needs a little-endian host");

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

}  // namespace detail::state_file

// The header of the training-state file at `path`, checked (magic, version,
// size, checksums of the fixed and JSON headers, the section table) but with
// the sections' payloads not read. Throws FileError as load_training_state does.
inline TrainingStateInfo read_training_state_info(const std::filesystem::path& path) {
    io::FileReader f(path);
    return detail::state_file::read_info(f);
}

}  // namespace snug
