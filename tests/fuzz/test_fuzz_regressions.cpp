// Replays every checked-in fuzz input through its target (fuzz/targets.h):
// the seed corpora (fuzz/corpus/<target>/) and each crash the fuzzers found
// (tests/data/fuzz/<target>/, named after the bug), in the normal suite.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <vector>

#include "attend/attend.h"
#include "problem_flags.h"
#include "support/tensors.h"
#include "targets.h"

namespace attend {
namespace {

namespace fs = std::filesystem;
using Target = void (*)(const std::uint8_t*, std::size_t);

int replay(const char* name, Target target) {
  int n = 0;
  for (const fs::path& dir : {fs::path(ATTEND_SOURCE_DIR) / "fuzz/corpus" / name,
                             fs::path(ATTEND_SOURCE_DIR) / "tests/data/fuzz" / name}) {
    if (!fs::exists(dir)) continue;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::ifstream f(entry.path(), std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      SCOPED_TRACE(entry.path().string());
      target(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++n;
    }
  }
  return n;
}

TEST(FuzzRegressions, NpyInputsReplayCleanly) { EXPECT_GT(replay("npy", &attend_fuzz::npy), 0); }
TEST(FuzzRegressions, SpecInputsReplayCleanly) { EXPECT_GT(replay("spec", &attend_fuzz::spec), 0); }
TEST(FuzzRegressions, CliFlagInputsReplayCleanly) { EXPECT_GT(replay("cli_flags", &attend_fuzz::cli_flags), 0); }

// fuzz_spec found it (tests/data/fuzz/spec/crash-window-int64-max-overflow):
// visible_keys computed pos + window_right + 1, overflowing for a window as
// wide as INT64_MAX, which validate() accepts. Such a window is unbounded.
TEST(FuzzRegressions, Int64MaxWindowEqualsUnboundedWindow) {
  AttentionSpec wide;
  wide.seqlen_q = 7;
  wide.seqlen_kv = 5;  // Sq > Sk: negative row positions too
  wide.head_dim_qk = wide.head_dim_v = 8;
  wide.window_left = wide.window_right = std::numeric_limits<std::int64_t>::max();
  AttentionSpec open = wide;
  open.window_left = open.window_right = -1;
  const testing::Problem pw = testing::make_problem(wide, 1), po = testing::make_problem(open, 1);
  for (const auto& e : Registry::global().backends()) {
    if (!e.backend->check(wide, Pass::forward).ok()) continue;
    SCOPED_TRACE(std::string(e.backend->name()));
    const bool bwd = e.backend->check(wide, Pass::backward).ok();
    const testing::PassResults a = testing::run_backend(*e.backend, pw, bwd), b = testing::run_backend(*e.backend, po, bwd);
    EXPECT_TRUE(testing::bitwise_equal(a.out, b.out));
    EXPECT_TRUE(testing::bitwise_equal(a.lse, b.lse));
  }
}

}  // namespace
}  // namespace attend
