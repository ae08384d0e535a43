// Plans, variants and devices: a plan is selected and checked once and runs
// many times; the selector judges every (backend, variant); tensors carry a
// device, and a backend serving another device drops in without the runtime
// knowing it (a fake "cuda" backend that never sees host memory).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "attend/attend.h"
#include "attend/backends/flash.h"
#include "attend/backends/reference.h"
#include "support/tensors.h"

namespace attend {
namespace {

using testing::make_problem;
using testing::Problem;

AttentionSpec small_spec() {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = 24;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = 16;
  s.causal = true;
  return s;
}

// Restores the global policy and registry after each test.
class PlanTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Registry::global().reset_to_builtins();
    set_policy(Policy::from_env());
  }
};

TEST_F(PlanTest, APlanRunsManyTimesWithTheResultsOfItsBackend) {
  const Problem p = make_problem(small_spec(), 1);
  const Plan plan = Plan::make(p.spec, Mode::training);
  ASSERT_TRUE(plan.valid());
  EXPECT_EQ(plan.backend().name(), "flash");
  EXPECT_FALSE(plan.variant().empty());
  EXPECT_NE(plan.explain().find("selected: flash (" + std::string(plan.variant()) + ")"), std::string::npos);
  const testing::PassResults direct = testing::run_backend(plan.backend(), p, true);
  for (int run = 0; run < 3; ++run) {
    Tensor out = Tensor::zeros_like(direct.out), lse = Tensor::zeros_like(direct.lse);
    plan.forward(p.inputs, out, lse);
    EXPECT_TRUE(testing::bitwise_equal(out, direct.out));
    Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
    plan.backward(p.inputs, out, lse, p.dout, {dq, dk, dv});
    EXPECT_TRUE(testing::bitwise_equal(dk, direct.dk));
  }
  // Tensors that do not match the plan's spec are errors naming them.
  Problem other = make_problem(
      [] {
        AttentionSpec s = small_spec();
        s.seqlen_q = 25;
        return s;
      }(),
      2);
  Tensor out = Tensor::zeros_like(direct.out), lse = Tensor::zeros_like(direct.lse);
  try {
    plan.forward(other.inputs, out, lse);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "q.shape[1]");
  }
}

TEST_F(PlanTest, AnInferencePlanRefusesBackward) {
  const Problem p = make_problem(small_spec(), 1);
  const Plan plan = Plan::make(p.spec, Mode::inference);
  Tensor out = testing::run_backend(plan.backend(), p, false).out;
  Tensor lse = Tensor::zeros(DType::f32, {2, 4, 24});
  Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  EXPECT_THROW(plan.backward(p.inputs, out, lse, p.dout, {dq, dk, dv}), Error);
  EXPECT_THROW(Plan().forward(p.inputs, out, lse), Error);
}

TEST_F(PlanTest, EveryVariantIsJudgedAndTheIsaPolicyCapsThem) {
  const AttentionSpec s = small_spec();
  const Selection all = evaluate(s, Mode::training, Policy{});
  std::size_t flash_rows = 0;
  for (const Verdict& v : all.verdicts) flash_rows += v.backend == "flash";
  EXPECT_EQ(flash_rows, make_flash_backend()->variants().size());
  for (const char* isa : {"scalar", "avx2"}) {
    if (!flash_isa_supported(isa)) continue;
    Policy pol;
    pol.isa = isa;
    const Plan plan = Plan::make(s, Mode::training, {&pol});
    EXPECT_EQ(plan.backend().name(), "flash");
    EXPECT_EQ(plan.variant(), isa);
  }
  Policy forced;
  forced.force = "flash:scalar";
  const Plan scalar = Plan::make(s, Mode::training, {&forced});
  EXPECT_EQ(scalar.variant(), "scalar");
  const Selection sel = select(s, Mode::training, forced);
  for (const Verdict& v : sel.verdicts) {
    if (v.backend == "flash" && v.variant != "scalar") {
      EXPECT_TRUE(v.not_forced) << v.variant;
    }
  }
  // Variants compute the same problem: scalar vs the default family.
  const Problem p = make_problem(s, 4);
  Tensor a = Tensor::zeros(DType::f32, {2, 24, 4, 16}), la = Tensor::zeros(DType::f32, {2, 4, 24});
  Tensor b = Tensor::zeros_like(a), lb = Tensor::zeros_like(la);
  scalar.forward(p.inputs, a, la);
  Plan::make(s, Mode::training).forward(p.inputs, b, lb);
  EXPECT_LE(testing::max_abs_diff(a, b), 1e-5);
}

