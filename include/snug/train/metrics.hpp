// Training metrics: what one update cost and achieved (StepRecord), as one
// JSON line per step (metrics.jsonl), and the end-of-run summary's numbers
// (RunSummary). Their text (the progress line, the summary table) is
// snug/report/text_report.hpp's.
//
// FLOPs follow GPTConfig::flops_per_token (6 N + 12 L C T per trained token,
// the PaLM / llm.c convention). Hardware FLOPs add what recomputation runs
// again in backward, per block and token, counted in the same convention:
//   Recompute::full        one forward of the block: 2 · (12 C² + 13 C) + 4 C T
//   Recompute::selective   attention forward again (QKᵀ and AV):      4 C T
//                          (its LayerNorm and GELU recomputation is element-wise
//                          work, not counted, as no element-wise work is)
// MFU = model FLOPs / s / peak, HFU = hardware FLOPs / s / peak, where the
// device's dense peak for the precision is known (peak_flops); elsewhere they
// are JSON null (and the text leaves them out).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/checkpoint/recompute.hpp"

namespace snug {

// The dense (no sparsity) peak FLOP/s of a GPU for a compute precision
// ("fp32": CUDA cores without TF32, "tf32", "bf16", "fp16"), from the vendor's
// data sheets; nullopt for any device or precision not listed (the host, any
// GPU whose figure is not certain here). `device_name` is what the driver
// reports (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3").
//   H100 SXM, H200 (not NVL): fp32 66.9e12, tf32 494.7e12, bf16/fp16 989.4e12
//   H100 PCIe:                fp32 51.2e12, tf32 378e12,   bf16/fp16 756e12
//   A100 (SXM and PCIe):      fp32 19.5e12, tf32 156e12,   bf16/fp16 312e12
inline std::optional<double> peak_flops(std::string_view device_name, std::string_view precision) {
    std::string name(device_name);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    const auto has = [&](std::string_view s) { return name.find(s) != std::string::npos; };
    struct Rates {
        double fp32, tf32, half;
    };
    std::optional<Rates> rates;
    if (has("nvl")) {
        rates = std::nullopt;  // H100 NVL / H200 NVL: other clocks and power, not listed
    } else if (has("h200") || (has("h100") && (has("hbm3") || has("sxm")))) {
        rates = Rates{66.9e12, 494.7e12, 989.4e12};
    } else if (has("h100") && has("pcie")) {
        rates = Rates{51.2e12, 378e12, 756e12};
    } else if (has("a100")) {
        rates = Rates{19.5e12, 156e12, 312e12};
    }
    if (!rates) return std::nullopt;
    if (precision == "fp32") return rates->fp32;
    if (precision == "tf32") return rates->tf32;
    if (precision == "bf16" || precision == "fp16") return rates->half;
    return std::nullopt;
}

// FLOPs that recomputation adds per trained token at sequence length T under
// a recompute plan (one mode per block), in the convention described above.
inline double recompute_flops_per_token(const GPTConfig& config, int T, std::span<const Recompute> modes) {
    return model_summary(config).recompute_flops_per_token(T, modes);
}

// What one optimizer update did and cost.
struct StepRecord {
    std::int64_t step = 0;          // 1-based update number
    double train_loss = 0.0;        // mean over the update's tokens
    double lr = 0.0;
    double grad_norm = 0.0;         // before clipping
    double loss_scale = 1.0;
    bool skipped = false;           // non-finite gradient: no update
    std::int64_t tokens = 0;        // trained this update
    double seconds = 0.0;           // this update's time
    double model_flops = 0.0;       // this update's model FLOPs
    double hardware_flops = 0.0;    // model FLOPs plus recomputation
    std::optional<double> peak_flops_per_second;  // the device's peak (nullopt: unknown)
    MemoryBreakdown peak_bytes{};   // highest bytes so far, per category
    std::size_t peak_total = 0;     // highest total so far (not the sum of the per-category peaks)
    double wall_clock = 0.0;        // seconds since training started
    std::optional<double> val_loss; // at the evaluation interval

