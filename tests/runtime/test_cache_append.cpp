// validate_cache_append (issue 41, row 4): an append through the caller's own
// block table or cache rows is refused when two new tokens share a page slot,
// or a new token lands on a slot a sequence of the call reads as context;
// pages shared as a read-only prefix stay legal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attend/attend.h"

namespace attend {
namespace {

constexpr std::int64_t kHeads = 1, kDim = 8;

// A paged problem as flash_attn_with_kvcache hands it over: cache_seqlens are
// the lengths after appending `new_tokens` to each sequence.
struct Append {
  AttentionSpec spec;
  Tensor q, k, v, table, lens, pads;
  Inputs inputs;

  Append(std::int64_t page_size, std::int64_t pages, const std::vector<std::vector<std::int32_t>>& rows,
         const std::vector<std::int32_t>& before, std::int64_t new_tokens,
         const std::vector<std::int32_t>& leftpad = {}) {
    const auto batch = static_cast<std::int64_t>(rows.size()), width = static_cast<std::int64_t>(rows[0].size());
    spec.batch = batch;
    spec.seqlen_q = 1;
    spec.heads_q = spec.heads_kv = kHeads;
    spec.head_dim_qk = spec.head_dim_v = kDim;
    spec.kv_page_size = page_size;
    spec.kv_leftpad = !leftpad.empty();
    spec.seqlen_kv = 1;
    q = Tensor::zeros(DType::f32, {batch, 1, kHeads, kDim});
    k = Tensor::zeros(DType::f32, {pages, page_size, kHeads, kDim});
    v = Tensor::zeros(DType::f32, {pages, page_size, kHeads, kDim});
    table = Tensor::zeros(DType::i32, {batch, width});
    lens = Tensor::zeros(DType::i32, {batch});
    pads = Tensor::zeros(DType::i32, {batch});
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t c = 0; c < width; ++c) table.as<std::int32_t>()[b * width + c] = rows[b][c];
      lens.as<std::int32_t>()[b] = before[b] + static_cast<std::int32_t>(new_tokens);
      if (spec.kv_leftpad) pads.as<std::int32_t>()[b] = leftpad[b];
      const std::int64_t keys = lens.as<std::int32_t>()[b] - pads.as<std::int32_t>()[b];
      spec.seqlen_kv = std::max(spec.seqlen_kv, keys);
    }
    inputs.q = q;
    inputs.k = k;
    inputs.v = v;
    inputs.block_table = table;
    inputs.cache_seqlens = lens;
    if (spec.kv_leftpad) inputs.cache_leftpad = pads;
  }
};

Error refused(const Append& a, std::int64_t new_tokens, CacheRows rows = CacheRows::block_table) {
  try {
    validate_cache_append(a.spec, a.inputs, new_tokens, rows);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "the append was accepted";
  return Error(ErrorCode::invalid_argument, "", "", "");
}

TEST(CacheAppend, TwoSequencesWritingOneSlotAreRefusedNamingBothTokens) {
  // Page size 2, both sequences hold 2 tokens; their third token maps to page 1 slot 0.
  const Append a(2, 3, {{0, 1}, {2, 1}}, {2, 2}, 1);
  const Error e = refused(a, 1);
  EXPECT_EQ(e.field(), "block_table");
  EXPECT_EQ(e.value(), "page 1 slot 0");
  EXPECT_NE(e.detail().find("sequence 0 token 2 and sequence 1 token 2"), std::string::npos) << e.what();
}

TEST(CacheAppend, APrefixPageSharedForReadingIsAccepted) {
  // Page 0 holds both sequences' first two tokens; each appends to its own page.
  const Append a(2, 3, {{0, 1}, {0, 2}}, {2, 2}, 2);
  EXPECT_NO_THROW(validate_cache_append(a.spec, a.inputs, 2));
}

TEST(CacheAppend, WritingASlotAnotherSequenceReadsAsContextIsRefused) {
  // Sequence 0 (1 token) appends its token 1 into page 0 slot 1, which sequence 1
  // (3 tokens, page 0 as its prefix) reads as its token 1.
  const Append a(2, 3, {{0, 1}, {0, 2}}, {1, 3}, 1);
  const Error e = refused(a, 1);
  EXPECT_EQ(e.field(), "block_table");
  EXPECT_EQ(e.value(), "page 0 slot 1");
  EXPECT_NE(e.detail().find("sequence 0 token 1 is written where sequence 1 token 1 is read"), std::string::npos)
      << e.what();
}

TEST(CacheAppend, ASequenceOverwritingItsOwnContextThroughARepeatedPageIsRefused) {
  // Columns 0 and 1 both name page 0: token 2 would land on token 0's slot.
  const Append a(2, 1, {{0, 0}}, {2}, 1);
  const Error e = refused(a, 1);
  EXPECT_EQ(e.value(), "page 0 slot 0");
  EXPECT_NE(e.detail().find("sequence 0 token 2 is written where sequence 0 token 0 is read"), std::string::npos)
      << e.what();
}

TEST(CacheAppend, SlotsUnderAnotherSequencesLeftPaddingAreNotItsContext) {
  // Sequence 1's first page is padding (leftpad 2): sequence 0 may fill it.
  const Append padded(2, 4, {{0, 1, 1}, {0, 2, 3}}, {0, 3}, 2, {0, 2});
  EXPECT_NO_THROW(validate_cache_append(padded.spec, padded.inputs, 2));
  const Append unpadded(2, 4, {{0, 1, 1}, {0, 2, 3}}, {0, 3}, 2);
  EXPECT_EQ(refused(unpadded, 2).value(), "page 0 slot 0");
}

TEST(CacheAppend, ARepeatedCacheRowIsRefusedNamingTheRowAndItsPositions) {
  // A dense cache of 3 rows of 8 tokens through cache_batch_idx = [0, 2, 2].
  const Append a(8, 3, {{0}, {2}, {2}}, {2, 2, 5}, 1);
  const Error e = refused(a, 1, CacheRows::cache_batch_idx);
  EXPECT_EQ(e.field(), "cache_batch_idx");
  EXPECT_EQ(e.value(), "2");
  EXPECT_NE(e.detail().find("positions 1 and 2"), std::string::npos) << e.what();
}

TEST(CacheAppend, RepeatedRowsWithoutNewTokensOnlyReadAndAreAccepted) {
  const Append a(8, 2, {{1}, {1}}, {3, 3}, 0);
  EXPECT_NO_THROW(validate_cache_append(a.spec, a.inputs, 0, CacheRows::cache_batch_idx));
}

TEST(CacheAppend, DistinctRowsAreAcceptedAndTheTablesChecksStillRun) {
  const Append ok(8, 3, {{2}, {0}}, {3, 7}, 1);
  EXPECT_NO_THROW(validate_cache_append(ok.spec, ok.inputs, 1, CacheRows::cache_batch_idx));
  const Append full(8, 3, {{2}, {0}}, {3, 8}, 1);  // past the row's 8 tokens: validate_inputs' error
  EXPECT_EQ(refused(full, 1, CacheRows::cache_batch_idx).field(), "cache_seqlens[1]");
}

}  // namespace
}  // namespace attend
