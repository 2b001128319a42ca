// Saving a TrainStep's whole state to a training-state file and loading it
// back: save_training_state() and load_training_state(), streaming each
// section through its checksum. The format and the reading of a file's
// header are train/state_format.hpp's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/io/crc32.hpp"
#include "snug/io/file.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/model_identity.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/precision/loss_scaler.hpp"
#include "snug/train/state_format.hpp"
#include "snug/train/train_step.hpp"

namespace snug {

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

namespace detail::state_file {

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
