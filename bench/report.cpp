#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <vector>

#include "attend/error.h"
#include "runtime/json.h"

namespace attend::bench {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string pad(std::string s, std::size_t width, bool left) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return left ? s + fill : fill + s;
}

// Shortest text that reads back as the same double (JSON and CSV numbers).
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  for (int precision = 6; precision < 17; ++precision) {
    char shorter[40];
    std::snprintf(shorter, sizeof shorter, "%.*g", precision, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::string json_string(const std::string& s) { return detail::json_quote(s); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  return s;
}

// The fields of a row, in CSV column order, as (name, text, is_number) so that
// CSV and JSON stay the same list.
struct Field {
  const char* name;
  std::string text;
  bool bare;  // JSON: written unquoted (numbers, booleans; empty text is null)
};

std::vector<Field> row_fields(const Row& r) {
  const AttentionSpec& s = r.spec;
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  const auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  return {
      {"problem", r.problem, false},
      {"batch", i(s.batch), true},
      {"seqlen_q", i(s.seqlen_q), true},
      {"seqlen_kv", i(s.seqlen_kv), true},
      {"heads_q", i(s.heads_q), true},
      {"heads_kv", i(s.heads_kv), true},
      {"head_dim_qk", i(s.head_dim_qk), true},
      {"head_dim_v", i(s.head_dim_v), true},
      {"causal", b(s.causal), true},
      {"window_left", i(s.window_left), true},
      {"window_right", i(s.effective_window_right()), true},
      {"impl", std::string(to_string(r.impl)), false},
      {"pass", std::string(to_string(r.pass)), false},
      {"ms", exact(r.timing.best_s * 1e3), true},
      {"median_ms", exact(r.timing.median_s * 1e3), true},
      {"reps", std::to_string(r.timing.reps), true},
      {"flops", i(r.flops), true},
      {"gflops", exact(r.gflops), true},
      {"vs_sgemm", exact(r.vs_sgemm), true},
      {"vs_unfused", std::isnan(r.vs_unfused) ? std::string() : exact(r.vs_unfused), true},
      {"extra_bytes", std::to_string(r.extra_bytes), true},
      {"extra_mib", exact(static_cast<double>(r.extra_bytes) / kMiB), true},
      {"vs_bf16_gemm", std::isnan(r.vs_bf16_gemm) ? std::string() : exact(r.vs_bf16_gemm), true},
      {"vs_amx_peak", std::isnan(r.vs_amx_peak) ? std::string() : exact(r.vs_amx_peak), true},
  };
}

std::vector<Field> header_fields(const Header& h) {
  return {
      {"threads", std::to_string(h.threads), true},
      {"blas_threads", std::to_string(h.blas_threads), true},
      {"flash_isa", h.flash_isa, false},
      {"sgemm_n", std::to_string(h.sgemm.n), true},
      {"sgemm_gflops", exact(h.sgemm.gflops), true},
      {"bf16_gemm_n", std::to_string(h.bf16_gemm.n), true},
      {"bf16_gemm_gflops", h.bf16_gemm.measured() ? exact(h.bf16_gemm.gflops) : std::string(), true},
      {"bf16_gemm_impl", h.bf16_gemm.impl, false},
      {"amx_peak_gflops", h.amx.measured() ? exact(h.amx.gflops) : std::string(), true},
      {"amx_peak_missing", h.amx.missing, false},
      {"blas_config", trimmed(h.blas_config), false},  // free text: last
  };
}

// Creates missing parent directories, as --save does for `attend run`.
std::ofstream open_for_writing(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) throw Error(ErrorCode::io, "path", path, "cannot create the directory: " + ec.message());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorCode::io, "path", path, "cannot open the file for writing");
  return out;
}

void finish(std::ofstream& out, const std::string& path) {
  out.flush();
  if (!out) throw Error(ErrorCode::io, "path", path, "writing the file failed");
}

}  // namespace

