// The non-finite input rule (README "Semantics", docs/design.md), for every
// registered backend, every pass it runs, and (this binary runs once per
// ATTEND_ISA family) every flash/decode kernel family this CPU has:
// - NaN propagates as in IEEE arithmetic: it reaches exactly the outputs that
//   depend on the NaN input (out, LSE, dq, dk, dv, dbias) and no other one;
// - ±inf inputs give what IEEE arithmetic gives the textbook formulas, the same
//   on every backend (class NaN / +inf / -inf / finite, and the finite values);
// - a pair outside the causal/window/varlen mask does not exist, and a fully
//   masked row stays out = 0, LSE = -inf, no gradient, whatever it holds.
// The expected set of reached outputs is derived here from the mask alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/reference.h"
#include "support/feature_case.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::FeatureCase;
using testing::PassResults;
using testing::Problem;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Element offsets of the problem's tensors and the mask, independent of the backends.
struct Geometry {
  AttentionSpec s;
  std::vector<std::int32_t> lens_q, lens_kv;  // per sequence
  std::vector<std::int64_t> q0, k0;           // varlen: first token of each sequence

  explicit Geometry(const Problem& p) : s(p.spec) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      const bool var = s.varlen();
      q0.push_back(var ? p.cu_q.as<std::int32_t>()[b] : 0);
      k0.push_back(var ? p.cu_kv.as<std::int32_t>()[b] : 0);
      lens_q.push_back(static_cast<std::int32_t>(var ? p.cu_q.as<std::int32_t>()[b + 1] - q0[b] : s.seqlen_q));
      lens_kv.push_back(static_cast<std::int32_t>(var ? p.cu_kv.as<std::int32_t>()[b + 1] - k0[b] : s.seqlen_kv));
    }
  }
  std::int64_t group() const { return s.heads_q / s.heads_kv; }
  // Bottom-right aligned causal / window mask: row i sits at key position i + Sk - Sq.
  std::pair<std::int64_t, std::int64_t> visible(std::int64_t b, std::int64_t i) const {
    const std::int64_t sk = lens_kv[b], pos = i + sk - lens_q[b];
    const std::int64_t right = s.causal ? 0 : s.window_right, left = s.window_left;
    const std::int64_t lo = left < 0 ? 0 : std::max<std::int64_t>(0, pos - left);
    const std::int64_t hi = right < 0 ? sk : std::min(sk, pos + right + 1);
    return {lo, std::max(lo, hi)};
  }
  bool sees(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const auto [lo, hi] = visible(b, i);
    return j >= lo && j < hi;
  }
  std::int64_t q_tok(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t dim) const {
    return s.varlen() ? ((q0[b] + i) * s.heads_q + h) * dim : ((b * s.seqlen_q + i) * s.heads_q + h) * dim;
  }
  std::int64_t k_tok(std::int64_t b, std::int64_t j, std::int64_t hk, std::int64_t dim) const {
    return s.varlen() ? ((k0[b] + j) * s.heads_kv + hk) * dim : ((b * s.seqlen_kv + j) * s.heads_kv + hk) * dim;
  }
  std::int64_t lse_at(std::int64_t b, std::int64_t i, std::int64_t h) const {
    return s.varlen() ? h * s.total_q + q0[b] + i : (b * s.heads_q + h) * s.seqlen_q + i;
  }
  std::int64_t bias_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return ((b * s.heads_q + h) * s.seqlen_q + i) * s.seqlen_kv + j;
  }
};

// Which output elements the bad input reaches (1), per output tensor.
struct Reach {
  std::vector<char> out, lse, dq, dk, dv, dbias;
  explicit Reach(const PassResults& r)
      : out(size(r.out)), lse(size(r.lse)), dq(size(r.dq)), dk(size(r.dk)), dv(size(r.dv)), dbias(size(r.dbias)) {}
  static std::size_t size(const Tensor& t) { return t.defined() ? static_cast<std::size_t>(t.numel()) : 0; }

