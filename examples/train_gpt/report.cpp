// What train_gpt prints: every event the engine reports, as text (TextReport,
// formatted with fmt). A file of its own because it is always host code: in a
// CUDA build main.cpp is compiled by nvcc, which cannot compile fmt.
#include <memory>

#include "snug/report/text_report.hpp"

std::unique_ptr<snug::Report> make_report() { return std::make_unique<snug::TextReport>(); }