void print_report(std::ostream& os, const Report& report) {
  const Header& h = report.header;
  os << "threads: " << h.threads << " (OpenMP), blas_threads: " << h.blas_threads << "\n"
     << "flash_isa: " << h.flash_isa << "\n"
     << "blas_config: " << trimmed(h.blas_config) << "\n"
     << "sgemm_peak: " << fmt("%.1f", h.sgemm.gflops) << " GFLOP/s (n=" << h.sgemm.n << ", best of " << h.sgemm.reps
     << ", " << fmt("%.3f", h.sgemm.best_s * 1e3) << " ms)"
     << (h.blas_pinned.empty() ? "" : " [pinned: " + h.blas_pinned + "]") << "\n";
  if (h.bf16_gemm.measured()) {
    os << "bf16_gemm_peak: " << fmt("%.1f", h.bf16_gemm.gflops) << " GFLOP/s (n=" << h.bf16_gemm.n << ", best of "
       << h.bf16_gemm.reps << ", " << fmt("%.3f", h.bf16_gemm.best_s * 1e3) << " ms, oneDNN " << h.bf16_gemm.impl
       << ")\n";
  } else if (!h.bf16_gemm.impl.empty()) {
    os << "bf16_gemm_peak: - (" << h.bf16_gemm.impl << ")\n";
  }
  if (h.amx.measured()) {
    os << "amx_peak: " << fmt("%.1f", h.amx.gflops) << " GFLOP/s (TDPBF16PS on tiles in registers, " << h.amx.threads
       << " threads, best of " << h.amx.reps << ", " << fmt("%.3f", h.amx.best_s * 1e3) << " ms)\n";
  } else if (!h.amx.missing.empty()) {
    os << "amx_peak: - (" << h.amx.missing << ")\n";
  }
  if (!h.blas_pinned.empty()) {
    os << "warning: OpenBLAS is pinned by " << h.blas_pinned
       << ": the sgemm baseline (and unfused) run that kernel, not the one OpenBLAS picks for this CPU, so "
          "vs_sgemm and vs_unfused may mislead; use bench/run.sh or unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE\n";
  }

  std::size_t problem_width = 28;
  for (const Row& r : report.rows) problem_width = std::max(problem_width, r.problem.size());
  os << pad("problem", problem_width, true) << "  " << pad("impl", 9, true) << " " << pad("pass", 8, true) << " "
     << pad("ms", 11, false) << " " << pad("GFLOP/s", 9, false) << " " << pad("vs_sgemm", 8, false) << " "
     << pad("vs_unfused", 10, false) << " " << pad("extra_MiB", 10, false) << " " << pad("vs_bf16gemm", 11, false)
     << " " << pad("vs_amx_peak", 11, false) << "\n";
  for (const Row& r : report.rows) {
    os << pad(r.problem, problem_width, true) << "  " << pad(std::string(to_string(r.impl)), 9, true) << " "
       << pad(std::string(to_string(r.pass)), 8, true) << " " << pad(fmt("%.3f", r.timing.best_s * 1e3), 11, false)
       << " " << pad(fmt("%.1f", r.gflops), 9, false) << " " << pad(fmt("%.2f", r.vs_sgemm), 8, false) << " "
       << pad(std::isnan(r.vs_unfused) ? "-" : fmt("%.2f", r.vs_unfused), 10, false) << " "
       << pad(fmt("%.2f", static_cast<double>(r.extra_bytes) / kMiB), 10, false) << " "
       << pad(std::isnan(r.vs_bf16_gemm) ? "-" : fmt("%.2f", r.vs_bf16_gemm), 11, false) << " "
       << pad(std::isnan(r.vs_amx_peak) ? "-" : fmt("%.2f", r.vs_amx_peak), 11, false) << "\n";
  }
  for (const std::string& note : report.notes) os << "note: " << note << "\n";
  for (const Row& r : report.rows) {
    if (!r.noisy()) continue;
    os << "warning: noisy: " << r.problem << " " << to_string(r.impl) << " " << to_string(r.pass) << ": best "
       << fmt("%.3f", r.timing.best_s * 1e3) << " ms is " << fmt("%.1f", r.timing.median_s / r.timing.best_s)
       << "x below the median " << fmt("%.3f", r.timing.median_s * 1e3) << " ms (" << r.timing.reps
       << " runs); its ratios are not reliable: rerun on a quieter machine or with a larger --min-time\n";
  }
}

void write_csv(const std::string& path, const Report& report) {
  std::ofstream out = open_for_writing(path);
  const std::vector<Field> head = header_fields(report.header);
  std::string names, values;
  for (const Field& f : row_fields(Row{})) names += std::string(names.empty() ? "" : ",") + f.name;
  for (const Field& f : head) {
    names += std::string(",") + f.name;
    values += "," + csv_field(f.text);
  }
  out << names << "\n";
  for (const Row& r : report.rows) {
    std::string line;
    for (const Field& f : row_fields(r)) line += (line.empty() ? "" : ",") + csv_field(f.text);
    out << line << values << "\n";
  }
  finish(out, path);
}

void write_json(const std::string& path, const Report& report) {
  std::ostringstream js;
  const auto value = [](const Field& f) {
    if (!f.bare) return json_string(f.text);
    return f.text.empty() ? std::string("null") : f.text;
  };
  js << "{\n  \"format\": " << json_string(kFormat) << ",\n  \"header\": {";
  const std::vector<Field> head = header_fields(report.header);
  for (std::size_t i = 0; i < head.size(); ++i) {
    js << (i ? ", " : "") << json_string(head[i].name) << ": " << value(head[i]);
  }
  js << ", \"sgemm_best_ms\": " << exact(report.header.sgemm.best_s * 1e3)
     << ", \"sgemm_reps\": " << report.header.sgemm.reps << "},\n  \"rows\": [";
  for (std::size_t r = 0; r < report.rows.size(); ++r) {
    js << (r ? ",\n    {" : "\n    {");
    const std::vector<Field> fields = row_fields(report.rows[r]);
    for (std::size_t i = 0; i < fields.size(); ++i) {
      js << (i ? ", " : "") << json_string(fields[i].name) << ": " << value(fields[i]);
    }
    js << "}";
  }
  js << (report.rows.empty() ? "],\n" : "\n  ],\n") << "  \"notes\": [";
  for (std::size_t n = 0; n < report.notes.size(); ++n) js << (n ? ", " : "") << json_string(report.notes[n]);
  js << "]\n}\n";
  std::ofstream out = open_for_writing(path);
  out << js.str();
  finish(out, path);
}

}  // namespace attend::bench
