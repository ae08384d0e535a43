// Context-parallel planning: strategy verdicts, the sharding and the ring
// schedule. Pure: no transport, no tensors.
#include <algorithm>
#include <string>
#include <vector>

#include "attend/error.h"
#include "attend/parallel.h"
#include "runtime/json.h"

namespace attend::parallel {

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

// Reasons shared by every strategy: the sharding itself (rows split evenly,
// queries and keys cut alike, dense bshd shards).
void shard_reasons(const AttentionSpec& s, const Config& c, std::int64_t chunks, std::vector<std::string>& out) {
  if (s.varlen())
    out.push_back("varlen: layout=thd packs sequences of different lengths; CP splits one dense sequence");
  if (s.paged())
    out.push_back("paged: kv_page_size=" + num(s.kv_page_size) +
                  " is a KV cache (inference decode), not a sharded sequence");
  if (!s.varlen() && s.layout != Layout::bshd) {
    out.push_back("layout=" + std::string(to_string(s.layout)) + ": the CP engines exchange bshd shards");
  }
  if (s.seqlen_q != s.seqlen_kv) {
    out.push_back("seqlen: seqlen_q=" + num(s.seqlen_q) + " != seqlen_kv=" + num(s.seqlen_kv) +
                  " (queries and keys are cut into the same chunks)");
  }
  if (s.has_bias) out.push_back("bias: a dense (Sq, Sk) bias is not sharded by CP");
  if (s.accumulate_grads) out.push_back("accumulate: the CP engines write dq/dk/dv (they accumulate internally)");
  if (s.has_offsets()) out.push_back("positions: the whole problem must start at q_offset=kv_offset=0");
  if (s.seqlen_q % chunks != 0) {
    out.push_back("seqlen=" + num(s.seqlen_q) + " is not divisible by " + num(chunks) + " chunks (cp=" + num(c.size) +
                  (chunks != c.size ? ", balanced causal layout: 2*cp" : "") + ")");
  }
}

// One line per backend (its first declining variant) of a selection that
// found nothing, for a strategy's reasons.
std::string backend_reasons(const Selection& sel) {
  std::string text;
  std::string last;
  for (const Verdict& v : sel.verdicts) {
    if (v.backend == last) continue;
    last = v.backend;
    std::string why;
    if (v.disabled)
      why = "disabled by policy";
    else if (v.not_forced)
      why = "not the forced backend";
    else if (!v.forward.ok())
      why = "forward: " + v.forward.to_string();
    else if (v.backward && !v.backward->ok())
      why = "backward: " + v.backward->to_string();
    else if (!v.variant_excluded.empty())
      why = v.variant_excluded;
    text += (text.empty() ? "" : "; ") + v.backend + " (" + why + ")";
  }
  return text;
}

// The backend that runs `spec` in `mode`, or a reason (appended) why none does.
std::string backend_for(const AttentionSpec& spec, Mode mode, const Policy& policy, const char* what,
                        std::vector<std::string>& reasons) {
  const Selection sel = attend::evaluate(spec, mode, policy);
  if (sel.backend) return std::string(sel.backend->name());
  reasons.push_back(std::string("no backend runs ") + what + " (" + describe(spec) + "): " + backend_reasons(sel));
  return {};
}

bool visible(const AttentionSpec& s, std::int64_t row, std::int64_t col) {
  const std::int64_t wr = s.effective_window_right();
  return (wr < 0 || col <= row + wr) && (s.window_left < 0 || col >= row - s.window_left);
}

BlockMask classify(const AttentionSpec& s, std::int64_t q0, std::int64_t k0, std::int64_t n) {
  if (!s.is_masked()) return BlockMask::none;
  const std::int64_t wr = s.effective_window_right(), wl = s.window_left;
  const std::int64_t q1 = q0 + n - 1, k1 = k0 + n - 1;
  if ((wr >= 0 && k0 > q1 + wr) || (wl >= 0 && k1 < q0 - wl)) return BlockMask::skip;
  // Every pair visible when the farthest corners are.
  if (visible(s, q0, k1) && visible(s, q1, k0)) return BlockMask::none;
  return BlockMask::partial;
}

void judge_ring(Plan& p, const Policy& policy, StrategyVerdict& v) {
  if (!v.reasons.empty()) return;
  // Representative blocks: an unmasked one and, for masked problems, one on
  // the mask's edge (the diagonal); the backend must run both kinds.
  // With a sink, blocks against key chunk 0 carry it and the others run
  // vanilla: both kinds must run.
  const std::int64_t off = p.spec.has_sink() && p.config.size > 1 ? p.chunk_rows : 0;
  Block plain{0, 0, 0, off, BlockMask::none};
  v.backend =
      backend_for(block_spec(p, plain, Pass::forward), Mode::inference, policy, "the ring's forward blocks", v.reasons);
  if (p.spec.is_masked()) {
    Block edge{0, 0, 0, 0, BlockMask::partial};
    backend_for(block_spec(p, edge, Pass::forward), Mode::inference, policy, "the ring's diagonal forward blocks",
                v.reasons);
  }
  if (off > 0) {
    Block carrier{0, 0, 0, 0, BlockMask::none};
    backend_for(block_spec(p, carrier, Pass::forward), Mode::inference, policy,
                "the ring's sink-carrying forward blocks", v.reasons);
    if (p.mode == Mode::training) {
      backend_for(block_spec(p, carrier, Pass::backward), Mode::training, policy,
                  "the ring's sink-carrying backward blocks", v.reasons);
    }
  }
  if (p.mode == Mode::training) {
    v.backward_backend = backend_for(block_spec(p, plain, Pass::backward), Mode::training, policy,
                                     "the ring's accumulating backward blocks", v.reasons);
  }
}

void judge_a2a(Plan& p, const Policy& policy, StrategyVerdict& v) {
  const AttentionSpec& s = p.spec;
  const int n = p.config.size;
  // GQA rule: both head counts split evenly, so rank r's query heads
  // [r*H/n, (r+1)*H/n) read exactly its key/value heads [r*Hkv/n, (r+1)*Hkv/n).
  if (s.heads_q % n != 0) v.reasons.push_back("heads_q=" + num(s.heads_q) + " is not divisible by cp=" + num(n));
  if (s.heads_kv % n != 0) {
    v.reasons.push_back("gqa: heads_kv=" + num(s.heads_kv) + " is not divisible by cp=" + num(n) +
                        " (each rank needs whole key/value heads of its query heads)");
  }
  if (s.dropout_p > 0.0 && n > 1) {
    v.reasons.push_back("dropout: the Philox mask is keyed by the head index, which a head-split rank renumbers");
  }
  if (!v.reasons.empty()) return;
  v.backend = backend_for(a2a_spec(p), p.mode, policy, "an all-to-all rank's local problem", v.reasons);
  if (p.mode == Mode::training) v.backward_backend = v.backend;
}

}  // namespace

