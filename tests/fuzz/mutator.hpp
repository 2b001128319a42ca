// Structure-aware mutations for the fuzz targets (used by fuzz_target.cpp's
// LLVMFuzzerCustomMutator, half of the time; libFuzzer's byte mutations do the
// rest). Byte flips rarely turn `"n_layer": 1` into 100000000, or a tensor's
// shape into a negative number, while keeping the framing around the JSON
// valid; these mutations do:
//   - JSON inside a file (safetensors header, config.json, the training-state
//     header) is parsed, one value is changed (a number on an edge: 0, -1,
//     2^31, 2^63, 2^64 - 1, 1e300, a fraction; another JSON type; an element
//     or key removed, duplicated or copied from elsewhere in the document),
//     and the file is rebuilt around it: the safetensors length prefix, the
//     training-state header length, size, padding and CRC-32s.
//   - llm.c headers (model, token and tokenizer files): one of the first
//     eight int32 fields is set to an edge value.
// Each returns the new input, or nothing when the input has no such structure.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/targets.hpp"
#include "snug/train/state_file.hpp"

namespace snug::fuzz::mutate {

using Rng = std::minstd_rand;
using ByteVec = std::vector<unsigned char>;

inline std::size_t below(Rng& rng, std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); }

// ---- JSON -----------------------------------------------------------------------------

inline nlohmann::json edge_number(Rng& rng) {
    switch (below(rng, 16)) {
        case 0: return 0;
        case 1: return -1;
        case 2: return 1;
        case 3: return std::int64_t{INT32_MAX};
        case 4: return std::int64_t{INT32_MAX} + 1;
        case 5: return std::int64_t{1} << 32;
        case 6: return std::int64_t{1} << 53;
        case 7: return std::int64_t{1} << 62;
        case 8: return std::numeric_limits<std::int64_t>::max();
        case 9: return std::numeric_limits<std::uint64_t>::max();
        case 10: return std::numeric_limits<std::int64_t>::min();
        case 11: return 1e300;
        case 12: return -1e300;
        case 13: return 0.5;
        case 14: return 1e39;  // over a float's range
        default: return 100000000;
    }
}

// Every value of the document, depth first (the root included).
inline void collect(nlohmann::json& v, std::vector<nlohmann::json*>& out) {
    out.push_back(&v);
    if (v.is_object() || v.is_array())
        for (auto& child : v) collect(child, out);
}

// One change to one value of `doc`.
inline void mutate_json(nlohmann::json& doc, Rng& rng) {
    std::vector<nlohmann::json*> all;
    collect(doc, all);
    nlohmann::json& v = *all[below(rng, all.size())];
    const nlohmann::json other = *all[below(rng, all.size())];  // a copy: `v` may contain it
    switch (below(rng, 10)) {
        case 0: case 1: case 2: v = edge_number(rng); break;
        case 3:
            if (v.is_number_integer()) {
                // Wrapping arithmetic: the mutator itself must not overflow.
                const auto x = static_cast<std::uint64_t>(v.get<std::int64_t>());
                const std::uint64_t d[] = {1, ~std::uint64_t{0}, 7, ~std::uint64_t{6}};
                v = static_cast<std::int64_t>(x + d[below(rng, 4)]);
            } else {
                v = edge_number(rng);
            }
            break;
        case 4: {  // another type
            const nlohmann::json types[] = {nullptr, true, false, "", "x", nlohmann::json::array(),
                                            nlohmann::json::object(), nlohmann::json::array({1, 2}), "F32"};
            v = types[below(rng, std::size(types))];
            break;
        }
        case 5: v = other; break;  // a value from elsewhere (a dtype name, a shape, offsets...)
        case 6:
            if (v.is_array() && !v.empty()) {
                const std::size_t i = below(rng, v.size());
                if (rng() % 2) {
                    v.erase(i);
                } else {
                    const nlohmann::json copy = v[i];
                    v.push_back(copy);
                }
            } else if (v.is_array()) {
                v.push_back(edge_number(rng));
            } else {
                v = nlohmann::json::array({v});
            }
            break;
        case 7:
            if (v.is_object() && !v.empty()) {
                auto it = v.begin();
                std::advance(it, static_cast<std::ptrdiff_t>(below(rng, v.size())));
                v.erase(it);
            } else {
                v = edge_number(rng);
            }
            break;
        case 8:
            if (v.is_object() && !v.empty()) {  // the same entry under a second name (a twin tensor, say)
                auto it = v.begin();
                std::advance(it, static_cast<std::ptrdiff_t>(below(rng, v.size())));
                const std::string key = it.key() + (rng() % 2 ? "_2" : "");
                const nlohmann::json copy = it.value();
                v[key.empty() ? "x" : key] = copy;
            } else {
                v = other;
            }
            break;
        default:
            if (v.is_object()) {
                v["__metadata__"] = nlohmann::json::object({{"padded_vocab_size", "100000000"}});
            } else if (v.is_string()) {
                const std::string s = v.get<std::string>();
                v = s.empty() ? std::string("x") : s.substr(0, below(rng, s.size()));
            } else {
                v = edge_number(rng);
            }
            break;
    }
}