  // (A forward-only run has no gradients: their vectors stay empty.)
  static void all(std::vector<char>& v, std::int64_t at, std::int64_t n = 1) {
    if (!v.empty()) std::fill_n(v.begin() + at, n, 1);
  }

  // The backward of row (b, i, h) once its D = rowsum(dO * O) is NaN: dq of the
  // row, dk of the keys it sees, dbias of its visible entries.
  void row_backward(const Geometry& g, std::int64_t b, std::int64_t i, std::int64_t h) {
    const AttentionSpec& s = g.s;
    all(dq, g.q_tok(b, i, h, s.head_dim_qk), s.head_dim_qk);
    const auto [lo, hi] = g.visible(b, i);
    for (std::int64_t j = lo; j < hi; ++j) {
      all(dk, g.k_tok(b, j, h / g.group(), s.head_dim_qk), s.head_dim_qk);
      all(dbias, g.bias_at(b, h, i, j));
    }
  }
  // A row whose logits are poisoned: its whole softmax and everything downstream.
  void row(const Geometry& g, std::int64_t b, std::int64_t i, std::int64_t h) {
    const AttentionSpec& s = g.s;
    all(out, g.q_tok(b, i, h, s.head_dim_v), s.head_dim_v);
    all(lse, g.lse_at(b, i, h));
    row_backward(g, b, i, h);
    const auto [lo, hi] = g.visible(b, i);
    for (std::int64_t j = lo; j < hi; ++j) all(dv, g.k_tok(b, j, h / g.group(), s.head_dim_v), s.head_dim_v);
  }
};

enum class Site { q, k, v, dout, bias };
const char* site_name(Site s) {
  switch (s) {
    case Site::q: return "q";
    case Site::k: return "k";
    case Site::v: return "v";
    case Site::dout: return "dout";
    default: return "bias";
  }
}

// A bad element at (b, token, head, d) of `site`; for bias, token = query row, d = key.
struct Injection {
  Site site;
  std::int64_t b, t, h, d;
};

Reach expected_reach(const Geometry& g, const PassResults& shape, const Injection& x) {
  Reach r(shape);
  const AttentionSpec& s = g.s;
  const auto rows_seeing = [&](auto&& fn) {  // every (i, h) of the kv head's group that sees key x.t
    for (std::int64_t h = x.h * g.group(); h < (x.h + 1) * g.group(); ++h)
      for (std::int64_t i = 0; i < g.lens_q[x.b]; ++i)
        if (g.sees(x.b, i, x.t)) fn(i, h);
  };
  switch (x.site) {
    case Site::q:
      if (g.visible(x.b, x.t).first < g.visible(x.b, x.t).second) r.row(g, x.b, x.t, x.h);
      break;
    case Site::bias:
      if (g.sees(x.b, x.t, x.d)) r.row(g, x.b, x.t, x.h);
      break;
    case Site::k: rows_seeing([&](std::int64_t i, std::int64_t h) { r.row(g, x.b, i, h); }); break;
    case Site::v:  // one output component; D of those rows; never dv (it does not read v)
      rows_seeing([&](std::int64_t i, std::int64_t h) {
        Reach::all(r.out, g.q_tok(x.b, i, h, s.head_dim_v) + x.d);
        r.row_backward(g, x.b, i, h);
      });
      break;
    case Site::dout: {
      const auto [lo, hi] = g.visible(x.b, x.t);
      if (lo == hi) break;  // a fully masked row's dout reaches nothing
      r.row_backward(g, x.b, x.t, x.h);
      for (std::int64_t j = lo; j < hi; ++j) Reach::all(r.dv, g.k_tok(x.b, j, x.h / g.group(), s.head_dim_v) + x.d);
      break;
    }
  }
  return r;
}

