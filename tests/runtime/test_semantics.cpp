// The per-element mask rules: visible_queries is the exact inverse of
// visible_keys, checked by brute force over many shapes and windows.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "kernel/semantics.h"

namespace attend {
namespace {

TEST(Semantics, VisibleQueriesIsTheInverseOfVisibleKeys) {
  const std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  int checked = 0;
  for (std::int64_t sq : {1, 2, 5, 13}) {
    for (std::int64_t sk : {1, 3, 5, 17}) {
      for (bool causal : {false, true}) {
        for (std::int64_t wl : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{2}, kMax}) {
          for (std::int64_t wr : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{3}, kMax}) {
            AttentionSpec s;
            s.causal = causal;
            s.window_left = wl;
            s.window_right = wr;
            for (std::int64_t j = 0; j < sk; ++j) {
              const detail::KeyRange q = detail::visible_queries(s, j, sq, sk);
              for (std::int64_t i = 0; i < sq; ++i) {
                const detail::KeyRange k = detail::visible_keys(s, i, sq, sk);
                const bool sees = k.begin <= j && j < k.end;
                const bool listed = q.begin <= i && i < q.end;
                ASSERT_EQ(sees, listed) << "sq=" << sq << " sk=" << sk << " causal=" << causal << " wl=" << wl
                                        << " wr=" << wr << " i=" << i << " j=" << j;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace attend
