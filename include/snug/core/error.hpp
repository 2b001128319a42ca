// The exception hierarchy: every error snug throws derives from snug::Error,
// so a trainer can catch one type; subclasses name the kind of problem.
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace snug {

// Base of every exception the library throws.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Two tensor shapes that had to agree did not (the message names both).
class ShapeError : public Error {
public:
    using Error::Error;
};

// An allocation would pass the MemoryTracker's budget (the message holds the
// request and the per-category breakdown).
class OutOfMemory : public Error {
public:
    using Error::Error;
};

// A CUDA runtime, driver or cuBLAS call failed (message: call site and the
// library's own text).
class CudaError : public Error {
public:
    using Error::Error;
};

// CUDA work was asked for where no CUDA device exists.
class NoCudaDevice : public CudaError {
public:
    using CudaError::CudaError;
};

// A file could not be read or written, or its content is not what it should be.
class FileError : public Error {
public:
    using Error::Error;
};

// A configuration value is out of range or malformed (budgets, presets, flags).
class ConfigError : public Error {
public:
    using Error::Error;
};

namespace detail {

// "file.hpp:42: " prefix for messages that point at a call site.
inline std::string where(const std::source_location& loc) {
    std::string file = loc.file_name();
    if (auto slash = file.find_last_of('/'); slash != std::string::npos) file.erase(0, slash + 1);
    return file + ":" + std::to_string(loc.line()) + ": ";
}

}  // namespace detail
}  // namespace snug