void inject(const Geometry& g, Problem& p, const Injection& x, double value) {
  const AttentionSpec& s = g.s;
  switch (x.site) {
    case Site::q: testing::set_element(p.q, g.q_tok(x.b, x.t, x.h, s.head_dim_qk) + x.d, value); return;
    case Site::k: testing::set_element(p.k, g.k_tok(x.b, x.t, x.h, s.head_dim_qk) + x.d, value); return;
    case Site::v: testing::set_element(p.v, g.k_tok(x.b, x.t, x.h, s.head_dim_v) + x.d, value); return;
    case Site::dout: testing::set_element(p.dout, g.q_tok(x.b, x.t, x.h, s.head_dim_v) + x.d, value); return;
    case Site::bias: testing::set_element(p.bias, g.bias_at(x.b, x.h, x.t, x.d), value); return;
  }
}

int value_class(double x) { return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3; }

// Elements outside `reach` equal the clean run's; inside, NaN input gives NaN, and
// an infinite input gives what `oracle` (the reference on the same dirty input) gives.
void expect_reach(const char* what, const Tensor& clean, const Tensor& dirty, const Tensor* oracle,
                  const std::vector<char>& reach, double rtol) {
  if (!dirty.defined()) return;
  int bad = 0;
  for (std::int64_t e = 0; e < dirty.numel(); ++e) {
    const double c = testing::element(clean, e), d = testing::element(dirty, e);
    bool ok = true;
    double want = c;
    if (!reach[e]) {
      ok = value_class(d) == value_class(c) && (value_class(c) != 3 || std::abs(d - c) <= rtol * (1 + std::abs(c)));
    } else if (oracle == nullptr) {
      want = kNaN;
      ok = std::isnan(d);
    } else {
      want = testing::element(*oracle, e);
      ok = value_class(d) == value_class(want) &&
           (value_class(want) != 3 || std::abs(d - want) <= 1e3 * rtol * (1 + std::abs(want)));
    }
    if (!ok && ++bad <= 3)
      ADD_FAILURE() << what << "[" << e << "] = " << d << ", want " << want
                    << (reach[e] ? " (reached)" : " (not reached)");
  }
  EXPECT_EQ(bad, 0) << what << ": elements off the rule";
}

struct RuleCase {
  FeatureCase c;
  DType dtype = DType::f32;
  bool bias_grad = false;
};

void PrintTo(const RuleCase& rc, std::ostream* os) { *os << rc.c.name; }

std::vector<Injection> injections(const Geometry& g, const RuleCase& rc) {
  const AttentionSpec& s = g.s;
  // The last sequence with keys and queries; its last row (bottom-right masks leave it keys).
  std::int64_t b = s.batch - 1;
  while (b > 0 && (g.lens_q[b] == 0 || g.lens_kv[b] == 0)) --b;
  const std::int64_t i = g.lens_q[b] - 1, j = g.lens_kv[b] / 2, h = s.heads_q - 1, hk = s.heads_kv - 1;
  std::vector<Injection> v{{Site::q, b, i, h, s.head_dim_qk - 1},
                           {Site::k, b, j, hk, 1},
                           {Site::v, b, j, hk, s.head_dim_v - 1},
                           {Site::dout, b, i, h, 0}};
  if (rc.c.bias) v.push_back({Site::bias, b, i, h, g.visible(b, i).first});
  if (g.visible(b, 0).first == g.visible(b, 0).second) {  // a fully masked row: reaches nothing
    v.push_back({Site::q, b, 0, h, 0});
    v.push_back({Site::dout, b, 0, h, 0});
  }
  return v;
}

