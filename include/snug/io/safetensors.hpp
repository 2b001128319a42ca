// Reading and writing safetensors files (the Hugging Face tensor format: an
// 8-byte little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the raw data). Used for the PyTorch parity
// reference and for exporting models to the Python ecosystem.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/io/json_fields.hpp"

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/io/file.hpp"
#include "snug/io/json_fields.hpp"

namespace snug::io {

// One tensor of a safetensors file: dtype, shape and its bytes.
struct SafeTensor {
    DType dtype;
    std::vector<std::int64_t> shape;
    std::vector<unsigned char> bytes;

    std::int64_t numel() const {
        for (std::int64_t d : shape)
            if (d == 0) return 0;  // before any product that could overflow
        std::int64_t n = 1;
        for (std::int64_t d : shape) n *= d;
        return n;
    }
    std::string shape_str() const {
        std::string s = "(";
        for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
        return s + ")";
    }
};

namespace detail {

inline DType safetensors_dtype(const std::string& name, const std::string& file, const std::string& tensor) {
    if (name == "F32") return DType::f32;
    if (name == "F64") return DType::f64;
    if (name == "F16") return DType::f16;
    if (name == "BF16") return DType::bf16;
    if (name == "I32") return DType::i32;
    if (name == "U16") return DType::u16;
    if (name == "U8") return DType::u8;
    throw FileError(file + ": tensor '" + tensor + "' has dtype " + name + ", which snug does not read");
}

inline const char* safetensors_dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "F32";
        case DType::f64: return "F64";
        case DType::f16: return "F16";
        case DType::bf16: return "BF16";
        case DType::i32: return "I32";
        case DType::u16: return "U16";
        case DType::u8: return "U8";
    }
    throw Error("unknown dtype");
}

}  // namespace detail

