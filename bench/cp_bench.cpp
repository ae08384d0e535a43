// cp_bench: context parallelism over MPI, measured against a compute-only
// baseline in the same run.
//
//   mpirun -np N cp_bench [--seqlen S] [--heads H] [--dim D] [--causal] [--contiguous]
//                         [--backward] [--strategy ring|a2a] [--reps R]
//
// Each rank holds only its own rows (random data, never the whole problem),
// so its peak memory is what CP costs at this cp. Per rank it prints:
//   baseline  the same kernel calls (ring blocks and merges, or the a2a local
//             problem) on local data with no communication, timed first;
//   ring/a2a  the real run: compute seconds, seconds blocked on peers, total;
//   overlap   baseline / total (1.0: communication fully hidden);
//   pairs     visible (query, key) pairs its blocks cover (the causal balance);
//   peak RSS  growth of the resident set over the process's start (MiB).
// Rank 0 adds the spread of compute time over ranks (max/min).
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/parallel_mpi.h"

namespace {

namespace par = attend::parallel;

struct Args {
  std::int64_t seqlen = 4096, heads = 16, dim = 128;
  bool causal = false, contiguous = false, backward = false;
  std::string strategy = "ring";
  int reps = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (k == "--seqlen")
      a.seqlen = std::stoll(next());
    else if (k == "--heads")
      a.heads = std::stoll(next());
    else if (k == "--dim")
      a.dim = std::stoll(next());
    else if (k == "--causal")
      a.causal = true;
    else if (k == "--contiguous")
      a.contiguous = true;
    else if (k == "--backward")
      a.backward = true;
    else if (k == "--strategy")
      a.strategy = next();
    else if (k == "--reps")
      a.reps = std::stoi(next());
    else
      throw std::runtime_error("unknown argument " + k);
  }
  return a;
}

double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * 4096.0 / (1024.0 * 1024.0);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

