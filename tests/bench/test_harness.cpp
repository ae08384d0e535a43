// The harness measures every requested (problem, impl, pass), pairs each row
// with the unfused row of the same problem and pass, skips what cannot or
// should not run with a note, and writes the documented CSV/JSON fields.
// Structure only: no assertion here depends on how fast anything ran.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "bench/harness.h"
#include "bench/report.h"
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

TEST(BenchHarness, TableCsvAndJsonCarryTheDocumentedFields) {
  ab::HarnessOptions o = fast_options({ab::Impl::flash, ab::Impl::unfused});
  const ab::Report r = ab::run_benchmarks({tiny()}, o, fake_header());
  std::ostringstream table;
  ab::print_report(table, r);
  EXPECT_NE(table.str().find("sgemm_peak: 100.0 GFLOP/s (n=64"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("flash_isa: "), std::string::npos);
  EXPECT_NE(table.str().find("blas_config: OpenBLAS test"), std::string::npos);
  for (const char* column : {"problem", "impl", "pass", "ms", "GFLOP/s", "vs_sgemm", "vs_unfused", "extra_MiB"}) {
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