std::string_view to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::automatic: return "auto";
    case Strategy::ring: return "ring";
    case Strategy::a2a: return "a2a";
  }
  return "?";
}

Strategy parse_strategy(std::string_view text, std::string_view field) {
  if (text == "auto") return Strategy::automatic;
  if (text == "ring") return Strategy::ring;
  if (text == "a2a") return Strategy::a2a;
  throw Error(ErrorCode::invalid_argument, std::string(field), std::string(text), "expected auto, ring or a2a");
}

std::string_view to_string(BlockMask mask) {
  switch (mask) {
    case BlockMask::skip: return "skip";
    case BlockMask::none: return "unmasked";
    case BlockMask::partial: return "masked";
  }
  return "?";
}

std::vector<Chunk> Plan::local_chunks(int rank) const {
  const std::int64_t n = config.size;
  std::vector<Chunk> out;
  const auto add = [&](std::int64_t index) { out.push_back({index, index * chunk_rows, chunk_rows}); };
  add(rank);
  if (balanced) add(2 * n - 1 - rank);
  return out;
}

AttentionSpec Plan::local_spec() const {
  AttentionSpec s = spec;
  s.seqlen_q = s.seqlen_kv = chunk_rows * (balanced ? 2 : 1);
  return s;
}

std::vector<Step> Plan::ring_steps(int rank) const {
  const int n = config.size;
  std::vector<Step> out;
  const std::vector<Chunk> mine = local_chunks(rank);
  for (int t = 0; t < n; ++t) {
    Step step;
    step.index = t;
    step.kv_owner = (rank - t + n) % n;
    step.send_to = (rank + 1) % n;
    step.recv_from = (rank - 1 + n) % n;
    const std::vector<Chunk> theirs = local_chunks(step.kv_owner);
    for (int qi = 0; qi < static_cast<int>(mine.size()); ++qi) {
      for (int ki = 0; ki < static_cast<int>(theirs.size()); ++ki) {
        const Chunk& q = mine[static_cast<std::size_t>(qi)];
        const Chunk& k = theirs[static_cast<std::size_t>(ki)];
        BlockMask mask = classify(spec, q.offset, k.offset, chunk_rows);
        // The sink's one partial per row (docs/semantics.md §1a) runs even
        // when the window hides every key of the block: O = 0, LSE = z_h.
        if (mask == BlockMask::skip && spec.has_sink() && k.offset == 0) mask = BlockMask::partial;
        step.blocks.push_back({qi, ki, q.offset, k.offset, mask});
      }
    }
    out.push_back(std::move(step));
  }
  return out;
}

