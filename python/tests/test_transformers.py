"""attend inside Hugging Face transformers models (attn_implementation="attend").

Each model family the installed transformers has is built from a tiny config
with random weights (no download) and run twice more with the same weights on
transformers' own eager attention, in float32 and in float64. attend's float32
results must satisfy the same-precision rule of conftest.check_close: its
error against the float64 eager run is at most c times the float32 eager run's
error, plus the rounding floor. Compared: the logits of a padded batch (right
padding, as in training, and left padding, as in generation), 32 greedily
generated tokens from a left-padded batch (identical tokens), one training
step's parameter gradients on a right-padded batch, and bfloat16 logits
(against eager in bfloat16).

The module skips where transformers is absent (Debian's torch 1.13 run), and
each family where the installed transformers lacks it; the terminal summary
says how many tests each family passed and skipped.
"""

import contextlib
import copy
import importlib.util
import inspect
import logging
import os
import pathlib

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download
if importlib.util.find_spec("transformers") is None:
    pytest.skip("Hugging Face transformers is not installed (pip install 'attend[transformers]')",
                allow_module_level=True)
import transformers  # noqa: E402  (installed but broken must fail, not skip)

if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"transformers {transformers.__version__} predates the supported range (>= 5.0)",
                allow_module_level=True)

import attend  # noqa: E402
import attend.torch  # noqa: E402
from attend.integrations import transformers as hf  # noqa: E402
from conftest import check_close  # noqa: E402

from transformers import AutoModelForCausalLM  # noqa: E402

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256, initializer_range=0.15, pad_token_id=0, bos_token_id=1, eos_token_id=None,
            tie_word_embeddings=False)  # untied: tied tiny random models tend to repeat one token
WINDOW = 8  # shorter than the prompts plus the generated tokens, so the window cuts in
NEW_TOKENS = 32

# family -> (config class name, its config fields beyond TINY)
FAMILIES = {
    "llama": ("LlamaConfig", dict(num_key_value_heads=4)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=1)),  # MQA
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=16)),  # GQA
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=WINDOW)),
    # Alternating sliding/full layers; a softcap small enough that tanh bends the logits.
    "gemma2": ("Gemma2Config", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                                    layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=32,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=None)),
    "gemma3": ("Gemma3TextConfig", dict(num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
                                        layer_types=["sliding_attention", "full_attention"],
                                        query_pre_attn_scalar=32)),
    "gpt_oss": ("GptOssConfig", dict(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                                     layer_types=["sliding_attention", "full_attention"], num_local_experts=4,
                                     num_experts_per_tok=2, intermediate_size=64,
                                     rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
}

FAMILY_TESTS = ("test_logits_of_a_padded_batch", "test_bfloat16_logits", "test_greedy_generation_is_token_identical",
                "test_training_step_gradients")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    """Prints how many tests each family passed, failed and skipped (from the
    reports pytest has logged by the end of this module)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    counts = {f: {} for f in FAMILIES}
    module = request.node.nodeid
    for outcome in ("passed", "failed", "skipped"):
        for rep in reporter.stats.get(outcome, []):
            test, _, params = rep.nodeid.rpartition("::")[2].partition("[")
            fam = next((p for p in params.rstrip("]").split("-") if p in FAMILIES), None)
            if rep.nodeid.startswith(module) and test in FAMILY_TESTS and fam \
                    and (rep.when == "call" or outcome != "passed"):
                counts[fam][outcome] = counts[fam].get(outcome, 0) + 1
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        reporter.write_line(f"transformers {transformers.__version__} on attend, per family: " + "; ".join(
            f"{f}: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, {c.get('skipped', 0)} skipped"
            for f, c in counts.items()))


@pytest.fixture
def family(request):
    name = request.param
    cls_name = FAMILIES[name][0]
    if getattr(transformers, cls_name, None) is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    return name, _config(name)


def _models(cfg, seed=0):
    """(attend f32, eager f32, eager f64) with the same weights. Each model gets its
    own copy of the config: from_config writes the implementation into it. MoE
    experts run eagerly: torch's grouped_mm, their default, has no float64."""
    torch.manual_seed(seed)
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager",
                                             experts_implementation="eager", dtype=torch.float32).eval()
    on_attend = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="attend",
                                                 experts_implementation="eager", dtype=torch.float32).eval()
    on_attend.load_state_dict(eager.state_dict())
    eager64 = copy.deepcopy(eager).double()
    assert on_attend.config._attn_implementation == "attend"
    return on_attend, eager, eager64