TEST_F(PlanTest, PolicyNamesAreCheckedWhenSetAndErrorsNameTheirSource) {
  Policy bad_variant;
  bad_variant.force = "flash:avx9000";
  try {
    set_policy(bad_variant);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "Policy::force");
    EXPECT_NE(std::string(e.what()).find("avx2"), std::string::npos) << e.what();  // lists the variants
  }
  Policy bad_backend;
  bad_backend.disabled = {"nosuch"};
  bad_backend.disabled_source = "--disable";
  try {
    set_policy(bad_backend);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "--disable");
  }
  Policy bad_isa;
  bad_isa.isa = "sse9";
  EXPECT_THROW(set_policy(bad_isa), Error);
}

// --- a backend for another device ------------------------------------------------

// Serves "cuda" memory only; computes through the reference on the host memory
// that stands in for the device in this test, after checking that every tensor
// it was handed is marked as device memory (it "refuses host pointers").
class FakeDeviceBackend final : public Backend {
 public:
  std::string_view name() const override { return "fake_cuda"; }
  bool serves(DeviceKind kind) const override { return kind == DeviceKind::cuda; }
  mutable std::atomic<int> forwards{0};
  mutable void* last_stream = nullptr;

 protected:
  void supports(const AttentionSpec& s, Pass, const Target& t, Support& sup) const override {
    sup.require(s.dtype == DType::f32, ReasonCode::dtype, "f32 only");
    sup.note([&] { return "cu_seqlens and block tables on " + to_string(t.device) + " are validated by the kernel"; });
  }
  std::size_t scratch_bytes(const AttentionSpec&, Pass, const Target&) const override { return 0; }
  void run_forward(const ForwardArgs& a) const override {
    ++forwards;
    last_stream = a.stream.handle;
    for (const TensorView* t : {&a.in.q, &a.in.k, &a.in.v, &a.out, &a.lse}) {
      if (t->device.kind != DeviceKind::cuda) throw Error(ErrorCode::invalid_argument, "fake", "host", "host pointer");
    }
    ForwardArgs host = a;
    for (TensorView* t : {&host.in.q, &host.in.k, &host.in.v, &host.out, &host.lse}) t->device = Device::cpu();
    host.target = {};
    make_reference_backend()->forward(host);
  }
  void run_backward(const BackwardArgs&) const override {}
};

// Hands out host memory but says it is cuda:0 — what a real CUDA allocator
// would return, for a test without a GPU.
class FakeDeviceAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Device) override { return host_allocator().allocate(bytes, Device::cpu()); }
  void deallocate(void* p, std::size_t bytes, Device) noexcept override {
    host_allocator().deallocate(p, bytes, Device::cpu());
  }
};

Inputs on_device(Inputs in, Device d) {
  for (TensorView* t : {&in.q, &in.k, &in.v, &in.cu_seqlens_q, &in.cu_seqlens_kv}) {
    if (t->defined()) t->device = d;
  }
  return in;
}

TEST_F(PlanTest, ADeviceBackendDropsInAndHostBackendsDeclineDeviceMemory) {
  auto fake = std::make_shared<FakeDeviceBackend>();
  register_backend(fake, 10);
  // The real cuda and cudnn backends (built when nvcc and cuDNN are found) would outrank the fake one.
  Registry::global().unregister_backend("cuda");
  Registry::global().unregister_backend("cudnn");
  const Problem p = make_problem(small_spec(), 6);
  const Inputs dev = on_device(p.inputs, Device::cuda(0));

  const Selection sel = select(p.spec, Mode::inference, current_policy(), Device::cuda(0));
  EXPECT_EQ(sel.backend->name(), "fake_cuda");
  for (const Verdict& v : sel.verdicts) {
    if (v.backend != "fake_cuda") {
      EXPECT_TRUE(v.forward.failed(ReasonCode::device)) << v.backend;
    }
  }
  EXPECT_NE(sel.explain().find("tensors on cuda:0"), std::string::npos) << sel.explain();
  EXPECT_NE(sel.explain().find("validated by the kernel"), std::string::npos);

  FakeDeviceAllocator alloc;
  CallOptions o;
  o.allocator = &alloc;
  int stream_token = 0;
  o.stream.handle = &stream_token;
  const ForwardResult r = forward(dev, p.spec, Mode::inference, o);
  EXPECT_EQ(fake->forwards.load(), 1);
  EXPECT_EQ(fake->last_stream, &stream_token);
  EXPECT_EQ(r.out.view().device, Device::cuda(0));
  // Same numbers as the host reference.
  const testing::PassResults host = testing::run_backend(*make_reference_backend(), p, false);
  EXPECT_LE(testing::max_abs_diff(r.out, host.out), 1e-6);

  // Host tensors on the device plan: an error before any kernel.
  const Plan plan = Plan::make(p.spec, Mode::inference, {nullptr, Device::cuda(0)});
  Tensor out = Tensor::zeros(DType::f32, {2, 24, 4, 16}), lse = Tensor::zeros(DType::f32, {2, 4, 24});
  EXPECT_THROW(plan.forward(p.inputs, out, lse), Error);
  EXPECT_EQ(fake->forwards.load(), 1);
}

