// The benchmark's output: the stdout table and the CSV / JSON files. The
// format is stable — scripts parse it; bench/README.md documents every field.
// Change it only by adding fields (and bump kFormat when a field changes meaning).
#pragma once

#include <iosfwd>
#include <string>

#include "harness.h"

namespace attend::bench {

inline constexpr const char* kFormat = "attend-bench/1";

// Header lines (threads, blas_threads, flash_isa, blas_config, sgemm_peak,
// bf16_gemm_peak and amx_peak when measured or said why not, and a "warning: "
// line when OpenBLAS is pinned), the table (problem | impl | pass | ms | GFLOP/s
// | vs_sgemm | vs_unfused | extra_MiB | vs_bf16gemm | vs_amx_peak), one "note: " line per
// skipped measurement and one "warning: noisy: " line per Row::noisy() row.
void print_report(std::ostream& os, const Report& report);

// One header line, then one line per row; the run's header values are repeated
// on every row. Throws attend::Error(io) when the file cannot be written.
void write_csv(const std::string& path, const Report& report);
// {"format", "header", "rows", "notes"}. Throws attend::Error(io) likewise.
void write_json(const std::string& path, const Report& report);

}  // namespace attend::bench