std::int64_t Plan::visible_pairs(int rank) const {
  std::int64_t pairs = 0;
  for (const Step& step : ring_steps(rank)) {
    for (const Block& b : step.blocks) {
      if (b.mask == BlockMask::skip) continue;
      for (std::int64_t i = 0; i < chunk_rows; ++i) {
        for (std::int64_t j = 0; j < chunk_rows; ++j) pairs += visible(spec, b.q_offset + i, b.kv_offset + j);
      }
    }
  }
  return pairs;
}

AttentionSpec block_spec(const Plan& plan, const Block& block, Pass pass) {
  AttentionSpec s = plan.spec;
  s.seqlen_q = s.seqlen_kv = plan.chunk_rows;
  s.q_offset = block.q_offset;
  s.kv_offset = block.kv_offset;
  if (block.mask == BlockMask::none) {
    s.causal = false;
    s.window_left = s.window_right = -1;
  }
  // Only the block against key chunk 0 adds the sink to its rows' partials.
  if (block.kv_offset != 0) s.softmax_type = SoftmaxType::vanilla;
  if (pass == Pass::forward) {
    // Partials stay unrounded until the last merge.
    if (s.dtype != DType::f64 && s.dtype != DType::f32) s.out_dtype = DType::f32;
    s.need_lse = true;
  } else {
    s.accumulate_grads = true;
  }
  return s;
}

AttentionSpec a2a_spec(const Plan& plan) {
  AttentionSpec s = plan.spec;
  s.heads_q /= plan.config.size;
  s.heads_kv /= plan.config.size;
  return s;
}

Plan evaluate(const AttentionSpec& spec, Mode mode, const Config& config, const Policy& policy) {
  validate(spec);
  validate_policy(policy);
  if (config.size < 1) throw Error(ErrorCode::invalid_argument, "cp", num(config.size), "the cp size must be >= 1");
  if (config.rank < 0 || config.rank >= config.size) {
    throw Error(ErrorCode::invalid_argument, "cp_rank", num(config.rank), "must be in [0, cp)",
                "[0, " + num(config.size) + ")");
  }
  Plan p;
  p.spec = spec;
  p.mode = mode;
  p.config = config;
  // Causal work grows along the sequence: the zigzag pairs an early chunk with
  // a late one so every rank does the same share.
  p.balanced = spec.causal && config.size > 1 && config.balance_causal;
  const std::int64_t chunks = config.size * (p.balanced ? 2 : 1);
  p.chunk_rows = spec.seqlen_q / chunks;

  for (Strategy s : {Strategy::ring, Strategy::a2a}) {
    StrategyVerdict v;
    v.strategy = s;
    v.not_forced = config.strategy != Strategy::automatic && config.strategy != s;
    shard_reasons(spec, config, chunks, v.reasons);
    if (s == Strategy::ring)
      judge_ring(p, policy, v);
    else
      judge_a2a(p, policy, v);
    v.accepted = v.reasons.empty();
    p.verdicts.push_back(std::move(v));
  }
  for (StrategyVerdict& v : p.verdicts) {
    if (v.accepted && !v.not_forced) {
      v.chosen = true;
      p.strategy = v.strategy;
      break;
    }
  }
  if (p.strategy == Strategy::ring) p.steps = p.ring_steps(config.rank);
  return p;
}

Plan plan(const AttentionSpec& spec, Mode mode, const Config& config, const Policy& policy) {
  Plan p = evaluate(spec, mode, config, policy);
  if (p.viable()) return p;
  if (config.strategy != Strategy::automatic) {
    throw Error(ErrorCode::unsupported, "cp_strategy", std::string(to_string(config.strategy)),
                "the forced strategy cannot run this problem:\n" + p.explain());
  }
  throw Error(ErrorCode::unsupported, "cp", num(config.size), "no CP strategy can run this problem:\n" + p.explain());
}

