// validate_cache_append: an append through a caller's own block table (or
// cache rows) must not write one page slot twice, nor a slot another token of
// the call reads as context. Either would overwrite a token silently and let a
// sequence attend to a key that is not its own.
#include <algorithm>
#include <string>
#include <vector>

#include "attend/backend.h"
#include "attend/error.h"
#include "attend/kvcache.h"

namespace attend {
namespace {

struct Write {
  std::int64_t page, slot, seq, token;
};

bool slot_order(const Write& a, const Write& b) {
  if (a.page != b.page) return a.page < b.page;
  if (a.slot != b.slot) return a.slot < b.slot;
  if (a.seq != b.seq) return a.seq < b.seq;
  return a.token < b.token;
}

std::string token_of(std::int64_t seq, std::int64_t token) {
  return "sequence " + std::to_string(seq) + " token " + std::to_string(token);
}

std::string slot_of(std::int64_t page, std::int64_t slot) {
  return "page " + std::to_string(page) + " slot " + std::to_string(slot);
}

class AppendCheck {
 public:
  AppendCheck(const AttentionSpec& s, const Inputs& in, std::int64_t new_tokens, CacheRows rows)
      : s_(s), in_(in), n_(new_tokens), rows_(rows), pages_(in.k.shape[0]), ps_(s.kv_page_size) {}

  void run() {
    collect_writes();
    std::sort(writes_.begin(), writes_.end(), slot_order);
    for (std::size_t i = 1; i < writes_.size(); ++i) {
      const Write &a = writes_[i - 1], &b = writes_[i];
      if (a.page == b.page && a.slot == b.slot) {
        hazard(a.seq, b.seq, slot_of(a.page, a.slot),
               token_of(a.seq, a.token) + " and " + token_of(b.seq, b.token) +
                   " are both written there: one would overwrite the other (the slots an append writes must be "
                   "distinct)");
      }
    }
    for (std::int64_t b = 0; b < s_.batch; ++b) check_context_reads(b);
  }

 private:
  std::int64_t at(const TensorView& t, std::int64_t i) const { return t.as<const std::int32_t>()[i * t.strides[0]]; }
  std::int64_t end(std::int64_t b) const { return at(in_.cache_seqlens, b); }
  std::int64_t leftpad(std::int64_t b) const { return s_.kv_leftpad ? at(in_.cache_leftpad, b) : 0; }
  std::int64_t page(std::int64_t b, std::int64_t column) const {
    const TensorView& bt = in_.block_table;
    return bt.as<const std::int32_t>()[b * bt.strides[0] + column * bt.strides[1]];
  }

  // The (page, slot) of each appended token: the last new_tokens of every
  // sequence. validate_inputs checked the pages of [leftpad, end) only, so a
  // write into left padding gets its page id checked here.
  void collect_writes() {
    writes_.reserve(static_cast<std::size_t>(s_.batch * n_));
    for (std::int64_t b = 0; b < s_.batch; ++b) {
      const std::int64_t e = end(b);
      if (e < n_) {
        throw Error(ErrorCode::invalid_argument, "cache_seqlens[" + std::to_string(b) + "]", std::to_string(e),
                    "the lengths after an append of " + std::to_string(n_) + " tokens cannot be below it",
                    std::to_string(n_));
      }
      for (std::int64_t t = e - n_; t < e; ++t) {
        const std::int64_t id = page(b, t / ps_);
        if (id < 0 || id >= pages_) {
          throw Error(ErrorCode::invalid_argument,
                      "block_table[" + std::to_string(b) + "][" + std::to_string(t / ps_) + "]", std::to_string(id),
                      "page id out of range for a pool of " + std::to_string(pages_) + " pages",
                      std::to_string(pages_));
        }
        writes_.push_back({id, t % ps_, b, t});
      }
    }
  }

  // Keys sequence b held before the call, [leftpad, end - new_tokens), are
  // read as its context: no write of the call may land on one of their slots
  // (pages shared as a read-only prefix stay legal). Page by page, a binary
  // search over the sorted writes: O(table + writes * log writes).
  void check_context_reads(std::int64_t b) {
    const std::int64_t first = leftpad(b), stop = end(b) - n_;
    for (std::int64_t col = first / ps_; col * ps_ < stop; ++col) {
      const std::int64_t id = page(b, col);
      const std::int64_t lo = std::max(first, col * ps_) - col * ps_, hi = std::min(stop, (col + 1) * ps_) - col * ps_;
      const auto it = std::lower_bound(writes_.begin(), writes_.end(), Write{id, lo, -1, -1}, slot_order);
      if (it != writes_.end() && it->page == id && it->slot < hi) {
        hazard(it->seq, b, slot_of(id, it->slot),
               token_of(it->seq, it->token) + " is written where " + token_of(b, col * ps_ + it->slot) +
                   " is read as context: the append would overwrite a key the call attends to");
      }
    }
  }

  // Through cache rows (cache_batch_idx) two sequences only meet on one row,
  // so the error names the row index the caller passed twice.
  [[noreturn]] void hazard(std::int64_t seq_a, std::int64_t seq_b, const std::string& where,
                           const std::string& what) const {
    if (rows_ == CacheRows::cache_batch_idx && seq_a != seq_b) {
      const std::int64_t lo = std::min(seq_a, seq_b), hi = std::max(seq_a, seq_b);
      throw Error(ErrorCode::invalid_argument, "cache_batch_idx", std::to_string(page(lo, 0)),
                  "given at positions " + std::to_string(lo) + " and " + std::to_string(hi) +
                      ": two sequences appending to one cache row would overwrite each other's keys (the rows "
                      "an append writes must be distinct)");
    }
    throw Error(ErrorCode::invalid_argument, "block_table", where, what);
  }

  const AttentionSpec& s_;
  const Inputs& in_;
  std::int64_t n_;
  CacheRows rows_;
  std::int64_t pages_, ps_;
  std::vector<Write> writes_;
};

}  // namespace

void validate_cache_append(const AttentionSpec& spec, const Inputs& in, std::int64_t new_tokens, CacheRows rows) {
  validate_inputs(spec, in);
  if (!spec.paged()) {
    throw Error(ErrorCode::invalid_argument, "kv_page_size", std::to_string(spec.kv_page_size),
                "an append goes through a block table: the spec must be paged");
  }
  if (new_tokens < 0) {
    throw Error(ErrorCode::invalid_argument, "new_tokens", std::to_string(new_tokens), "must be >= 0");
  }
  if (new_tokens == 0 || !in.q.device.is_host()) return;  // device tables: the caller's to check
  AppendCheck(spec, in, new_tokens, rows).run();
}

}  // namespace attend