TEST_F(PlanTest, MixedDevicesAreAnErrorNamingTheTensor) {
  const Problem p = make_problem(small_spec(), 6);
  Inputs mixed = p.inputs;
  mixed.k.device = Device::cuda(1);
  try {
    (void)forward(mixed, p.spec, Mode::inference);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "k.device");
    EXPECT_EQ(e.value(), "cuda:1");
  }
  // No backend serves cuda here: the table says why for each.
  try {
    (void)forward(on_device(p.inputs, Device::cuda(0)), p.spec, Mode::inference);
    FAIL() << "expected attend::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("[device]"), std::string::npos) << e.what();
  }
}

// Device memory is never read by the runtime: varlen offsets on the device
// are left to the backend (here: a pointer that would crash if dereferenced).
TEST_F(PlanTest, ContentsOfDeviceTensorsAreNotReadByTheRuntime) {
  AttentionSpec s = small_spec();
  s.layout = Layout::thd;
  s.total_q = s.total_kv = 48;
  s.batch = 2;
  Inputs in;
  const auto fake_ptr = reinterpret_cast<void*>(std::uintptr_t{16});
  in.q = TensorView::contiguous(fake_ptr, DType::f32, {48, 4, 16});
  in.k = TensorView::contiguous(fake_ptr, DType::f32, {48, 2, 16});
  in.v = TensorView::contiguous(fake_ptr, DType::f32, {48, 2, 16});
  in.cu_seqlens_q = TensorView::contiguous(fake_ptr, DType::i32, {3});
  in.cu_seqlens_kv = TensorView::contiguous(fake_ptr, DType::i32, {3});
  const Inputs dev = on_device(in, Device::cuda(0));
  EXPECT_NO_THROW(validate_inputs(s, dev));
}

// --- variants that compute different slices ------------------------------------------

// "fast" is forward-only and f32-only, "general" does both passes: the shape
// of the cuda backend's mma/simt pair, on the host. Both run the reference and
// count which variant ran.
class SlicedVariantsBackend final : public Backend {
 public:
  explicit SlicedVariantsBackend(bool runnable = true) {
    const std::string why = runnable ? "" : "no such device here";
    variants_ = {{"fast", "forward-only", why}, {"general", "both passes", why}};
  }
  std::string_view name() const override { return "sliced"; }
  std::span<const Variant> variants() const override { return variants_; }
  mutable std::atomic<int> runs[2][2] = {};  // [variant][pass]

 protected:
  void supports(const AttentionSpec& s, Pass pass, const Target& t, Support& sup) const override {
    if (t.variant == 0) {
      sup.require(pass == Pass::forward, ReasonCode::no_backward, "fast has no backward");
      sup.require(s.dtype == DType::f32, ReasonCode::dtype, "fast is f32 only");
    }
    sup.require(s.head_dim_qk <= 32, ReasonCode::head_dim_qk, "head_dim_qk above 32");
  }
  std::size_t scratch_bytes(const AttentionSpec&, Pass, const Target&) const override { return 0; }
  void run_forward(const ForwardArgs& a) const override {
    ++runs[a.target.variant][0];
    ForwardArgs r = a;
    r.target = {};
    make_reference_backend()->forward(r);
  }
  void run_backward(const BackwardArgs& a) const override {
    ++runs[a.target.variant][1];
    BackwardArgs r = a;
    r.target = {};
    make_reference_backend()->backward(r);
  }

 private:
  std::vector<Variant> variants_;
};

// A direct call with variant -1 runs, per pass, the first variant whose check
// takes it, as the selector would; when none does, the last (most general)
// variant's reasons are the answer.
TEST_F(PlanTest, VariantMinusOneResolvesPerPassToTheFirstThatAccepts) {
  const SlicedVariantsBackend b;
  const Problem p = make_problem(small_spec(), 12);
  Tensor out = Tensor::zeros(DType::f32, {2, 24, 4, 16}), lse = Tensor::zeros(DType::f32, {2, 4, 24});
  b.forward(ForwardArgs{p.spec, p.inputs, out, lse});
  Tensor dq = Tensor::zeros_like(p.q), dk = Tensor::zeros_like(p.k), dv = Tensor::zeros_like(p.v);
  b.backward(BackwardArgs{p.spec, p.inputs, out, lse, p.dout, dq, dk, dv, {}});
  EXPECT_EQ(b.runs[0][0].load(), 1);  // forward on fast
  EXPECT_EQ(b.runs[1][0].load(), 0);
  EXPECT_EQ(b.runs[0][1].load(), 0);
  EXPECT_EQ(b.runs[1][1].load(), 1);  // backward on general
  EXPECT_TRUE(b.check(p.spec, Pass::forward).ok());
  EXPECT_TRUE(b.check(p.spec, Pass::backward).ok());

  AttentionSpec wide = p.spec;
  wide.head_dim_qk = wide.head_dim_v = 64;
  const Support sup = b.check(wide, Pass::backward);
  EXPECT_TRUE(sup.failed(ReasonCode::head_dim_qk)) << sup.to_string();
  EXPECT_FALSE(sup.failed(ReasonCode::no_backward)) << "fast's reasons, not general's: " << sup.to_string();
}

