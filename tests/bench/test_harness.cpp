// The harness measures every requested (problem, impl, pass), pairs each row
// with the unfused row of the same problem and pass, skips what cannot or
// should not run with a note, and writes the documented CSV/JSON fields.
// Structure only: no assertion here depends on how fast anything ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "attend/kvcache.h"
#include "bench/amx_peak.h"
#include "bench/harness.h"
#include "bench/report.h"
#include "cpu/isa.h"
#include "runtime/flops.h"
#include "support/tensors.h"

namespace {

using attend::AttentionSpec;
using attend::Pass;
namespace ab = attend::bench;
namespace t = attend::testing;

AttentionSpec tiny(bool causal = false) {
  AttentionSpec s;
  s.batch = 1;
  s.seqlen_q = s.seqlen_kv = 32;
  s.heads_q = s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = 16;
  s.causal = causal;
  return s;
}

ab::HarnessOptions fast_options(std::vector<ab::Impl> impls) {
  ab::HarnessOptions o;
  o.impls = std::move(impls);
  o.timing.min_time = 0.0;
  o.timing.min_reps = 1;
  o.make_tensors = [](const AttentionSpec& s) {
    const t::Problem p = t::make_problem(s, 3);
    ab::ProblemTensors d;
    d.q = p.q;
    d.k = p.k;
    d.v = p.v;
    d.dout = p.dout;
    return d;
  };
  return o;
}

ab::Header fake_header() {
  ab::SgemmPeak peak;
  peak.n = 64;
  peak.gflops = 100.0;
  peak.best_s = 1e-3;
  peak.reps = 5;
  ab::Header h = ab::make_header(peak);
  h.blas_config = "OpenBLAS test, with \"quotes\"";
  return h;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fields of one CSV line (RFC 4180 quoting).
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

TEST(BenchHarness, EveryImplAndPassGetsARowPairedWithUnfused) {
  const ab::Report r = ab::run_benchmarks({tiny(), tiny(true)}, fast_options({ab::Impl::flash, ab::Impl::reference,
                                                                              ab::Impl::unfused}),
                                          fake_header());
  ASSERT_EQ(r.rows.size(), 12u);
  EXPECT_TRUE(r.notes.empty());
  for (const ab::Row& row : r.rows) {
    EXPECT_GT(row.timing.best_s, 0.0);
    EXPECT_GE(row.timing.median_s, row.timing.best_s);
    EXPECT_FALSE(std::isnan(row.vs_unfused)) << row.problem;
    EXPECT_DOUBLE_EQ(row.vs_sgemm, row.gflops / 100.0);
    if (row.impl == ab::Impl::unfused) {
      EXPECT_DOUBLE_EQ(row.vs_unfused, 1.0);
    }
  }
  // The exact-pairs FLOP count: 4*S*S*D*H forward, 10*S*S*D*H backward, and
  // (S+1)/(2S) of that under the causal mask.
  EXPECT_EQ(r.rows[0].flops, 4 * 32 * 32 * 16 * 2);
  EXPECT_EQ(r.rows[1].flops, 10 * 32 * 32 * 16 * 2);
  EXPECT_EQ(r.rows[6].flops, 4 * (32 * 33 / 2) * 16 * 2);
  EXPECT_EQ(r.rows[0].problem, "B=1 H=2 D=16 S=32");
  EXPECT_EQ(r.rows[6].problem, "B=1 H=2 D=16 S=32 causal");
}

TEST(BenchHarness, LargeProblemsSkipTheReferenceUnlessForced) {
  ab::HarnessOptions o = fast_options({ab::Impl::flash, ab::Impl::reference});
  o.passes = {Pass::forward};
  o.reference_max_work = 1024;  // tiny() has 1*2*32*32 = 2048
  ab::Report r = ab::run_benchmarks({tiny()}, o, fake_header());
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].impl, ab::Impl::flash);
  EXPECT_TRUE(std::isnan(r.rows[0].vs_unfused));  // unfused was not asked for
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("reference skipped"), std::string::npos);
  o.force_reference = true;
  r = ab::run_benchmarks({tiny()}, o, fake_header());
  EXPECT_EQ(r.rows.size(), 2u);
}

TEST(BenchHarness, UnsupportedProblemsAreSkippedWithTheReason) {
  AttentionSpec s = tiny();
  s.softcap = 10.0;
  const ab::Report r = ab::run_benchmarks({s}, fast_options({ab::Impl::flash, ab::Impl::unfused}), fake_header());
  ASSERT_EQ(r.rows.size(), 2u);  // flash forward and backward
  ASSERT_EQ(r.notes.size(), 1u);  // unfused, once for both passes
  EXPECT_NE(r.notes[0].find("softcap"), std::string::npos);
}

