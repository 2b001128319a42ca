// What custom_layer prints: every event the engine reports, as text
// (snug::TextReport, formatted with fmt). A file of its own because nvcc,
// which compiles main.cu, cannot compile fmt.
#include <memory>

#include "snug/report/text_report.hpp"

std::unique_ptr<snug::Report> make_report() { return std::make_unique<snug::TextReport>(); }