// A backend none of whose variants can run in this process (a GPU backend
// without a GPU) declines with the reasons instead of throwing.
TEST_F(PlanTest, ABackendWithNothingRunnableDeclinesWithTheReasons) {
  const SlicedVariantsBackend b(false);
  const AttentionSpec s = small_spec();
  for (Pass pass : {Pass::forward, Pass::backward}) {
    Support sup;
    ASSERT_NO_THROW(sup = b.check(s, pass));
    EXPECT_TRUE(sup.failed(ReasonCode::variant)) << sup.to_string();
    EXPECT_NE(sup.to_string().find("no such device here"), std::string::npos) << sup.to_string();
  }
}

// --- the spec-field table ---------------------------------------------------------

TEST(SpecFields, EveryFieldRoundTripsAndChangesTheSignatureWhenItSelects) {
  AttentionSpec s;
  s.batch = 3;
  s.scale = 0.25;
  s.dq_dtype = DType::f32;
  s.dtype = DType::bf16;
  const std::string base = signature(s);
  for (const SpecField& f : spec_fields()) {
    AttentionSpec t = s;
    set_field(t, f, get_field(s, f));
    EXPECT_EQ(signature(t), base) << f.name;
    EXPECT_EQ(find_spec_field(f.name), &f);
  }
  // A changed value of a selecting field changes the key; the seed does not.
  for (const char* name : {"seqlen_q", "causal", "q_offset", "accumulate_grads", "out_dtype", "window_left"}) {
    AttentionSpec t = s;
    const SpecField& f = *find_spec_field(name);
    set_field(t, f,
              std::string(name) == "out_dtype"                                           ? "f32"
              : std::string(name) == "causal" || std::string(name) == "accumulate_grads" ? "true"
                                                                                         : "7");
    EXPECT_NE(signature(t), base) << name;
  }
  AttentionSpec t = s;
  set_field(t, *find_spec_field("dropout_seed"), "99");
  EXPECT_EQ(signature(t), base);
  EXPECT_THROW(set_field(t, *find_spec_field("batch"), "many"), Error);
  EXPECT_NE(spec_to_json(s).find("\"scale\": 0.25"), std::string::npos) << spec_to_json(s);
  EXPECT_NE(spec_to_json(s).find("\"out_dtype\": null"), std::string::npos);
}

TEST(ExpectedShape, FollowsTheLayout) {
  AttentionSpec s;
  s.batch = 2;
  s.seqlen_q = 3;
  s.seqlen_kv = 5;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = 8;
  s.head_dim_v = 6;
  const auto dims = [](const Shape& sh) { return std::vector<std::int64_t>(sh.dims, sh.dims + sh.ndim); };
  EXPECT_EQ(dims(expected_shape(s, Role::q)), (std::vector<std::int64_t>{2, 3, 4, 8}));
  EXPECT_EQ(dims(expected_shape(s, Role::v)), (std::vector<std::int64_t>{2, 5, 2, 6}));
  EXPECT_EQ(dims(expected_shape(s, Role::lse)), (std::vector<std::int64_t>{2, 4, 3}));
  s.layout = Layout::bhsd;
  EXPECT_EQ(dims(expected_shape(s, Role::out)), (std::vector<std::int64_t>{2, 4, 3, 6}));
  s.layout = Layout::sbhd;
  EXPECT_EQ(dims(expected_shape(s, Role::k)), (std::vector<std::int64_t>{5, 2, 2, 8}));
  s.layout = Layout::thd;
  s.total_q = 7;
  s.total_kv = 9;
  EXPECT_EQ(dims(expected_shape(s, Role::dq)), (std::vector<std::int64_t>{7, 4, 8}));
  EXPECT_EQ(dims(expected_shape(s, Role::lse)), (std::vector<std::int64_t>{4, 7}));
  EXPECT_EQ(dims(expected_shape(s, Role::cu_seqlens_kv)), (std::vector<std::int64_t>{3}));
  EXPECT_EQ(expected_dtype(s, Role::cu_seqlens_q), DType::i32);
}

}  // namespace
}  // namespace attend