std::string Plan::explain() const {
  std::string t = "context parallelism: cp=" + num(config.size) + " rank=" + num(config.rank) +
                  " requested=" + std::string(to_string(config.strategy)) +
                  " mode=" + std::string(attend::to_string(mode)) + "\n";
  const std::int64_t chunks = config.size * (balanced ? 2 : 1);
  t += "sharding: " + std::string(balanced ? "balanced causal (zigzag)" : "contiguous") + ", " + num(chunks) +
       " chunks of " + num(chunk_rows) + " rows; rank " + num(config.rank) + " holds chunk(s)";
  for (const Chunk& c : local_chunks())
    t += " " + num(c.index) + " [" + num(c.offset) + ", " + num(c.offset + c.rows) + ")";
  t += "\nstrategy | verdict    | backend\n";
  for (const StrategyVerdict& v : verdicts) {
    std::string name(to_string(v.strategy));
    name.resize(8, ' ');
    std::string verdict = v.chosen ? "chosen" : v.accepted ? (v.not_forced ? "not forced" : "ok") : "rejected";
    verdict.resize(10, ' ');
    std::string backend = v.backend;
    if (!v.backward_backend.empty()) backend += " (backward " + v.backward_backend + ")";
    t += name + " | " + verdict + " | " + backend + "\n";
    for (const std::string& r : v.reasons) t += "  - " + r + "\n";
  }
  if (strategy == Strategy::ring) {
    t += "ring schedule of rank " + num(config.rank) + ":\n";
    for (const Step& s : steps) {
      t += "  step " + num(s.index) + ": K/V of rank " + num(s.kv_owner) + " (send to " + num(s.send_to) +
           ", receive from " + num(s.recv_from) + "):";
      for (const Block& b : s.blocks) {
        t += " q@" + num(b.q_offset) + " x kv@" + num(b.kv_offset) + " " + std::string(to_string(b.mask)) + ";";
      }
      t += "\n";
    }
  }
  t += viable() ? "selected: " + std::string(to_string(strategy)) + "\n" : "selected: none\n";
  return t;
}

std::string Plan::to_json() const {
  std::string j = "{\"cp\": " + num(config.size) + ", \"rank\": " + num(config.rank) +
                  ", \"requested\": " + attend::detail::json_quote(to_string(config.strategy)) + ", \"strategy\": " +
                  (viable() ? attend::detail::json_quote(to_string(strategy)) : std::string("null")) +
                  ", \"balanced\": " + (balanced ? "true" : "false") + ", \"chunk_rows\": " + num(chunk_rows) +
                  ", \"local_chunks\": [";
  bool first = true;
  for (const Chunk& c : local_chunks()) {
    j += std::string(first ? "" : ", ") + "{\"index\": " + num(c.index) + ", \"offset\": " + num(c.offset) +
         ", \"rows\": " + num(c.rows) + "}";
    first = false;
  }
  j += "], \"verdicts\": [";
  first = true;
  for (const StrategyVerdict& v : verdicts) {
    j += std::string(first ? "" : ", ") + "{\"strategy\": " + attend::detail::json_quote(to_string(v.strategy)) +
         ", \"accepted\": " + (v.accepted ? "true" : "false") + ", \"chosen\": " + (v.chosen ? "true" : "false") +
         ", \"backend\": " + attend::detail::json_quote(v.backend) + ", \"reasons\": [";
    for (std::size_t i = 0; i < v.reasons.size(); ++i) j += (i ? ", " : "") + attend::detail::json_quote(v.reasons[i]);
    j += "]}";
    first = false;
  }
  j += "], \"steps\": [";
  first = true;
  for (const Step& s : steps) {
    j += std::string(first ? "" : ", ") + "{\"kv_owner\": " + num(s.kv_owner) + ", \"send_to\": " + num(s.send_to) +
         ", \"recv_from\": " + num(s.recv_from) + ", \"blocks\": [";
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const Block& b = s.blocks[i];
      j += std::string(i ? ", " : "") + "{\"q_offset\": " + num(b.q_offset) + ", \"kv_offset\": " + num(b.kv_offset) +
           ", \"mask\": " + attend::detail::json_quote(to_string(b.mask)) + "}";
    }
    j += "]}";
    first = false;
  }
  return j + "]}";
}

}  // namespace attend::parallel
