// A selection policy for the calling thread only, over the process-wide one.
#pragma once

#include <cstdint>

#include "attend/select.h"

namespace attend {

// Until it is popped, selections on the calling thread use `policy`; other
// threads, and this one after the pop, see what they saw before. Pushes nest,
// the innermost wins; current_policy() returns it. Scoped blocks in several
// threads then cannot restore each other's policy, as a save/set/restore of
// the process-wide one (set_policy) does when the blocks overlap.
// push validates `policy` and returns a token; pop takes the token and removes
// that push wherever it sits (blocks that end out of order, e.g. through an
// ExitStack, still remove exactly their own), and throws Error(bad_state) for
// a token this thread does not hold.
std::uint64_t push_thread_policy(Policy policy);
void pop_thread_policy(std::uint64_t token);

}  // namespace attend
