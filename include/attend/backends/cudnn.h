// The cudnn backend: NVIDIA cuDNN's fused scaled-dot-product attention (the
// cudnn-frontend graph API's sdpa and sdpa_backward nodes) on tensors in
// device memory (cuda:N), bf16/f16, forward and backward.
//
// Built when CMake enables CUDA and finds cuDNN's headers and cudnn-frontend
// (ATTEND_CUDNN=AUTO|ON|OFF). Nothing links cuDNN: the first check of a
// problem on a cuda device opens libcudnn.so.9 ($ATTEND_CUDNN_LIBRARY
// overrides the name); where that fails every check declines with the loader's
// message ([library]), so libattend runs unchanged without cuDNN.
//
// The check has two layers, per pass. Rules: cuDNN's documented support as a
// function of the spec, the pass, the cuDNN version and the compute
// capability; without a usable device they are evaluated for
// $ATTEND_CUDNN_TARGET ("sm_90,9.19.0" or "h100"; default sm_90 and the cuDNN
// version of the headers attend was built with; set_cudnn_target below) and
// the verdict also carries the [device] reason. Engine: on a device with cuDNN loaded, a pass is supported
// only when cuDNN builds a plan for that pass's graph (validate,
// build_operation_graph, create_execution_plans, check_support,
// build_plans); its message is the [library] reason. Built graphs are cached
// per (pass, device, spec, strides), at most 256, least recently used first out.
//
// Semantics: attend's (FlashAttention's) — scale, bottom-right aligned
// causal/window masks (cuDNN's diagonal band with BOTTOM_RIGHT alignment
// where seqlen_q != seqlen_kv or lengths vary per sequence), GQA/MQA, additive
// bias (no dbias), varlen (thd: ragged offsets and sequence lengths built from
// cu_seqlens, which are read back and validated, one stream sync), paged K/V
// for inference, attention sinks (cuDNN 9.13+), LSE (natural log, f32) always
// written. Declined with a reason: f32/f64, softcap, ALiBi (cuDNN computes
// its own slopes), dropout (cuDNN's Philox mask is not attend's counter
// rule), partial-problem offsets with a mask, accumulate_grads, an f32 out or
// dq, left-padded caches.
//
// Work is queued on ForwardArgs::stream / BackwardArgs::stream; the workspace
// must be device memory (a Plan or CallOptions::allocator = &cuda_allocator()).
#pragma once

#include <memory>
#include <string_view>

#include "attend/backend.h"

namespace attend {

std::shared_ptr<const Backend> make_cudnn_backend();

// The GPU the cudnn backend's check assumes where the process has none (what
// $ATTEND_CUDNN_TARGET sets): "sm_90[,9.19.0]" for the rules alone; a shipped
// descriptor, "a100", "h100", "h200" or "b200" (optionally ",9.A.B"), or a
// descriptor file ("path/gpu.json", as attend-cudnn-descriptor prints one) for
// the rules and cuDNN's own deviceless verdict on each pass's graph: a plan
// cuDNN accepts for that descriptor (check_support), not one that has run.
// Throws attend::Error naming `field` and the text when malformed. Once set,
// ATTEND_CUDNN_TARGET (otherwise read at each check) no longer applies. Set it
// before selecting: selections already cached keep their verdicts.
void set_cudnn_target(std::string_view text, std::string_view field = "cudnn target");

}  // namespace attend