// A whole safetensors file in memory.
class SafetensorsFile {
public:
    // Reads and validates `path`: a truncated file, a malformed header (an
    // entry or a field of the wrong JSON type, a negative or fractional
    // dimension, a shape whose byte count overflows, metadata that is not
    // strings), a byte range outside the data or two tensors sharing bytes
    // throw FileError naming the file and the tensor.
    explicit SafetensorsFile(const std::filesystem::path& path) : path_(path.string()) {
        const std::vector<unsigned char> data = read_file(path);
        if (data.size() < 8) throw FileError(path_ + ": too short for a safetensors file (" +
                                             std::to_string(data.size()) + " bytes)");
        std::uint64_t header_len = 0;
        for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[static_cast<std::size_t>(i)];
        if (header_len > data.size() - 8)
            throw FileError(path_ + ": header length " + std::to_string(header_len) + " runs past the end of the " +
                            std::to_string(data.size()) + "-byte file (truncated?)");
        const nlohmann::json header = parse_json_object(
            path_, data.begin() + 8, data.begin() + 8 + static_cast<std::ptrdiff_t>(header_len), "safetensors header");
        const std::size_t base = 8 + static_cast<std::size_t>(header_len);
        const std::size_t data_len = data.size() - base;
        struct Range {
            std::uint64_t begin, end;
            const std::string* name;
        };
        std::vector<Range> ranges;
        for (auto& [name, entry] : header.items()) {
            if (name == "__metadata__") {
                if (!entry.is_object())
                    throw FileError(path_ + ": __metadata__ is " + std::string(entry.type_name()) +
                                    ", not an object of strings");
                for (auto& [k, v] : entry.items()) {
                    if (!v.is_string())
                        throw FileError(path_ + ": __metadata__ entry '" + k + "' is " + std::string(v.type_name()) +
                                        ", not a string");
                    metadata_[k] = v.get<std::string>();
                }
                continue;
            }
            auto fail = [&](const std::string& what) { throw FileError(path_ + ": tensor '" + name + "' " + what); };
            const JsonFields F(path_, "tensor '" + name + "' field");
            if (!entry.is_object()) fail("has a malformed entry: " + json_excerpt(entry) + ", not an object");
            SafeTensor t;
            t.dtype = detail::safetensors_dtype(F.string(entry, "dtype"), path_, name);
            const nlohmann::json& shape = F.array(entry, "shape");
            // The element count and byte count, computed without overflow: a
            // product past 2^64 is an error unless a dimension is 0.
            std::uint64_t numel = 1;
            bool overflow = false, empty = false;
            for (std::size_t i = 0; i < shape.size(); ++i) {
                const std::uint64_t n = F.as_u64(shape[i], "shape[" + std::to_string(i) + "]");
                if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
                    fail("has dimension " + std::to_string(n) + ", more than a 64-bit signed count holds");
                t.shape.push_back(static_cast<std::int64_t>(n));
                if (n == 0) empty = true;
                if (n != 0 && numel > std::numeric_limits<std::uint64_t>::max() / n) overflow = true;
                numel *= n;
            }
            const std::size_t elem = dtype_size(t.dtype);
            if (empty) {  // a zero dimension: no elements, whatever the others are
                numel = 0;
                overflow = false;
            }
            if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / elem)
                fail("of shape " + t.shape_str() + " has more bytes than a 64-bit count holds");
            const nlohmann::json& offsets = F.array(entry, "data_offsets");
            if (offsets.size() != 2) fail("has data_offsets " + json_excerpt(offsets) + ", not a pair [begin, end]");
            const std::uint64_t begin = F.as_u64(offsets[0], "data_offsets[0]");
            const std::uint64_t end = F.as_u64(offsets[1], "data_offsets[1]");
            if (begin > end || end > data_len)
                fail("has byte range [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside the " +
                     std::to_string(data_len) + " bytes of data (truncated?)");
            if (end - begin != numel * elem)
                fail("of shape " + t.shape_str() + " has " + std::to_string(end - begin) + " bytes, expected " +
                     std::to_string(numel * elem));
            t.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(base + begin),
                           data.begin() + static_cast<std::ptrdiff_t>(base + end));
            const auto placed = tensors_.emplace(name, std::move(t)).first;
            if (begin != end) ranges.push_back({begin, end, &placed->first});
        }
        // Two tensors may not share bytes.
        std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
        for (std::size_t i = 1; i < ranges.size(); ++i)
            if (ranges[i].begin < ranges[i - 1].end)
                throw FileError(path_ + ": tensors '" + *ranges[i - 1].name + "' (bytes [" +
                                std::to_string(ranges[i - 1].begin) + ", " + std::to_string(ranges[i - 1].end) +
                                ")) and '" + *ranges[i].name + "' (bytes [" + std::to_string(ranges[i].begin) +
                                ", " + std::to_string(ranges[i].end) + ")) overlap");
    }

    const std::string& path() const { return path_; }
    bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
    const std::map<std::string, SafeTensor>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    const SafeTensor& at(const std::string& name) const {
        auto it = tensors_.find(name);
        if (it == tensors_.end()) throw FileError(path_ + ": no tensor named '" + name + "'");
        return it->second;
    }

    // A tensor's values converted to Out (float or double from any float dtype,
    // int32 from I32). Wrong dtype kinds throw FileError.
    template <class Out>
    std::vector<Out> values(const std::string& name) const {
        const SafeTensor& t = at(name);
        const std::size_t n = static_cast<std::size_t>(t.numel());
        std::vector<Out> out(n);
        auto load = [&](auto tag) {
            using S = decltype(tag);
            for (std::size_t i = 0; i < n; ++i) {
                S s;
                std::memcpy(&s, t.bytes.data() + i * sizeof(S), sizeof(S));
                if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>)
                    out[i] = static_cast<Out>(static_cast<float>(s));
                else
                    out[i] = static_cast<Out>(s);
            }
        };
        if constexpr (std::is_floating_point_v<Out>) {
            switch (t.dtype) {
                case DType::f32: load(float{}); return out;
                case DType::f64: load(double{}); return out;
                case DType::f16: load(half{}); return out;
                case DType::bf16: load(bfloat16{}); return out;
                default: break;
            }
        } else {
            if (t.dtype == DType::i32) { load(std::int32_t{}); return out; }
        }
        throw FileError(path_ + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t.dtype)) +
                        ", which cannot be read as the requested type");
    }

    // The metadata value for `key`; a missing key throws FileError naming it.
    const std::string& meta(const std::string& key) const {
        auto it = metadata_.find(key);
        if (it == metadata_.end()) throw FileError(path_ + ": no metadata entry '" + key + "'");
        return it->second;
    }

private:
    std::string path_;
    std::map<std::string, SafeTensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

// Writes tensors (name -> SafeTensor) and string metadata as a safetensors
// file, atomically (temporary file, then rename).
inline void write_safetensors(const std::filesystem::path& path, const std::map<std::string, SafeTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
        if (t.bytes.size() != static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype))
            throw ShapeError("safetensors tensor '" + name + "': " + std::to_string(t.bytes.size()) +
                             " bytes do not match shape " + t.shape_str());
        header[name] = {{"dtype", detail::safetensors_dtype_name(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + t.bytes.size()}}};
        offset += t.bytes.size();
    }
    std::string head = header.dump();
    head.append((8 - head.size() % 8) % 8, ' ');
    atomic_write(path, [&](FileWriter& w) {
        unsigned char len[8];
        std::uint64_t n = head.size();
        for (unsigned char& b : len) {
            b = static_cast<unsigned char>(n & 0xff);
            n >>= 8;
        }
        w.write(len, 8);
        w.write(head.data(), head.size());
        for (const auto& [name, t] : tensors) w.write(t.bytes.data(), t.bytes.size());
    });
}

}  // namespace snug::io
