"""attend.explain(device=..., target=...): the GPU backends' verdicts from a machine without a GPU, for the GPU
the cudnn backend is told to answer for (issue 35). Skipped where the build has no cudnn backend or a GPU is
present (the check then asks the device, not the target)."""

import os

import pytest

import attend

MLA = dict(batch=2, seqlen_q=1024, seqlen_kv=1024, heads_q=16, heads_kv=16, head_dim_qk=64, head_dim_v=512,
           dtype="bf16")


def cudnn_rows(e):
    return [b for b in e.data["backends"] if b["name"] == "cudnn"]


@pytest.fixture
def target_env(monkeypatch):
    # explain(target=...) sets ATTEND_CUDNN_TARGET for the process: restore it after each test.
    monkeypatch.setenv("ATTEND_CUDNN_TARGET", "sm_90")
    e = attend.explain(device="cuda", mode="inference", **MLA)
    if not cudnn_rows(e):
        pytest.skip("this build has no cudnn backend")
    if "0 CUDA device(s)" not in str(e):
        pytest.skip("a CUDA device is present: cudnn asks it, not the target")


def test_explain_on_cuda_answers_for_the_named_gpu(target_env):
    e = attend.explain(device="cuda", target="b200", mode="training", **MLA)
    text = str(e)
    assert "tensors on cuda:0" in text
    assert "cuDNN's rules for sm_100" in text and "(B200 descriptor)" in text
    # 64/512 never trains on cuDNN: the backward's rule reason, whatever the engine.
    assert "head_dim_v=512 (head dims 64/512) exceeds cuDNN's backward limit" in text
    e = attend.explain(device="cuda", target="a100", mode="training", **MLA)
    assert "cuDNN's rules for sm_80" in str(e) and "(A100 SXM4 80GB descriptor)" in str(e)


def test_a_named_gpu_gets_cudnns_own_verdict_or_the_reason_it_could_not_be_asked(target_env):
    # 192/128 trains on B200 by the rules: cuDNN is asked about both passes.
    e = attend.explain(device="cuda", target="b200", mode="training", **dict(MLA, head_dim_qk=192, head_dim_v=128))
    for p in ("forward", "backward"):
        asked = f"for B200 descriptor, deviceless: accepted the {p} graph" in str(e)
        unavailable = "deviceless: cuDNN's deviceless check needs a loadable libcuda" in str(e) or \
            "cuDNN is not loaded" in str(e)
        assert asked or unavailable, str(e)


def test_explain_with_an_unknown_gpu_is_an_error_naming_the_argument_and_leaves_no_trace(target_env):
    with pytest.raises(attend.AttendError, match="target.*h900") as refused:
        attend.explain(device="cuda", target="h900", mode="inference", **MLA)
    assert refused.value.field == "target" and refused.value.value == "h900"
    # The target the process had before is in force again: later calls work.
    assert os.environ["ATTEND_CUDNN_TARGET"] == "sm_90"
    attend.explain(device="cuda", mode="inference", **MLA)
