// JSON read from a file, checked: parse_json (malformed JSON names the file)
// and JsonFields, typed access to its values where a missing field, a value
// of the wrong type or one out of range throws FileError naming the file, the
// field's path and the value it holds. The readers of snug's files share it:
// the training-state header (train/state_file.hpp), safetensors headers
// (io/safetensors.hpp) and Hugging Face config.json (io/hf_export.hpp).
//
//   const io::JsonFields F(path, "header field");
//   const nlohmann::json& m = F.object(j, "model");                 // "model" must be an object
//   const int layers = F.i32(m, "n_layer", "model.", 1);            // "model.n_layer", an integer >= 1
//   // FileError: "state.snug: header field 'model.n_layer' is -3, not an integer in [1, 2147483647]"
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "snug/core/error.hpp"

namespace snug::io {

// A JSON value for an error message: its text, cut after `limit` characters.
inline std::string json_excerpt(const nlohmann::json& v, std::size_t limit = 80) {
    std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (s.size() > limit) s = s.substr(0, limit) + "... (" + std::to_string(s.size()) + " characters)";
    return s;
}

// Parses [begin, end) as JSON; FileError "<file>: malformed JSON <what>: ..."
// otherwise, and when the document is not an object.
template <class It>
nlohmann::json parse_json_object(const std::string& file, It begin, It end, const std::string& what = "") {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(begin, end);
    } catch (const nlohmann::json::exception& e) {
        throw FileError(file + ": malformed JSON" + (what.empty() ? "" : " " + what) + ": " + e.what());
    }
    if (!j.is_object()) throw FileError(file + ": " + (what.empty() ? "the JSON" : what) + " is not a JSON object");
    return j;
}

class JsonFields {
public:
    // `noun` names a value in messages: "<file>: <noun> '<path>' <why>".
    explicit JsonFields(std::string file, std::string noun = "field") : file_(std::move(file)), noun_(std::move(noun)) {}

    const std::string& file() const { return file_; }

    [[noreturn]] void fail(const std::string& path, const std::string& why) const {
        throw FileError(file_ + ": " + noun_ + " '" + path + "' " + why);
    }

    // ---- a value, named by its path ----

    const nlohmann::json& as_object(const nlohmann::json& v, const std::string& path) const {
        if (!v.is_object()) wrong(v, path, "an object");
        return v;
    }
    const nlohmann::json& as_array(const nlohmann::json& v, const std::string& path) const {
        if (!v.is_array()) wrong(v, path, "an array");
        return v;
    }
    std::string as_string(const nlohmann::json& v, const std::string& path) const {
        if (!v.is_string()) wrong(v, path, "a string");
        return v.get<std::string>();
    }
    double as_number(const nlohmann::json& v, const std::string& path) const {
        if (!v.is_number()) wrong(v, path, "a number");
        return v.get<double>();
    }
    // A number a 32-bit float holds (its range; the value rounded).
    float as_float32(const nlohmann::json& v, const std::string& path) const {
        const double d = as_number(v, path);
        if (std::abs(d) > static_cast<double>(std::numeric_limits<float>::max()))
            wrong(v, path, "a number in the range of a 32-bit float");
        return static_cast<float>(d);
    }
    // An integer >= 0 (JSON may spell it unsigned or signed).
    std::uint64_t as_u64(const nlohmann::json& v, const std::string& path) const {
        if (v.is_number_unsigned()) return v.get<std::uint64_t>();
        if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
        wrong(v, path, "an integer >= 0");
    }
    // An integer in [lo, hi] (0 <= hi).
    std::int64_t as_i64(const nlohmann::json& v, const std::string& path, std::int64_t lo, std::int64_t hi) const {
        bool in = false;
        std::int64_t out = 0;
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            in = u <= static_cast<std::uint64_t>(hi);
            if (in) out = static_cast<std::int64_t>(u);
            in = in && out >= lo;
        } else if (v.is_number_integer()) {
            out = v.get<std::int64_t>();
            in = out >= lo && out <= hi;
        }
        if (!in) wrong(v, path, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return out;
    }
    int as_i32(const nlohmann::json& v, const std::string& path, int lo = 0, int hi = INT_MAX) const {
        return static_cast<int>(as_i64(v, path, lo, hi));
    }

    // ---- a member of an object: `where` is the object's path with its dot ("model.") ----

    const nlohmann::json& at(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        const auto it = obj.find(key);
        if (it == obj.end()) fail(where + std::string(key), "is missing");
        return *it;
    }
    const nlohmann::json& object(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_object(at(obj, key, where), where + std::string(key));
    }
    const nlohmann::json& array(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_array(at(obj, key, where), where + std::string(key));
    }
    std::string string(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_string(at(obj, key, where), where + std::string(key));
    }
    double number(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_number(at(obj, key, where), where + std::string(key));
    }
    float float32(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_float32(at(obj, key, where), where + std::string(key));
    }
    std::uint64_t u64(const nlohmann::json& obj, std::string_view key, const std::string& where = "") const {
        return as_u64(at(obj, key, where), where + std::string(key));
    }
    std::int64_t i64(const nlohmann::json& obj, std::string_view key, const std::string& where, std::int64_t lo,
                     std::int64_t hi) const {
        return as_i64(at(obj, key, where), where + std::string(key), lo, hi);
    }
    int i32(const nlohmann::json& obj, std::string_view key, const std::string& where = "", int lo = 0,
            int hi = INT_MAX) const {
        return as_i32(at(obj, key, where), where + std::string(key), lo, hi);
    }

private:
    [[noreturn]] void wrong(const nlohmann::json& v, const std::string& path, const std::string& wanted) const {
        fail(path, "is " + json_excerpt(v) + ", not " + wanted);
    }

    std::string file_;
    std::string noun_;
};

}  // namespace snug::io
