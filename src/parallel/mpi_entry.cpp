// attend::parallel::forward/backward over MPI: the collective checks before
// any compute, the chosen engine, the agreement after it, and only then the
// caller's outputs.
#include <functional>
#include <string>

#include "attend/merge.h"
#include "attend/parallel_mpi.h"
#include "parallel/mpi_engines.h"
#include "parallel/shard_grid.h"

namespace attend::parallel {

namespace {

using detail::Failure;
using detail::Job;
using detail::Link;

// Equal on every rank running the same job (the rank itself excluded).
std::uint64_t fingerprint(const Plan& plan, Pass pass) {
  const std::string key = signature(plan.spec) + "|" + std::string(attend::to_string(plan.mode)) + "|" +
                          std::to_string(plan.config.size) + "|" + std::string(to_string(plan.config.strategy)) + "|" +
                          std::string(to_string(plan.strategy)) + "|" + std::string(attend::to_string(pass)) + "|" +
                          std::to_string(plan.balanced);
  return std::hash<std::string>{}(key);
}

// Checks that need no peer; a failure here joins the first agreement.
void local_checks(const Plan& plan, const Link& link, Pass pass) {
  if (!plan.viable()) {
    throw Error(ErrorCode::unsupported, "cp_strategy", std::string(to_string(plan.config.strategy)),
                "no CP strategy can run this problem:\n" + plan.explain());
  }
  if (plan.config.rank != link.rank()) {
    throw Error(ErrorCode::invalid_argument, "cp_rank", std::to_string(plan.config.rank),
                "the plan is for rank " + std::to_string(plan.config.rank) + " but this process is rank " +
                    std::to_string(link.rank()) + " of the communicator");
  }
  if (pass == Pass::backward && plan.mode != Mode::training) {
    throw Error(ErrorCode::bad_state, "mode", "inference", "backward needs a plan made for Mode::training");
  }
}

Link open_link(MPI_Comm comm, const Plan& plan, const RunOptions& options) {
  Link link(comm, options.timeout_seconds);
  // Every rank sees the same communicator size, so every rank throws here alike.
  if (link.size() != plan.config.size) {
    throw Error(ErrorCode::invalid_argument, "cp", std::to_string(plan.config.size),
                "the communicator has " + std::to_string(link.size()) + " ranks but the CP size is " +
                    std::to_string(plan.config.size));
  }
  return link;
}

}  // namespace

void forward(MPI_Comm comm, const Plan& plan, const Inputs& local, const TensorView& out, const TensorView& lse,
             const RunOptions& options) {
  const Link link = open_link(comm, plan, options);
  const Policy policy = options.policy != nullptr ? *options.policy : current_policy();
  const std::uint64_t fp = fingerprint(plan, Pass::forward);
  Failure failure;
  detail::guarded(failure, [&] {
    local_checks(plan, link, Pass::forward);
    validate_forward(ForwardArgs{plan.local_spec(), local, out, lse});
  });
  link.agree(failure.status(fp));

  RunStats scratch;
  RunStats& stats = options.stats != nullptr ? *options.stats : scratch;
  stats = {};
  const Job job{plan, link, options, policy, failure, stats};
  const detail::LocalForward r =
      plan.strategy == Strategy::ring ? detail::ring_forward(job, local) : detail::a2a_forward(job, local);
  link.agree(failure.status(fp));
  const AttentionSpec ls = plan.local_spec();
  const Partial part[] = {{r.out, r.lse}};
  merge(ls, part, out, lse);  // the one rounding of the result
}

void backward(MPI_Comm comm, const Plan& plan, const Inputs& local, const TensorView& out, const TensorView& lse,
              const TensorView& dout, const GradViews& grads, const RunOptions& options) {
  const Link link = open_link(comm, plan, options);
  const Policy policy = options.policy != nullptr ? *options.policy : current_policy();
  const std::uint64_t fp = fingerprint(plan, Pass::backward);
  Failure failure;
  detail::guarded(failure, [&] {
    local_checks(plan, link, Pass::backward);
    BackwardArgs args{plan.local_spec(), local, out, lse, dout, grads.dq, grads.dk, grads.dv, grads.dbias};
    args.dsinks = grads.dsinks;
    validate_backward(args);
  });
  link.agree(failure.status(fp));

  RunStats scratch;
  RunStats& stats = options.stats != nullptr ? *options.stats : scratch;
  stats = {};
  const Job job{plan, link, options, policy, failure, stats};
  const detail::LocalGrads g = plan.strategy == Strategy::ring ? detail::ring_backward(job, local, out, lse, dout)
                                                               : detail::a2a_backward(job, local, out, lse, dout);
  link.agree(failure.status(fp));
  detail::convert_grid(detail::grid(g.dq), detail::grid(grads.dq), false);
  detail::convert_grid(detail::grid(g.dk), detail::grid(grads.dk), false);
  detail::convert_grid(detail::grid(g.dv), detail::grid(grads.dv), false);
  if (g.dsinks.defined()) {
    const TensorView& d = grads.dsinks;
    const std::size_t es = size_of(d.dtype);
    for (std::int64_t h = 0; h < d.shape[0]; ++h) {
      detail::store(static_cast<std::byte*>(d.data) + static_cast<std::size_t>(h * d.strides[0]) * es, d.dtype,
                    detail::load(static_cast<const std::byte*>(g.dsinks.data()) + static_cast<std::size_t>(h) * es,
                                 g.dsinks.view().dtype));
    }
  }
}

}  // namespace attend::parallel