    double tokens_per_second() const { return seconds > 0.0 ? static_cast<double>(tokens) / seconds : 0.0; }
    std::optional<double> mfu() const { return utilisation(model_flops); }
    std::optional<double> hfu() const { return utilisation(hardware_flops); }

private:
    std::optional<double> utilisation(double flops) const {
        if (!peak_flops_per_second || *peak_flops_per_second <= 0.0 || seconds <= 0.0) return std::nullopt;
        return flops / seconds / *peak_flops_per_second;
    }
};

namespace detail {
inline nlohmann::json optional_json(const std::optional<double>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
// "master weights" -> "master_weights"
inline std::string json_key(std::string_view name) {
    std::string key(name);
    std::replace(key.begin(), key.end(), ' ', '_');
    return key;
}
}  // namespace detail

// The record as one JSON object (a line of metrics.jsonl). Unknown values
// (MFU and HFU without a known peak, val_loss off the eval interval) are null.
inline nlohmann::json to_json(const StepRecord& r) {
    nlohmann::json peak = nlohmann::json::object();
    for (MemoryCategory c : all_memory_categories)
        peak[detail::json_key(category_name(c))] = r.peak_bytes[static_cast<std::size_t>(c)];
    peak["total"] = r.peak_total;
    return {
        {"step", r.step},
        {"train_loss", r.train_loss},
        {"lr", r.lr},
        {"grad_norm", r.grad_norm},
        {"loss_scale", r.loss_scale},
        {"skipped", r.skipped},
        {"tokens", r.tokens},
        {"step_seconds", r.seconds},
        {"tokens_per_second", r.tokens_per_second()},
        {"model_flops", r.model_flops},
        {"hardware_flops", r.hardware_flops},
        {"peak_flops_per_second", detail::optional_json(r.peak_flops_per_second)},
        {"mfu", detail::optional_json(r.mfu())},
        {"hfu", detail::optional_json(r.hfu())},
        {"peak_bytes", peak},
        {"wall_clock_seconds", r.wall_clock},
        {"val_loss", detail::optional_json(r.val_loss)},
    };
}

// The median of a set of values (the mean of the middle two for an even
// count); nullopt for none.
inline std::optional<double> median(std::vector<double> values) {
    if (values.empty()) return std::nullopt;
    const std::size_t n = values.size();
    std::sort(values.begin(), values.end());
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Loss at equal FLOPs: the training loss of the first update at which the
// run's cumulative model FLOPs reach `budget`. Two runs compared at the same
// budget show which configuration learns more per unit of compute. nullopt
// when the run never reaches the budget.
inline std::optional<double> loss_at_flops(std::span<const StepRecord> records, double budget) {
    double cumulative = 0.0;
    for (const StepRecord& r : records) {
        cumulative += r.model_flops;
        if (cumulative >= budget) return r.train_loss;
    }
    return std::nullopt;
}

// The numbers of the end-of-run table.
struct RunSummary {
    std::int64_t steps = 0;
    std::int64_t tokens = 0;
    double wall_clock = 0.0;                      // seconds of training (evaluation included)
    std::optional<double> median_tokens_per_second;
    std::optional<double> median_mfu;
    std::optional<double> final_train_loss;
    std::optional<double> first_val_loss;
    std::optional<double> final_val_loss;
    std::optional<double> loss_floor;             // known only for the built-in corpus
    double total_model_flops = 0.0;
    double flops_budget = 0.0;                    // where loss_at_equal_flops is read
    std::optional<double> loss_at_equal_flops;
    MemoryBreakdown peak_bytes{};
    std::size_t peak_total = 0;
    std::size_t host_peak = 0;  // an offloaded optimizer's host memory (the run sets it; 0 otherwise)
};

// Summarises a run's records. `flops_budget` (nullopt: the run's total model
// FLOPs) is where loss_at_equal_flops is read; `floor` is the data's entropy
// floor where known.
inline RunSummary summarize(std::span<const StepRecord> records, std::optional<double> flops_budget = std::nullopt,
                            std::optional<double> floor = std::nullopt) {
    RunSummary s;
    s.loss_floor = floor;
    std::vector<double> tps, mfu;
    for (const StepRecord& r : records) {
        ++s.steps;
        s.tokens += r.tokens;
        s.total_model_flops += r.model_flops;
        if (r.seconds > 0.0) tps.push_back(r.tokens_per_second());
        if (auto u = r.mfu()) mfu.push_back(*u);
        if (r.val_loss) {
            if (!s.first_val_loss) s.first_val_loss = r.val_loss;
            s.final_val_loss = r.val_loss;
        }
    }
    if (!records.empty()) {
        const StepRecord& last = records.back();
        s.wall_clock = last.wall_clock;
        s.final_train_loss = last.train_loss;
        s.peak_bytes = last.peak_bytes;
        s.peak_total = last.peak_total;
    }
    s.median_tokens_per_second = median(tps);
    s.median_mfu = median(mfu);
    s.flops_budget = flops_budget.value_or(s.total_model_flops);
    s.loss_at_equal_flops = loss_at_flops(records, s.flops_budget);
    return s;
}

// metrics.jsonl: one JSON object per line, flushed after each, so a run
// stopped at any point leaves every finished update on disk (and at worst one
// partial last line). Opening truncates a previous file of that name unless
// asked to append.
class JsonLinesFile {
public:
    // append: keep what the file holds (a resumed run continues its log).
    explicit JsonLinesFile(const std::filesystem::path& path, bool append = false)
        : path_(path), f_(std::fopen(path.c_str(), append ? "a" : "w")) {
        if (f_ == nullptr) throw FileError(path.string() + ": cannot open for writing: " + std::strerror(errno));
    }
    JsonLinesFile(const JsonLinesFile&) = delete;
    JsonLinesFile& operator=(const JsonLinesFile&) = delete;
    ~JsonLinesFile() { std::fclose(f_); }

    void write(const nlohmann::json& object) {
        const std::string line = object.dump() + "\n";
        if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
            throw FileError(path_.string() + ": write failed: " + std::strerror(errno));
    }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
    std::FILE* f_;
};

}  // namespace snug
