"""attend.explain(device=..., target=...): the GPU backends' verdicts from a machine without a GPU, for the GPU
the cudnn backend is told to answer for (issue 35). Skipped where the build has no cudnn backend or a GPU is
present (the check then asks the device, not the target)."""

import contextlib
import os
import threading
import time

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
    assert "target:  cudnn's forward/backward columns are verdicts for B200 descriptor, not for cuda:0" in text
    # 64/512 never trains on cuDNN: the backward's rule reason, whatever the engine.
    assert "backward for B200 descriptor: NO, by cuDNN's rules for sm_100" in text
    assert "head_dim_v=512 (head dims 64/512) exceeds cuDNN's backward limit" in text
    (cudnn,) = cudnn_rows(e)
    assert cudnn["backward"]["target"]["supported"] is False
    assert cudnn["backward"]["target"]["decided_by"].startswith("cuDNN's rules for sm_100")
    assert cudnn["forward"]["supported"] is False, "nothing runs here: the verdict here stays no"
    e = attend.explain(device="cuda", target="a100", mode="training", **MLA)
    assert "backward for A100 SXM4 80GB descriptor: NO, by cuDNN's rules for sm_80" in str(e)


def test_a_named_gpu_gets_cudnns_own_verdict_or_the_reason_it_could_not_be_asked(target_env):
    # 192/128 trains on B200 by the rules: cuDNN is asked about both passes.
    e = attend.explain(device="cuda", target="b200", mode="training", **dict(MLA, head_dim_qk=192, head_dim_v=128))
    (cudnn,) = cudnn_rows(e)
    for p in ("forward", "backward"):
        asked = f"{p} for B200 descriptor: ok, by cuDNN 9." in str(e) and \
            cudnn[p]["target"]["verdict"].startswith(f"accepted the {p} graph")
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


def refusal(target, **extra):
    """The attend error explain(target=...) raises, checked to name the argument."""
    with pytest.raises(attend.AttendError) as refused:
        attend.explain(device="cuda", target=target, mode="inference", **MLA, **extra)
    assert refused.value.field == "target", refused.value
    return refused.value


def test_a_target_that_is_no_text_is_an_attend_error_naming_target(target_env):
    # Were: TypeError from os.environ (a number), ValueError (a NUL), and "" silently meant sm_90.
    for bad in (100, "h100\0", "", ["h100"]):
        e = refusal(bad)
        assert isinstance(e, attend.errors.InvalidArgumentError) and "target=" in str(e), e
    assert os.environ["ATTEND_CUDNN_TARGET"] == "sm_90"


def test_a_descriptor_nested_3m_levels_deep_is_refused_not_a_crash(target_env, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"deviceVer":900,"x":' + "[" * 3_000_000 + "]" * 3_000_000 + "}")
    assert str(deep) in str(refusal(str(deep)))
    shallow_but_deep = tmp_path / "deep_small.json"
    shallow_but_deep.write_text('{"deviceVer":900,"x":' + "[" * 200_000 + "]" * 200_000 + "}")
    assert "nests deeper" in str(refusal(str(shallow_but_deep)))


def test_only_a_regular_file_is_read_as_a_descriptor(target_env, tmp_path):
    assert "is not a regular file" in str(refusal("/dev/zero"))
    fifo = tmp_path / "gpu.json"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():
        # Were the open to block, a writer after 5 s lets it through: the test fails instead of hanging.
        if done.wait(5):
            return
        while not done.is_set():
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            time.sleep(0.01)

    writer = threading.Thread(target=unblock)
    writer.start()
    start = time.monotonic()
    try:
        e = refusal(str(fifo))
    finally:
        done.set()
        writer.join()
    assert time.monotonic() - start < 2 and "is not a regular file" in str(e), e


def test_the_rules_read_the_descriptors_top_level_keys(target_env, tmp_path):
    p = tmp_path / "nested.json"
    p.write_text('{"meta": {"deviceVer": 800}, "deviceName": "Quoted \\"GPU\\"", "deviceVer": 900}')
    # 64/512 trains nowhere: the backward's refusal names the rules of the descriptor's deviceVer.
    text = str(attend.explain(device="cuda", target=str(p), mode="training", **MLA))
    assert "NO, by cuDNN's rules for sm_90" in text and 'Quoted "GPU" descriptor' in text, text
    twice = tmp_path / "twice.json"
    twice.write_text('{"deviceVer": 800, "deviceVer": 900}')
    assert '"deviceVer" twice' in str(refusal(str(twice)))


def test_an_edited_descriptor_file_is_read_again(target_env, tmp_path):
    p = tmp_path / "gpu.json"
    p.write_text('{"deviceName": "Edited", "deviceVer": 800}')
    assert "NO, by cuDNN's rules for sm_80" in str(attend.explain(device="cuda", target=p, mode="training", **MLA))
    p.write_text('{"deviceName": "Edited", "deviceVer": 1000}')
    assert "NO, by cuDNN's rules for sm_100" in str(attend.explain(device="cuda", target=p, mode="training", **MLA))