class NonFiniteRule : public ::testing::TestWithParam<RuleCase> {
 protected:
  // For every backend that takes the problem: clean and dirty runs, reach checked.
  void run_rule(double value) {
    const RuleCase& rc = GetParam();
    AttentionSpec s = rc.c.spec(77);
    s.dtype = rc.dtype;
    s.bias_requires_grad = rc.bias_grad;
    if (!s.varlen()) s.batch = 2;  // the other sequence is never reached
    const Problem clean = testing::make_problem(s, 5, rc.c.lens_q, rc.c.lens_kv);
    const Geometry g(clean);
    const double rtol = rc.dtype == DType::f32 ? 2e-6 : 1e-2;
    for (const Injection& x : injections(g, rc)) {
      Problem dirty = testing::make_problem(s, 5, rc.c.lens_q, rc.c.lens_kv);
      inject(g, dirty, x, x.site == Site::k ? -value : value);  // -inf in k: a zero weight where q_d > 0
      const auto ref = make_reference_backend();
      const PassResults oracle = testing::run_backend(*ref, dirty, true);
      for (const auto& e : Registry::global().backends()) {
        const Backend& be = *e.backend;
        if (!be.check(dirty.spec, Pass::forward).ok()) continue;
        const bool bwd = be.check(dirty.spec, Pass::backward).ok();
        SCOPED_TRACE(std::string(be.name()) + ": " + std::to_string(value) + " in " + site_name(x.site) + " b" +
                     std::to_string(x.b) + " t" + std::to_string(x.t) + " h" + std::to_string(x.h) + " d" +
                     std::to_string(x.d));
        const PassResults c = testing::run_backend(be, clean, bwd), d = testing::run_backend(be, dirty, bwd);
        const Reach want = expected_reach(g, d, x);
        const bool nan = std::isnan(value);
        expect_reach("out", c.out, d.out, nan ? nullptr : &oracle.out, want.out, rtol);
        expect_reach("lse", c.lse, d.lse, nan ? nullptr : &oracle.lse, want.lse, rtol);
        if (!bwd) continue;
        expect_reach("dq", c.dq, d.dq, nan ? nullptr : &oracle.dq, want.dq, rtol);
        expect_reach("dk", c.dk, d.dk, nan ? nullptr : &oracle.dk, want.dk, rtol);
        expect_reach("dv", c.dv, d.dv, nan ? nullptr : &oracle.dv, want.dv, rtol);
        expect_reach("dbias", c.dbias, d.dbias, nan ? nullptr : &oracle.dbias, want.dbias, rtol);
      }
    }
  }
};

TEST_P(NonFiniteRule, NanReachesExactlyTheOutputsThatDependOnIt) { run_rule(kNaN); }
TEST_P(NonFiniteRule, InfinityGivesTheSameResultOnEveryBackend) { run_rule(kInf); }

std::vector<RuleCase> rule_cases() {
  std::vector<RuleCase> v;
  const auto add = [&](FeatureCase c, DType dt = DType::f32, bool bias_grad = false) {
    v.push_back({std::move(c), dt, bias_grad});
  };
  auto c = testing::make_case("mha_5x7_d12_v10", 5, 7, 12, 10);
  add(c);
  c.name = "mha_5x7_bf16";
  add(c, DType::bf16);
  c = testing::make_case("gqa_causal_9x6_empty_rows", 9, 6, 16, 16, 4, 2);
  c.causal = true;
  add(c);
  c = testing::make_case("window_2_1_alibi", 10, 10, 8, 8);
  c.wl = 2;
  c.wr = 1;
  c.alibi = true;
  add(c);
  c = testing::make_case("softcap_4", 6, 8, 8, 8);
  c.softcap = 4;
  add(c);
  c = testing::make_case("bias", 6, 8, 8, 8);
  c.bias = true;
  add(c);
  c.name = "bias_with_grad";
  add(c, DType::f32, true);
  c = testing::make_case("dropout_0.3", 6, 8, 8, 8);
  c.dropout = 0.3;
  add(c);
  c = testing::make_case("varlen_causal_mqa", 0, 0, 8, 8, 2, 1);
  c.lens_q = {4, 0, 6};
  c.lens_kv = {5, 3, 2};
  c.causal = true;
  add(c);
  // Several tiles in both passes, masked pairs inside the diagonal tiles.
  c = testing::make_case("causal_70x140_mqa_tiles", 70, 140, 16, 16, 2, 1);
  c.causal = true;
  add(c);
  // decode: several splits of one sequence, combined through their LSEs.
  c = testing::make_case("decode_2x700_causal_mqa", 2, 700, 16, 16, 4, 1);
  c.causal = true;
  add(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, NonFiniteRule, ::testing::ValuesIn(rule_cases()), [](const auto& param_info) {
  std::string n = param_info.param.c.name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

}  // namespace
}  // namespace attend