// `attend bench --kv-cache` crashed: the harness handed the kernels (and the
// FLOP count) paged K/V without the cache's block table and lengths.
TEST(BenchHarness, KvCacheProblemIsMeasuredForwardAndOtherwiseSkippedWithNotes) {
  AttentionSpec s = tiny(true);
  s.batch = 2;
  s.seqlen_q = 4;
  s.kv_page_size = 8;
  ab::HarnessOptions o = fast_options({ab::Impl::flash, ab::Impl::reference, ab::Impl::unfused});
  o.make_tensors = [](const AttentionSpec& spec) {
    attend::AttentionSpec dense = spec;
    dense.kv_page_size = 0;
    const t::Problem p = t::make_problem(dense, 3);
    attend::KVCache cache({.batch = spec.batch,
                           .heads_kv = spec.heads_kv,
                           .head_dim_qk = spec.head_dim_qk,
                           .head_dim_v = spec.head_dim_v,
                           .max_seqlen = spec.seqlen_kv,
                           .page_size = spec.kv_page_size});
    const std::vector<std::int64_t> counts{spec.seqlen_kv, spec.seqlen_kv / 2};
    cache.append(p.k, p.v, counts);
    ab::ProblemTensors d;
    d.q = p.q;
    d.dout = p.dout;
    d.cache = std::make_shared<const attend::KVCache>(std::move(cache));
    return d;
  };
  const ab::Report r = ab::run_benchmarks({s}, o, fake_header());
  ASSERT_EQ(r.rows.size(), 2u);  // flash and reference forward; no backward through a cache
  for (const ab::Row& row : r.rows) EXPECT_EQ(row.pass, Pass::forward);
  // Causal bottom-right per sequence: 4 queries over 32 and 16 keys.
  EXPECT_EQ(r.rows[0].flops, 4 * ((29 + 30 + 31 + 32) + (13 + 14 + 15 + 16)) * 16 * 2);
  std::string notes;
  for (const std::string& n : r.notes) notes += n + "\n";
  EXPECT_NE(notes.find("flash backward skipped"), std::string::npos) << notes;
  EXPECT_NE(notes.find("unfused skipped"), std::string::npos) << notes;
}

TEST(BenchHarness, PagedPairCountWithoutCacheLengthsIsAnError) {
  AttentionSpec s = tiny();
  s.kv_page_size = 8;
  EXPECT_THROW((void)attend::detail::visible_pairs(s, attend::Inputs{}), attend::Error);
}

