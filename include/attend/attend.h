// Umbrella header for the attend library.
#pragma once

#include "attend/attention.h"
#include "attend/backend.h"
#include "attend/device.h"
#include "attend/dtype.h"
#include "attend/error.h"
#include "attend/kvcache.h"
#include "attend/merge.h"
#include "attend/parallel.h"
#include "attend/plan.h"
#include "attend/registry.h"
#include "attend/select.h"
#include "attend/spec.h"
#include "attend/spec_fields.h"
#include "attend/tensor.h"
#include "attend/thread_policy.h"
#include "attend/tune.h"