@contextlib.contextmanager
def _float64_eager_masks():
    """Eager attention adds finfo(dtype).min for masked keys and takes the softmax
    in float32: in a float64 model that min is -inf in float32, and a row with
    every key masked (a left-padding row) turns NaN, then spreads through the
    next layer's values. Within this block the eager mask uses float32's min
    (finite in both), so float64 runs mask as float32 runs do."""
    import transformers.masking_utils as mu
    table = mu.AttentionMaskInterface._global_mapping
    eager_mask = table["eager"]

    def finite(*args, dtype=torch.float32, **kwargs):
        m = eager_mask(*args, dtype=torch.float32, **kwargs)
        return m.to(dtype) if m is not None else None

    table["eager"] = finite
    try:
        yield
    finally:
        table["eager"] = eager_mask


def _batch(padding, seed=1, lengths=(14, 9, 12)):
    """input_ids and attention_mask of a padded batch (pad id 0)."""
    gen = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.randint(3, TINY["vocab_size"], (len(lengths), S), generator=gen)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, S - n:] = 1 if padding == "left" else 0
        mask[b, :n] = 1 if padding == "right" else mask[b, :n]
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def _calls(monkeypatch):
    """Records the mask of each attention call attend serves (proof the model ran
    on attend, and what it was asked)."""
    seen = []
    inner = hf.attention_forward

    def counting(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append(attention_mask)
        return inner(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setitem(transformers.modeling_utils.AttentionInterface._global_mapping, "attend", counting)
    return seen


def _logits(models, ids, mask):
    """The logits of (attend f32, eager f32, eager f64) as the same-precision rule
    takes them: got, ref (the float64 truth rounded once to float32), pt."""
    on_attend, eager, eager64 = models
    with torch.no_grad():
        got = on_attend(ids, attention_mask=mask).logits
        with _float64_eager_masks():
            ref = eager64(ids, attention_mask=mask).logits.float()
        pt = eager(ids, attention_mask=mask).logits
    return got, ref, pt


def _config(name, **extra):
    """Family `name`'s tiny config, `extra` fields replacing its own."""
    cls_name, fields = FAMILIES[name]
    return getattr(transformers, cls_name)(**dict(TINY, **{**fields, **extra}))


ALL = pytest.mark.parametrize("family", sorted(FAMILIES), indirect=True)


@ALL
@pytest.mark.parametrize("padding", ["right", "left"])
def test_logits_of_a_padded_batch(family, padding, monkeypatch):
    name, cfg = family
    ids, mask = _batch(padding)
    calls = _calls(monkeypatch)
    got, ref, pt = _logits(_models(cfg), ids, mask)
    assert len(calls) == cfg.num_hidden_layers, f"{name}: attend served {len(calls)} attention calls"
    real = mask.bool()  # padding rows are undefined (eager: an average of padding; attend: 0)
    check_close(f"{name} logits ({padding} padding)", got[real], ref[real], pt[real], c=3.0)


@ALL
def test_bfloat16_logits(family, monkeypatch):
    """A bfloat16 model runs attention in bfloat16 on attend (f32 accumulation
    inside), as accurate as eager attention in bfloat16."""
    name, cfg = family
    on_attend, eager, eager64 = _models(cfg)
    ids, mask = _batch("left")
    calls = _calls(monkeypatch)
    got, ref, pt = _logits((on_attend.to(torch.bfloat16), eager.to(torch.bfloat16), eager64), ids, mask)
    assert len(calls) == cfg.num_hidden_layers and got.dtype == torch.bfloat16
    real = mask.bool()
    check_close(f"{name} bfloat16 logits", got[real], ref[real], pt[real], c=2.0)


@ALL
def test_greedy_generation_is_token_identical(family, monkeypatch):
    name, cfg = family
    on_attend, eager, _ = _models(cfg)
    ids, mask = _batch("left")
    calls = _calls(monkeypatch)
    kw = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
              pad_token_id=0)
    got = on_attend.generate(ids, **kw)
    ref = eager.generate(ids, **kw)
    assert got.shape == (ids.shape[0], ids.shape[1] + NEW_TOKENS)
    # One prefill and NEW_TOKENS - 1 single-token steps per layer, all on attend.
    assert len(calls) == cfg.num_hidden_layers * NEW_TOKENS
    diff = (got != ref).nonzero()
    assert diff.numel() == 0, f"{name}: generated tokens differ first at (batch, position) {diff[0].tolist()}"


def _loss_and_grads(model, ids, mask):
    model.train()
    model.zero_grad(set_to_none=True)
    labels = ids.masked_fill(mask == 0, -100)  # padding takes no part in the loss
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@ALL
def test_training_step_gradients(family, monkeypatch):
    name, cfg = family
    on_attend, eager, eager64 = _models(cfg)
    ids, mask = _batch("right")
    calls = _calls(monkeypatch)
    loss, grads = _loss_and_grads(on_attend, ids, mask)
    with _float64_eager_masks():
        loss_ref, grads_ref = _loss_and_grads(eager64, ids, mask)
    loss_pt, grads_pt = _loss_and_grads(eager, ids, mask)
    assert len(calls) == cfg.num_hidden_layers
    # The float64 results rounded once to float32, as conftest's references are.
    # The loss is one number: a floor of 4 ulp, since conftest's floor (one add's
    # rounding noise over a tensor) is 0 for a lucky single value.
    err, err_pt = abs(loss.item() - loss_ref.item()), abs(loss_pt.item() - loss_ref.item())
    assert err <= 3.0 * err_pt + 4 * torch.finfo(torch.float32).eps * abs(loss_ref.item()), \
        f"{name} loss: err {err:.3e}, float32 eager's {err_pt:.3e}"
    assert set(grads) == set(grads_ref), f"{name}: parameters with gradients differ"
    for n in grads:
        check_close(f"{name} grad {n}", grads[n], grads_ref[n].float(), grads_pt[n], c=4.0)
    if name == "gpt_oss":  # the sink logits get their gradient through attend's backward
        sinks = [n for n in grads if n.endswith("self_attn.sinks")]
        assert len(sinks) == cfg.num_hidden_layers and all(grads[n].abs().max() > 0 for n in sinks)


# --- the integration's own behaviour (one family is enough) -----------------------------------------

def _llama(**fields):
    return _config("llama", **{"num_key_value_heads": 2, **fields})  # GQA


def test_padded_batches_build_no_dense_mask(monkeypatch):
    """The 'attend' mask function hands layers a PaddingMask: transformers' dense
    mask builder is never called, in a padded forward, backward or generate."""
    on_attend, _, _ = _models(_llama(sliding_window=WINDOW))

    def dense(*a, **k):
        raise AssertionError("a dense 4-D mask was built")

    import transformers.masking_utils as mu
    monkeypatch.setattr(mu, "sdpa_mask", dense)
    monkeypatch.setattr(mu, "eager_mask", dense)
    for padding in ("left", "right"):
        ids, mask = _batch(padding)
        _loss_and_grads(on_attend, ids, mask)
        on_attend.eval().generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    m = hf.create_mask(batch_size=3, q_length=1, kv_length=20, q_offset=19, kv_offset=0,
                       mask_function=mu.sliding_window_causal_mask_function(WINDOW),
                       attention_mask=torch.ones(3, 20, dtype=torch.bool))
    assert isinstance(m, hf.PaddingMask) and (m.keys, m.q_start, m.left, m.right) == (None, 19, WINDOW - 1, 0)


def test_set_attn_implementation_switches_a_model_to_attend(monkeypatch):
    eager = AutoModelForCausalLM.from_config(_llama(), attn_implementation="eager").eval()
    ids, mask = _batch("left")
    with torch.no_grad():
        before = eager(ids, attention_mask=mask).logits
    eager.set_attn_implementation("attend")
    calls = _calls(monkeypatch)
    with torch.no_grad():
        after = eager(ids, attention_mask=mask).logits
    assert len(calls) == 2 and eager.config._attn_implementation == "attend"
    real = mask.bool()
    assert (after[real] - before[real]).abs().max() < 1e-4


def test_static_cache_generation(monkeypatch):
    """A static cache hands attention all its slots: the unused ones are masked
    and the queries sit at the cache position, not at the end of the keys."""
    on_attend, eager, _ = _models(_llama())
    ids, mask = _batch("left")
    kw = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0,
              cache_implementation="static")
    assert torch.equal(on_attend.generate(ids, **kw), eager.generate(ids, **kw))