TEST(BenchReport, PinnedOpenBlasIsLabelledAndWarnedAbout) {
  EXPECT_EQ(ab::blas_pinning(nullptr, nullptr), "");
  EXPECT_EQ(ab::blas_pinning("Haswell", "262144"), "OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=262144");
  ab::Report r;
  r.header = fake_header();
  r.header.blas_pinned = ab::blas_pinning("Haswell", nullptr);
  std::ostringstream os;
  ab::print_report(os, r);
  EXPECT_NE(os.str().find("ms) [pinned: OPENBLAS_CORETYPE=Haswell]\n"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("\nwarning: OpenBLAS is pinned by OPENBLAS_CORETYPE=Haswell"), std::string::npos);
  EXPECT_NE(os.str().find("bench/run.sh"), std::string::npos);
  r.header.blas_pinned.clear();
  std::ostringstream plain;
  ab::print_report(plain, r);
  EXPECT_EQ(plain.str().find("warning"), std::string::npos) << plain.str();
}

TEST(BenchReport, RowsWhoseMedianIsFarAboveTheBestAreFlagged) {
  ab::Report r;
  r.header = fake_header();
  ab::Row calm, noisy;
  calm.problem = "calm";
  calm.timing = {1e-3, 1.5e-3, 5};
  noisy.problem = "noisy";
  noisy.timing = {1e-3, 8e-3, 5};
  r.rows = {calm, noisy};
  EXPECT_FALSE(calm.noisy());
  EXPECT_TRUE(noisy.noisy());
  std::ostringstream os;
  ab::print_report(os, r);
  EXPECT_NE(os.str().find("\nwarning: noisy: noisy flash forward: best 1.000 ms is 8.0x below the median 8.000 ms"),
            std::string::npos)
      << os.str();
  EXPECT_EQ(os.str().find("noisy: calm"), std::string::npos);
}

// bf16 rows are measured against the bf16 GEMM peak as well; other dtypes
// and runs without a measured peak carry none.
TEST(BenchHarness, Bf16RowsCarryTheirRatioToTheBf16GemmPeak) {
  ab::HarnessOptions o = fast_options({ab::Impl::flash});
  o.passes = {Pass::forward};
  AttentionSpec bf16 = tiny();
  bf16.dtype = attend::DType::bf16;
  ab::Header h = fake_header();
  h.bf16_gemm.n = 64;
  h.bf16_gemm.gflops = 50.0;
  h.bf16_gemm.best_s = 1e-3;
  h.bf16_gemm.reps = 5;
  h.bf16_gemm.impl = "test:impl";
  const ab::Report r = ab::run_benchmarks({tiny(), bf16}, o, h);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_TRUE(std::isnan(r.rows[0].vs_bf16_gemm));
  EXPECT_DOUBLE_EQ(r.rows[1].vs_bf16_gemm, r.rows[1].gflops / 50.0);
  std::ostringstream table;
  ab::print_report(table, r);
  EXPECT_NE(table.str().find("bf16_gemm_peak: 50.0 GFLOP/s (n=64, best of 5, 1.000 ms, oneDNN test:impl)"),
            std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find("vs_bf16gemm"), std::string::npos);

  const ab::Report unmeasured = ab::run_benchmarks({bf16}, o, fake_header());
  ASSERT_EQ(unmeasured.rows.size(), 1u);
  EXPECT_TRUE(std::isnan(unmeasured.rows[0].vs_bf16_gemm));
}

// bf16 rows carry their share of the AMX unit's register-only rate; f32 rows
// and runs without a measured AMX peak print "-" and write an empty field.
TEST(BenchHarness, Bf16RowsCarryTheirShareOfTheAmxPeak) {
  ab::HarnessOptions o = fast_options({ab::Impl::flash});
  o.passes = {Pass::forward};
  AttentionSpec bf16 = tiny();
  bf16.dtype = attend::DType::bf16;
  ab::Header h = fake_header();
  h.amx.threads = 2;
  h.amx.trips = 1024;
  h.amx.gflops = 400.0;
  h.amx.best_s = 2e-3;
  h.amx.reps = 7;
  const ab::Report r = ab::run_benchmarks({tiny(), bf16}, o, h);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_TRUE(std::isnan(r.rows[0].vs_amx_peak));
  EXPECT_DOUBLE_EQ(r.rows[1].vs_amx_peak, r.rows[1].gflops / 400.0);
  std::ostringstream table;
  ab::print_report(table, r);
  EXPECT_NE(table.str().find("\namx_peak: 400.0 GFLOP/s (TDPBF16PS on tiles in registers, 2 threads, best of 7, "
                             "2.000 ms)\n"),
            std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find(" vs_bf16gemm vs_amx_peak\n"), std::string::npos) << table.str();
  char bf16_ratio[32];
  // The last two columns: vs_bf16gemm "-" (no bf16 GEMM peak here), then the ratio.
  std::snprintf(bf16_ratio, sizeof bf16_ratio, " -%12.2f\n", r.rows[1].vs_amx_peak);
  EXPECT_NE(table.str().find(bf16_ratio), std::string::npos) << table.str();

  // Where AMX is not allowed: the header says why, every row's column is "-".
  ab::Header no_amx = fake_header();
  no_amx.amx.missing = "this CPU or OS does not allow AMX-BF16 tiles";
  const ab::Report without = ab::run_benchmarks({bf16}, o, no_amx);
  ASSERT_EQ(without.rows.size(), 1u);
  EXPECT_TRUE(std::isnan(without.rows[0].vs_amx_peak));
  std::ostringstream dash;
  ab::print_report(dash, without);
  EXPECT_NE(dash.str().find("\namx_peak: - (this CPU or OS does not allow AMX-BF16 tiles)\n"), std::string::npos)
      << dash.str();
  EXPECT_NE(dash.str().find(" -           -\n"), std::string::npos) << dash.str();
  // No bf16 row asked for a peak: no line at all.
  std::ostringstream none;
  ab::print_report(none, ab::run_benchmarks({tiny()}, o, fake_header()));
  EXPECT_EQ(none.str().find("amx_peak:"), std::string::npos) << none.str();
}

TEST(BenchHarness, RatioToAnUnmeasuredAmxPeakIsNaN) {
  ab::AmxPeak peak;
  EXPECT_TRUE(std::isnan(ab::ratio_to_amx_peak(120.0, peak)));
  peak.gflops = 480.0;
  EXPECT_DOUBLE_EQ(ab::ratio_to_amx_peak(120.0, peak), 0.25);
}

// Where the CPU or OS allows AMX the loop runs and its sums are checked (a
// tile configuration the instructions ignored reports "missing", not a rate);
// elsewhere the figure is absent with the probe's own reason. No rate is
// asserted.
TEST(BenchHarness, AmxPeakIsMeasuredExactlyWhereTilesAreAllowed) {
  ab::TimingOptions quick;
  quick.min_time = 0.0;
  quick.min_reps = 1;
  const ab::AmxPeak peak = ab::measure_amx_peak(64, quick);
  EXPECT_EQ(peak.trips, 64);
  if (attend::cpu::supports(attend::cpu::Isa::avx512amx)) {
    EXPECT_TRUE(peak.measured()) << peak.missing;
    EXPECT_TRUE(peak.missing.empty()) << peak.missing;
    EXPECT_GE(peak.threads, 1);
    EXPECT_GE(peak.reps, 5);
  } else {
    EXPECT_FALSE(peak.measured());
    EXPECT_EQ(peak.missing, "this CPU or OS does not allow AMX-BF16 tiles");
  }
}

TEST(BenchHarness, AmxPeakRejectsTripCountsOutsideItsExactRangeByName) {
  for (const std::int64_t trips : {std::int64_t{0}, ab::kAmxMaxTrips + 1}) {
    try {
      (void)ab::measure_amx_peak(trips);
      FAIL() << "trips = " << trips << " accepted";
    } catch (const attend::Error& e) {
      EXPECT_EQ(e.field(), "amx_peak_trips");
      EXPECT_EQ(e.value(), std::to_string(trips));
    }
  }
}

TEST(BenchHarness, Bf16GemmPeakRejectsAnEmptyProblemByName) {
  try {
    (void)ab::measure_bf16_gemm_peak(0);
    FAIL() << "n = 0 accepted";
  } catch (const attend::Error& e) {
    EXPECT_EQ(e.field(), "bf16_gemm_n");
    EXPECT_EQ(e.value(), "0");
  }
}

TEST(BenchHarness, TableCsvAndJsonCarryTheDocumentedFields) {
  ab::HarnessOptions o = fast_options({ab::Impl::flash, ab::Impl::unfused});
  const ab::Report r = ab::run_benchmarks({tiny()}, o, fake_header());
  std::ostringstream table;
  ab::print_report(table, r);
  EXPECT_NE(table.str().find("sgemm_peak: 100.0 GFLOP/s (n=64"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("flash_isa: "), std::string::npos);
  EXPECT_NE(table.str().find("blas_config: OpenBLAS test"), std::string::npos);
  for (const char* column : {"problem", "impl", "pass", "ms", "GFLOP/s", "vs_sgemm", "vs_unfused", "extra_MiB",
                             "vs_bf16gemm", "vs_amx_peak"}) {
    EXPECT_NE(table.str().find(column), std::string::npos) << column;
  }

  const auto dir = std::filesystem::temp_directory_path() / ("attend_bench_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string csv = (dir / "r.csv").string(), json = (dir / "r.json").string();
  ab::write_csv(csv, r);
  ab::write_json(json, r);
  std::istringstream lines(read(csv));
  std::string header;
  std::getline(lines, header);
  const std::vector<std::string> names = split_csv(header);
  EXPECT_EQ(names.front(), "problem");
  EXPECT_EQ(names.back(), "blas_config");
  for (const char* name : {"vs_bf16_gemm", "vs_amx_peak", "amx_peak_gflops", "amx_peak_missing"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  int rows = 0;
  for (std::string line; std::getline(lines, line); ++rows) {
    const std::vector<std::string> fields = split_csv(line);
    ASSERT_EQ(fields.size(), names.size()) << line;
    EXPECT_EQ(fields.back(), "OpenBLAS test, with \"quotes\"");
  }
  EXPECT_EQ(rows, 4);
  const std::string js = read(json);
  EXPECT_NE(js.find("\"format\": \"attend-bench/1\""), std::string::npos) << js;
  EXPECT_NE(js.find("\"blas_config\": \"OpenBLAS test, with \\\"quotes\\\"\""), std::string::npos) << js;
  EXPECT_NE(js.find("\"impl\": \"unfused\", \"pass\": \"backward\""), std::string::npos) << js;
  std::filesystem::remove_all(dir);
}

}  // namespace