attend::Tensor random(const std::vector<std::int64_t>& shape, unsigned seed) {
  attend::Tensor t = attend::Tensor::zeros(attend::DType::f32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = d(rng);
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The rank's kernel work with no communication: its ring blocks against its
// own K/V (the same shapes, so the same cost), merged as the ring merges.
double compute_only(const par::Plan& plan, const attend::Inputs& in, bool backward) {
  const attend::AttentionSpec ls = plan.local_spec();
  const std::int64_t c = plan.chunk_rows;
  const auto t0 = std::chrono::steady_clock::now();
  const auto rows = [](const attend::TensorView& t, std::int64_t r0, std::int64_t n, int dim) {
    attend::TensorView v = t;
    v.data = static_cast<std::byte*>(t.data) + r0 * t.strides[dim] * 4;
    v.shape[dim] = n;
    return v;
  };
  if (plan.strategy == par::Strategy::a2a) {
    const attend::AttentionSpec s = par::a2a_spec(plan);
    attend::Tensor q = attend::Tensor::zeros(attend::DType::f32, {s.batch, s.seqlen_q, s.heads_q, s.head_dim_qk});
    attend::Tensor k = attend::Tensor::zeros(attend::DType::f32, {s.batch, s.seqlen_kv, s.heads_kv, s.head_dim_qk});
    attend::Tensor o = attend::Tensor::zeros(attend::DType::f32, {s.batch, s.seqlen_q, s.heads_q, s.head_dim_v});
    attend::Tensor l = attend::Tensor::zeros(attend::DType::f32, {s.batch, s.heads_q, s.seqlen_q});
    attend::Inputs hin;
    hin.q = q;
    hin.k = hin.v = k;
    const auto t1 = std::chrono::steady_clock::now();
    attend::Plan::make(s, attend::Mode::inference).forward(hin, o, l);
    if (backward) {
      attend::Tensor dq = attend::Tensor::zeros_like(q), dk = attend::Tensor::zeros_like(k),
                     dv = attend::Tensor::zeros_like(k);
      attend::Plan::make(s, attend::Mode::training).backward(hin, o, l, o, {dq, dk, dv});
    }
    return seconds_since(t1);
  }
  attend::Tensor acc = attend::Tensor::zeros(attend::DType::f32, {ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_v});
  attend::Tensor acc_lse = attend::Tensor::zeros(attend::DType::f32, {ls.batch, ls.heads_q, ls.seqlen_q});
  attend::Tensor part = attend::Tensor::zeros(attend::DType::f32, {ls.batch, c, ls.heads_q, ls.head_dim_v});
  attend::Tensor part_lse = attend::Tensor::zeros(attend::DType::f32, {ls.batch, ls.heads_q, c});
  attend::Tensor dq = attend::Tensor::zeros_like(in.q), dk = attend::Tensor::zeros_like(in.k),
                 dv = attend::Tensor::zeros_like(in.v);
  for (const par::Step& st : plan.steps) {
    for (const par::Block& b : st.blocks) {
      if (b.mask == par::BlockMask::skip) continue;
      attend::Inputs bin = in;
      bin.q = rows(in.q, b.q_chunk * c, c, 1);
      bin.k = rows(in.k, b.kv_chunk * c, c, 1);
      bin.v = rows(in.v, b.kv_chunk * c, c, 1);
      const attend::AttentionSpec s = par::block_spec(plan, b, attend::Pass::forward);
      attend::Plan::make(s, attend::Mode::inference).forward(bin, part, part_lse);
      const attend::TensorView o = rows(acc, b.q_chunk * c, c, 1), l = rows(acc_lse, b.q_chunk * c, c, 2);
      const attend::Partial parts[] = {{o, l}, {part, part_lse}};
      attend::merge(s, parts, o, l);
      if (backward) {
        const attend::AttentionSpec sb = par::block_spec(plan, b, attend::Pass::backward);
        attend::Plan::make(sb, attend::Mode::training)
            .backward(bin, o, l, o,
                      {rows(dq, b.q_chunk * c, c, 1), rows(dk, b.kv_chunk * c, c, 1), rows(dv, b.kv_chunk * c, c, 1)});
      }
    }
  }
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    const Args a = parse(argc, argv);
    const double rss0 = rss_mib();
    attend::AttentionSpec spec;
    spec.batch = 1;
    spec.seqlen_q = spec.seqlen_kv = a.seqlen;
    spec.heads_q = spec.heads_kv = a.heads;
    spec.head_dim_qk = spec.head_dim_v = a.dim;
    spec.causal = a.causal;
    par::Config cfg{size, rank, par::parse_strategy(a.strategy, "--strategy")};
    cfg.balance_causal = !a.contiguous;
    const par::Plan plan = par::plan(spec, a.backward ? attend::Mode::training : attend::Mode::inference, cfg);
    const attend::AttentionSpec ls = plan.local_spec();
    const std::vector<std::int64_t> shape{ls.batch, ls.seqlen_q, ls.heads_q, ls.head_dim_qk};
    const attend::Tensor q = random(shape, 1u + static_cast<unsigned>(rank));
    const attend::Tensor k = random(shape, 100u + static_cast<unsigned>(rank));
    const attend::Tensor v = random(shape, 200u + static_cast<unsigned>(rank));
    attend::Inputs in;
    in.q = q;
    in.k = k;
    in.v = v;
    attend::Tensor out = attend::Tensor::zeros(attend::DType::f32, shape);
    attend::Tensor lse = attend::Tensor::zeros(attend::DType::f32, {ls.batch, ls.heads_q, ls.seqlen_q});

    double base = 1e30, total = 1e30;
    par::RunStats best{};
    for (int r = 0; r < a.reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      base = std::min(base, compute_only(plan, in, a.backward));
      MPI_Barrier(MPI_COMM_WORLD);
      par::RunStats st;
      par::RunOptions opt;
      opt.stats = &st;
      opt.timeout_seconds = 600;
      const auto t0 = std::chrono::steady_clock::now();
      par::forward(MPI_COMM_WORLD, plan, in, out, lse, opt);
      par::RunStats fwd = st;
      if (a.backward) {
        attend::Tensor dq = attend::Tensor::zeros_like(q), dk = attend::Tensor::zeros_like(k),
                       dv = attend::Tensor::zeros_like(v);
        par::backward(MPI_COMM_WORLD, plan, in, out, lse, out, {dq, dk, dv}, opt);
        fwd.compute_seconds += st.compute_seconds;
        fwd.wait_seconds += st.wait_seconds;
        fwd.blocks += st.blocks;
      }
      const double t = seconds_since(t0);
      if (t < total) {
        total = t;
        best = fwd;
      }
    }
    const std::int64_t pairs = plan.strategy == par::Strategy::ring ? plan.visible_pairs(rank) : 0;
    char line[400];
    std::snprintf(line, sizeof line,
                  "rank %d/%d %s%s: baseline %.3f s | %s compute %.3f s wait %.3f s total %.3f s | overlap %.3f | "
                  "blocks %d pairs %lld | peak RSS +%.1f MiB",
                  rank, size, a.strategy.c_str(), plan.balanced ? " balanced" : (a.causal ? " contiguous" : ""), base,
                  a.strategy.c_str(), best.compute_seconds, best.wait_seconds, total, base / total, best.blocks,
                  static_cast<long long>(pairs), peak_rss_mib() - rss0);
    std::vector<char> all(static_cast<std::size_t>(size) * sizeof line);
    MPI_Gather(line, sizeof line, MPI_CHAR, all.data(), sizeof line, MPI_CHAR, 0, MPI_COMM_WORLD);
    double mine = best.compute_seconds, lo = 0, hi = 0;
    MPI_Reduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("cp_bench: %s S=%lld H=%lld D=%lld cp=%d %s%s\n", attend::describe(spec).c_str(),
                  static_cast<long long>(a.seqlen), static_cast<long long>(a.heads), static_cast<long long>(a.dim),
                  size, a.backward ? "forward+backward" : "forward", a.reps > 1 ? " (best of reps)" : "");
      for (int r = 0; r < size; ++r) std::printf("%s\n", all.data() + static_cast<std::size_t>(r) * sizeof line);
      std::printf("compute spread over ranks: max/min = %.3f\n", lo > 0 ? hi / lo : 0.0);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cp_bench rank %d: %s\n", rank, e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