def test_dropout_in_training_mode():
    """attention_dropout runs in train mode (seeded by torch's generator) and not in eval."""
    on_attend, _, _ = _models(_llama(attention_dropout=0.5))
    ids, mask = _batch("right")
    on_attend.train()
    logits = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        logits.append(on_attend(ids, attention_mask=mask).logits.detach())
    on_attend.eval()
    with torch.no_grad():
        plain = on_attend(ids, attention_mask=mask).logits
    assert torch.equal(logits[0], logits[1]), "the same seed must give the same dropout mask"
    assert not torch.equal(logits[0], logits[2]), "another seed must give another dropout mask"
    assert (logits[0] - plain).abs().max() > 1e-3, "train mode must apply attention dropout"


def test_custom_mask_function_falls_back_with_a_warning(caplog):
    """A mask function attend cannot read (here an or-overlay, as vision-language
    models add for image tokens) gives transformers' own dense mask, with a
    warning saying so."""
    import transformers.masking_utils as mu
    hf._warned.clear()

    def prefix(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx < 3  # every token also sees the first three (a prefix-LM overlay)

    overlay = mu.or_masks(mu.causal_mask_function, prefix)
    padding = torch.ones(2, 10, dtype=torch.bool)
    padding[1, 7:] = False
    # transformers 5.0 passes the query positions as cache_position, later ones q_length and q_offset.
    where = (dict(q_length=10, q_offset=0) if "q_length" in inspect.signature(mu.sdpa_mask).parameters
             else dict(cache_position=torch.arange(10)))
    with caplog.at_level(logging.WARNING, logger=hf.__name__):
        got = hf.create_mask(batch_size=2, kv_length=10, mask_function=overlay, attention_mask=padding, **where)
    want = mu.sdpa_mask(batch_size=2, kv_length=10, mask_function=overlay, attention_mask=padding,
                        allow_is_causal_skip=False, **where)
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    assert any("falling back to a dense" in r.getMessage() for r in caplog.records)


def test_dense_4d_mask_from_the_caller(caplog):
    """A 4-D mask handed to the model runs on attend as an additive bias, with a
    warning, and matches eager attention under the same mask."""
    on_attend, eager, _ = _models(_llama())
    ids, mask = _batch("right")
    hf._warned.clear()
    S = ids.shape[1]
    keep = torch.ones(S, S, dtype=torch.bool).tril() | (torch.arange(S) < 3)  # causal plus a 3-token prefix
    keep = keep & mask.bool()[:, None, None, :]
    bias = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with caplog.at_level(logging.WARNING, logger=hf.__name__), torch.no_grad():
        got = on_attend(ids, attention_mask=bias).logits
        ref = eager(ids, attention_mask=bias).logits
        as_bool = on_attend(ids, attention_mask=keep).logits  # a boolean 4-D mask: True takes part
    assert any("dense 4-D attention mask" in r.getMessage() for r in caplog.records)
    real = mask.bool()
    assert (got[real] - ref[real]).abs().max() < 1e-4
    assert (as_bool[real] - got[real]).abs().max() < 1e-5


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("model", ["llama", "gemma2"])
def test_bidirectional_padded_logits(model, padding, monkeypatch):
    """Encoder-style (non-causal) attention over padded batches: every query row
    sees its sequence's real keys (Gemma-2's sliding layers: those within a
    two-sided window)."""
    cfg = _config(model)
    cfg.is_causal = False  # the create_*_mask functions then build bidirectional masks
    ids, mask = _batch(padding)
    calls = _calls(monkeypatch)
    got, ref, pt = _logits(_models(cfg), ids, mask)
    if not any(isinstance(m, hf.PaddingMask) and m.right != 0 for m in calls):
        pytest.skip(f"transformers {transformers.__version__} builds causal masks for this {model} config")
    real = mask.bool()
    check_close(f"bidirectional {model} logits ({padding} padding)", got[real], ref[real], pt[real], c=3.0)


def test_padding_with_holes_falls_back_with_a_warning(caplog):
    """A 2-D mask with a hole inside a sequence has no varlen form: a dense mask,
    a warning, and the same logits as eager."""
    models = _models(_llama(sliding_window=WINDOW))
    ids, mask = _batch("right")
    mask[0, 4:6] = 0  # two masked tokens inside the first sequence
    hf._warned.clear()
    with caplog.at_level(logging.WARNING, logger=hf.__name__):
        got, ref, pt = _logits(models, ids, mask)
    assert any("padding with holes" in r.getMessage() or "not one run" in r.getMessage() for r in caplog.records)
    real = mask.bool()
    check_close("logits with holes", got[real], ref[real], pt[real], c=3.0)


@pytest.mark.parametrize("model", ["llama", "mistral", "gemma2"])
def test_packed_sequences_without_padding(model, monkeypatch):
    """Padding-free training batches: three sequences packed into one row, told
    apart by position_ids that restart. The mask function hands attention their
    boundaries (no dense mask); logits and gradients as eager's."""
    cfg = _config(model)
    on_attend, eager, eager64 = _models(cfg)
    lengths = (9, 6, 11)
    ids = torch.randint(3, TINY["vocab_size"], (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    calls = _calls(monkeypatch)

    def run(m):
        m.train()
        m.zero_grad(set_to_none=True)
        out = m(ids, position_ids=pos, labels=ids, use_cache=False)  # transformers looks for packing without a cache
        out.loss.backward()
        return out.logits.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    got, grads = run(on_attend)
    assert len(calls) == cfg.num_hidden_layers and all(
        isinstance(m, hf.PaddingMask) and m.segments is not None for m in calls)
    with _float64_eager_masks():
        ref, grads_ref = run(eager64)
    pt, grads_pt = run(eager)
    check_close(f"packed {model} logits", got, ref.float(), pt, c=3.0)
    for n in grads:
        check_close(f"packed {model} grad {n}", grads[n], grads_ref[n].float(), grads_pt[n], c=4.0)


def test_cu_seq_lens_kwargs_split_a_flattened_batch():
    """FlashAttention's padding-free kwargs: each sequence attends on its own, as
    if run alone."""
    lengths = (9, 6, 11)
    q, k, v = (torch.randn(1, 4, sum(lengths), 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA
    cu = torch.tensor([0, 9, 15, 26], dtype=torch.int32)
    module = torch.nn.Module()
    got, _ = hf.attention_forward(module, q, k, v, None, sliding_window=4, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                  max_length_q=11, max_length_k=11)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        alone, _ = hf.attention_forward(module, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None, sliding_window=4)
        assert torch.allclose(got[:, a:b], alone, atol=1e-6), (a, b)
    with pytest.raises(attend.InvalidArgumentError, match="cu_seq_lens_k"):
        hf.attention_forward(module, q, k, v, None, cu_seq_lens_q=cu)


def test_readme_example_runs_as_written(monkeypatch, capsys):
    """README's transformers example, executed verbatim: it generates 20 tokens
    with every attention call on attend."""
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text()
    section = text[text.index("### Hugging Face transformers"):]
    block = section[section.index("```python\n") + len("```python\n"):]
    block = block[:block.index("```")]
    assert len(block.strip().splitlines()) == 5, block
    calls = _calls(monkeypatch)
    exec(compile(block, str(readme), "exec"), {})
    assert "tensor([[" in capsys.readouterr().out
    assert len(calls) == 4 * 20  # 4 layers: a prefill and 19 single-token steps


def test_a_transformers_outside_the_tested_range_is_warned_about(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger=hf.__name__):
        monkeypatch.setattr(transformers, "__version__", "5.99.0")
        hf._check_version()
        assert not caplog.records
        monkeypatch.setattr(transformers, "__version__", "4.57.1")
        hf._check_version()
    assert "4.57.1 is outside the tested range >=5,<6" in caplog.records[-1].getMessage()


def test_position_bias_is_refused():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(attend.UnsupportedError, match="position_bias"):
        hf.attention_forward(torch.nn.Module(), q, q, q, None, position_bias=torch.zeros(1, 2, 4, 4))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_name_the_device():
    q = torch.randn(1, 2, 4, 8, device="cuda")
    with pytest.raises(attend.AttendError, match="device"):
        hf.attention_forward(torch.nn.Module(), q, q, q, None)
