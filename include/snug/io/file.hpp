// Whole-file reads, reads at offsets (FileReader) and crash-safe writes: a file is written under a temporary
// name in the same directory and renamed over the target only once complete,
// so a crash or a full disk never leaves a half-written file behind.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include <sys/types.h>
#include <unistd.h>

#include "snug/core/error.hpp"

namespace snug::io {

// The whole file as bytes; FileError names the file and the reason.
inline std::vector<unsigned char> read_file(const std::filesystem::path& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) throw FileError(path.string() + ": cannot open for reading: " + std::strerror(errno));
    std::vector<unsigned char> data;
    unsigned char chunk[1 << 16];
    std::size_t got;
    while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) data.insert(data.end(), chunk, chunk + got);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) throw FileError(path.string() + ": read error");
    return data;
}

// Sink for atomic_write: appends bytes to the temporary file.
class FileWriter {
public:
    explicit FileWriter(std::FILE* f) : f_(f) {}
    void write(const void* data, std::size_t bytes) {
        if (bytes != 0 && std::fwrite(data, 1, bytes, f_) != bytes) failed_ = true;
    }
    bool failed() const { return failed_; }

private:
    std::FILE* f_;
    bool failed_ = false;
};

// Makes directory `dir` and its parents (nothing for one that exists, or for
// the empty path: the current directory). FileError "<name> <dir>: cannot
// create the directory: <reason>" otherwise, also when a file is in the way;
// `name` says whose directory it is (an option, "Hugging Face export").
inline void make_directories(const std::filesystem::path& dir, const std::string& name) {
    if (dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
        throw FileError(name + " " + dir.string() + ": cannot create the directory: " +
                        (ec ? ec.message() : std::string("a file of that name is in the way")));
}

// Writes `path` through `fill(writer)`: into "<path>.tmp-<pid>", flushed and
// synced, then renamed over `path`. On any failure (including an exception from
// `fill`) the temporary file is removed and `path` is left as it was.
inline void atomic_write(const std::filesystem::path& path, const std::function<void(FileWriter&)>& fill) {
    const std::filesystem::path tmp = path.string() + ".tmp-" + std::to_string(::getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) {
        // Named by the path the caller gave (the temporary name is ours).
        const std::string why = std::strerror(errno);
        const std::filesystem::path dir = path.parent_path();
        std::error_code ec;
        if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
            throw FileError(path.string() + ": cannot write the file: its directory " + dir.string() +
                            " does not exist (make it first)");
        throw FileError(path.string() + ": cannot write the file: " + why);
    }
    auto fail = [&](const std::string& why) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw FileError(path.string() + ": " + why + "; the previous file, if any, is unchanged");
    };
    FileWriter writer(f);
    try {
        fill(writer);
    } catch (...) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw;
    }
    if (writer.failed() || std::fflush(f) != 0) fail(std::string("write failed: ") + std::strerror(errno));
    if (::fsync(::fileno(f)) != 0) fail(std::string("sync failed: ") + std::strerror(errno));
    if (std::fclose(f) != 0) {
        std::remove(tmp.c_str());
        throw FileError(path.string() + ": close failed: " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        throw FileError(path.string() + ": rename from the temporary file failed: " + why);
    }
}

// A file opened for reading at given offsets (read_at), for formats whose
// sections are read where an index says; FileError names the file, and what
// was being read when it is truncated or fails.
class FileReader {
public:
    explicit FileReader(const std::filesystem::path& path) : name_(path.string()) {
        f_ = std::fopen(path.c_str(), "rb");
        if (f_ == nullptr) throw FileError(name_ + ": cannot open for reading: " + std::strerror(errno));
        if (std::fseek(f_, 0, SEEK_END) != 0 || (size_ = ftello(f_)) < 0) {
            std::fclose(f_);
            throw FileError(name_ + ": cannot determine the file size: " + std::strerror(errno));
        }
    }
    ~FileReader() { std::fclose(f_); }
    FileReader(const FileReader&) = delete;
    FileReader& operator=(const FileReader&) = delete;

    std::uint64_t size() const { return static_cast<std::uint64_t>(size_); }
    const std::string& name() const { return name_; }

    void read_at(std::uint64_t offset, void* dst, std::size_t n, const std::string& what) {
        if (offset + n > size())
            throw FileError(name_ + ": truncated: " + what + " needs bytes up to " + std::to_string(offset + n) +
                            ", the file has " + std::to_string(size()));
        if (offset != pos_ && fseeko(f_, static_cast<off_t>(offset), SEEK_SET) != 0)
            throw FileError(name_ + ": seek failed while reading " + what + ": " + std::strerror(errno));
        if (std::fread(dst, 1, n, f_) != n)
            throw FileError(name_ + ": read error in " + what + (std::ferror(f_) ? ": " : "") +
                            (std::ferror(f_) ? std::strerror(errno) : " (the file shrank)"));
        pos_ = offset + n;
    }

private:
    std::string name_;
    std::FILE* f_ = nullptr;
    off_t size_ = 0;
    std::uint64_t pos_ = ~std::uint64_t{0};
};

}  // namespace snug::io
