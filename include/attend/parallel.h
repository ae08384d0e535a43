// Context parallelism: one attention problem split by sequence across `size`
// ranks, planned without any transport.
//
// This header is the engine-agnostic half: given a spec, the cp size, a rank
// and a strategy request, plan() judges every strategy (accepted, or rejected
// with reasons), picks one, and lays out the chosen strategy's per-rank work:
// which global rows the rank holds and, for the ring, every step's blocks
// (query chunk x key chunk, their global offsets, whether the block is skipped,
// unmasked or partially masked) and its ring neighbours. It never talks to
// another process, so `attend select --cp 4` and bindings on other transports
// (torch.distributed) use the same plan. attend/parallel_mpi.h runs a plan
// over MPI.
//
// Sharding: the caller gives each rank the rows plan.local_chunks() names, in
// that order, for q, k, v, dout (and gets out, lse, dq, dk, dv the same way).
// A masked problem whose mask is causal is cut into 2*size chunks and rank r
// holds chunks r and 2*size-1-r (the load-balanced "zigzag" layout: every rank
// sees the same number of unmasked pairs); any other problem is cut into
// `size` contiguous chunks, chunk r on rank r.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attend/select.h"
#include "attend/spec.h"

namespace attend::parallel {

enum class Strategy : std::uint8_t {
  automatic,  // the first accepted of ring, a2a
  ring,       // p2p: K/V chunks travel round the ring, partials merged through their LSEs
  a2a,        // all-to-all (Ulysses): re-shard to whole sequences of heads/size heads
};
std::string_view to_string(Strategy strategy);  // "auto", "ring", "a2a"
// Throws attend::Error naming `field` for anything but auto, ring or a2a.
Strategy parse_strategy(std::string_view text, std::string_view field = "cp_strategy");

// A CP problem beyond its spec.
struct Config {
  int size = 1;                             // ranks sharing the sequence (the cp size); >= 1
  int rank = 0;                             // this rank, in [0, size)
  Strategy strategy = Strategy::automatic;  // a forced strategy never falls back
  // Causal problems use the zigzag layout; false keeps contiguous chunks
  // (rank r's work then grows with r: for comparison and benchmarks).
  bool balance_causal = true;
};

// A run of consecutive global rows (queries and keys share it: CP needs
// seqlen_q == seqlen_kv).
struct Chunk {
  std::int64_t index = 0;   // chunk number in the global sequence
  std::int64_t offset = 0;  // global position of its first row
  std::int64_t rows = 0;    // its length
};

// What the mask leaves of a block (query chunk x key chunk).
enum class BlockMask : std::uint8_t {
  skip,     // every pair masked: not computed (nor communicated for)
  none,     // no pair masked: runs without the mask
  partial,  // the causal diagonal or a window edge: runs with the spec's mask at global offsets
};
std::string_view to_string(BlockMask mask);

// One block of a ring step: local query chunk `q_chunk` (index into
// local_chunks(rank)) against key chunk `kv_chunk` of the K/V held this step
// (index into local_chunks(kv_owner)).
struct Block {
  int q_chunk = 0;
  int kv_chunk = 0;
  std::int64_t q_offset = 0;   // global position of the block's first query
  std::int64_t kv_offset = 0;  // global position of its first key
  BlockMask mask = BlockMask::none;
};

// One ring step on one rank: computes its blocks against the K/V of
// `kv_owner` while that K/V moves on to `send_to` and the next arrives from
// `recv_from` (backward: with its dK/dV accumulators).
struct Step {
  int index = 0;
  int kv_owner = 0;
  int send_to = 0;
  int recv_from = 0;
  std::vector<Block> blocks;
};

struct StrategyVerdict {
  Strategy strategy = Strategy::ring;
  bool accepted = false;
  bool chosen = false;
  bool not_forced = false;           // another strategy is forced (its checks still ran)
  std::vector<std::string> reasons;  // why not; empty when accepted
  std::string backend;               // accepted: the backend of its local problems (forward)
  std::string backward_backend;      // accepted, training: the backend of its backward blocks
};

struct Plan {
  AttentionSpec spec;  // the whole problem (validated)
  Mode mode = Mode::inference;
  Config config;
  Strategy strategy = Strategy::automatic;  // the chosen one; automatic when none fits
  std::vector<StrategyVerdict> verdicts;    // ring, then a2a
  bool balanced = false;                    // the zigzag layout (2*size chunks)
  std::int64_t chunk_rows = 0;              // rows per chunk
  std::vector<Step> steps;                  // ring: `size` steps of config.rank; otherwise empty

  bool viable() const { return strategy != Strategy::automatic; }
  // The chunks `rank` holds, in local row order (the same for every strategy).
  std::vector<Chunk> local_chunks(int rank) const;
  std::vector<Chunk> local_chunks() const { return local_chunks(config.rank); }
  // The spec of this rank's local tensors: seqlen_q = seqlen_kv = rows held,
  // offsets 0 (the sharded q, k, v, out, lse, dout, dq, dk, dv have its shapes).
  AttentionSpec local_spec() const;
  // The ring steps of any rank (steps holds config.rank's).
  std::vector<Step> ring_steps(int rank) const;
  // Pairs of (query, key) positions each rank's ring blocks cover, a measure
  // of its compute (equal across ranks in the balanced layout).
  std::int64_t visible_pairs(int rank) const;
  // Strategy table: each strategy, accepted or its reasons, and the choice.
  std::string explain() const;
  std::string to_json() const;
};

// Judges every strategy and lays out the chosen one, never throwing for
// "nothing fits" (strategy stays automatic). Throws attend::Error for an
// invalid spec, policy or config (size < 1, rank outside [0, size)).
Plan evaluate(const AttentionSpec& spec, Mode mode, const Config& config, const Policy& policy = current_policy());
// The same, but throws attend::Error(unsupported) carrying explain() when the
// requested strategy (or, for auto, every strategy) cannot run.
Plan plan(const AttentionSpec& spec, Mode mode, const Config& config, const Policy& policy = current_policy());

// The spec a ring block runs with: the chunk sizes, its global offsets, the
// mask dropped for BlockMask::none; forward writes an f32 (f64 for f64)
// partial and backward accumulates into dq/dk/dv. Attention sinks: only a
// block against key chunk 0 (kv_offset 0) keeps the spec's softmax_type (and
// is never skipped, so each row counts its sink once); every other block runs
// vanilla. Backward's dsinks therefore come from those blocks alone, summed
// over ranks. All-to-all ranks take their heads' slice of the sinks.
AttentionSpec block_spec(const Plan& plan, const Block& block, Pass pass);
// The spec of an all-to-all rank's local problem: whole sequences of
// heads_q/size query heads and heads_kv/size key/value heads.
AttentionSpec a2a_spec(const Plan& plan);

}  // namespace attend::parallel