// `text` with one value changed, or nothing when it is not JSON.
inline std::optional<std::string> mutated_json(std::string_view text, Rng& rng) {
    nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
    if (doc.is_discarded()) return std::nullopt;
    const int changes = 1 + static_cast<int>(below(rng, 2));
    for (int i = 0; i < changes; ++i) mutate_json(doc, rng);
    return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- the files around the JSON ----------------------------------------------------------

inline std::uint64_t le(const unsigned char* p, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
inline void put_le(unsigned char* p, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

inline std::optional<ByteVec> safetensors_json(Bytes in, Rng& rng) {
    if (in.size() < 8) return std::nullopt;
    const std::uint64_t len = le(in.data(), 8);
    if (len > in.size() - 8) return std::nullopt;
    const auto json = mutated_json(std::string_view(reinterpret_cast<const char*>(in.data()) + 8, len), rng);
    if (!json) return std::nullopt;
    ByteVec out(8);
    put_le(out.data(), json->size(), 8);
    out.insert(out.end(), json->begin(), json->end());
    out.insert(out.end(), in.begin() + 8 + static_cast<std::ptrdiff_t>(len), in.end());
    return out;
}

inline std::optional<ByteVec> hf_import_json(Bytes in, Rng& rng) {
    const std::string_view all(reinterpret_cast<const char*>(in.data()), in.size());
    const std::size_t at = all.find(hf_split);
    if (at == std::string_view::npos || rng() % 2 == 0) {  // config.json
        const std::size_t end = at == std::string_view::npos ? in.size() : at;
        const auto json = mutated_json(all.substr(0, end), rng);
        if (!json) return std::nullopt;
        ByteVec out(json->begin(), json->end());
        out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(end), in.end());
        return out;
    }
    const std::size_t weights = at + hf_split.size();
    const auto st = safetensors_json(in.subspan(weights), rng);
    if (!st) return std::nullopt;
    ByteVec out(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(weights));
    out.insert(out.end(), st->begin(), st->end());
    return out;
}

// The training-state file with its JSON header changed and the fixed header
// (length, file size, both CRC-32s) and the padding rebuilt around it; the
// section records move with it.
inline std::optional<ByteVec> state_file_json(Bytes in, Rng& rng) {
    if (in.size() < 1 + 32) return std::nullopt;
    const Bytes f = in.subspan(1);
    const std::uint64_t h = le(f.data() + 12, 4);
    if (32 + h > f.size()) return std::nullopt;
    const auto json = mutated_json(std::string_view(reinterpret_cast<const char*>(f.data()) + 32, h), rng);
    if (!json) return std::nullopt;
    const std::uint64_t old_data = (32 + h + 63) / 64 * 64;
    const std::uint64_t new_data = (32 + json->size() + 63) / 64 * 64;
    ByteVec out(1 + 32);
    out[0] = in[0];
    std::memcpy(out.data() + 1, f.data(), 32);
    out.insert(out.end(), json->begin(), json->end());
    out.resize(1 + new_data, 0);
    if (old_data < f.size()) out.insert(out.end(), f.begin() + static_cast<std::ptrdiff_t>(old_data), f.end());
    unsigned char* fixed = out.data() + 1;
    put_le(fixed + 12, json->size(), 4);
    put_le(fixed + 16, out.size() - 1, 8);
    put_le(fixed + 24, io::Crc32::of(json->data(), json->size()), 4);
    put_le(fixed + 28, io::Crc32::of(fixed, 28), 4);
    return out;
}

// One of an llm.c header's first eight int32 fields set to an edge value.
inline std::optional<ByteVec> llmc_header(Bytes in, Rng& rng) {
    if (in.size() < 32) return std::nullopt;
    ByteVec out(in.begin(), in.end());
    const std::uint32_t edges[] = {0u, 1u, 2u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0x80000000u, 1u << 24, (1u << 24) + 1,
                                   static_cast<std::uint32_t>(in.size()), static_cast<std::uint32_t>(in.size() / 2),
                                   static_cast<std::uint32_t>(in.size() / 4), 50257u, 65535u, 65536u};
    const std::uint32_t v = edges[below(rng, std::size(edges))];
    put_le(out.data() + 4 * below(rng, 8), v, 4);
    return out;
}

// The structured mutation for `target`, or nothing.
inline std::optional<ByteVec> structured(std::string_view target, Bytes in, unsigned seed) {
    Rng rng(seed == 0 ? 1u : seed);
    if (target == "safetensors") return safetensors_json(in, rng);
    if (target == "hf_import") return hf_import_json(in, rng);
    if (target == "state_file") return state_file_json(in, rng);
    return llmc_header(in, rng);
}

}  // namespace snug::fuzz::mutate
