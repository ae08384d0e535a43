"""The selection policy and verdict tables, mirroring the environment variables.

    ATTEND_BACKEND=name   ->  set_policy(force="name")
    ATTEND_DISABLE=a,b    ->  set_policy(disable=["a", "b"])
    ATTEND_LOG=info|debug ->  set_policy(log="info")
    ATTEND_SELECT=autotune  ->  set_policy(select="autotune")
    ATTEND_TUNE_CACHE=path  ->  set_policy(select="autotune", tune_cache="path")  ("off": memory only)

The process starts from the environment; set_policy replaces the whole
process-wide policy (and clears the selection cache); reset_policy() goes back
to the environment. ``with policy(...)`` sets a policy for the current thread
only, for the block (see policy()).
"""

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _C
from .errors import AttendError, InvalidArgumentError


def set_policy(force: Optional[str] = None, disable: Union[str, Sequence[str]] = (), log: str = "off",
               select: str = "priority", tune_cache: Optional[str] = None) -> None:
    """Replaces the process-wide policy; every value is checked now (an unknown
    backend name, log level or strategy raises InvalidArgumentError naming the
    keyword). ``select``: "priority" (registered priorities, no measurement) or
    "autotune" (the first problem of each tuning bucket times every viable plan
    and keeps the fastest; docs/autotune.md). ``tune_cache``: autotune's result
    file, "off" for memory only, None for the default
    ($XDG_CACHE_HOME/attend/autotune.json). Backward always runs on the plan
    its forward chose, whatever the policy says by then."""
    if isinstance(disable, str):
        disable = [d.strip() for d in disable.split(",") if d.strip()]
    _C.set_policy(force, list(disable), log, select, tune_cache or "")


def get_policy() -> Dict[str, Any]:
    """The policy in force on this thread (its innermost ``with policy(...)``
    block's, else the process-wide one): {'force': str|None, 'disable': [str], 'log': 'off'|'info'|'debug',
    'select': 'priority'|'autotune', 'tune_cache': str ('' = the default file)}."""
    return _C.get_policy()


def _restore(p):
    _C.set_policy(p["force"], p["disable"], p["log"], p["select"], p["tune_cache"])


def reset_policy() -> None:
    """Back to the policy the environment describes."""
    _restore(_C.policy_from_env())


@contextlib.contextmanager
def policy(force: Optional[str] = None, disable: Union[str, Sequence[str]] = (), log: str = "off",
           select: str = "priority", tune_cache: Optional[str] = None) -> Iterator[None]:
    """Sets the whole policy for the block, on the current thread only
    (keywords as set_policy, checked on entry):
    ``with attend.policy(force="reference"): ...`` or
    ``with attend.policy(select="autotune", tune_cache="/tmp/tune.json"): ...``.

    Other threads keep the policy they had, as torch.no_grad() is per thread:
    blocks that overlap in several threads cannot restore each other's policy
    (a save/set/restore of the process-wide policy leaves the last block to
    exit restoring what another block set). Blocks nest; leaving one, by an
    exception too, removes its own policy and nothing else (the innermost
    block still open wins; none open: the process-wide one). set_policy()
    inside a block changes the process-wide policy, which the thread sees
    again once its blocks have exited. Threads started inside a block get the
    process-wide policy, not the block's; asyncio tasks on one thread share
    that thread's blocks."""
    if isinstance(disable, str):
        disable = [d.strip() for d in disable.split(",") if d.strip()]
    token = _C.push_thread_policy(force, list(disable), log, select, tune_cache or "")
    try:
        yield
    finally:
        _C.pop_thread_policy(token)


def backends() -> List[str]:
    """Registered backend names, in priority order."""
    return _C.backends()


class Explanation:
    """The verdict of every backend for one problem and mode.

    ``str(e)`` / ``e.table`` is the table the CLI prints; ``e.data`` the same as a
    dict (``problem``, ``mode``, ``selected``, ``backends``: per backend its
    ``forward``/``backward`` support with ``reasons`` and ``notes`` — how a supported
    pass will run, e.g. bf16 widened to f32 —, ``viable``, ``chosen``);
    ``e.selected`` the chosen backend's name, or None when nothing fits.
    """

    def __init__(self, table, json_text):
        self.table = table
        self.data = json.loads(json_text)

    @property
    def selected(self):
        return self.data["selected"]

    @property
    def mode(self):
        return self.data["mode"]

    @property
    def selected_variant(self):
        """The chosen variant of the selected backend (e.g. flash's "avx2"), or None."""
        return self.data.get("selected_variant")

    @property
    def strategy(self):
        """How the choice was made: "priority" or "autotune"."""
        return self.data.get("strategy", "priority")

    @property
    def tuning(self):
        """Autotune: where the times came from ("measured now on ...", "from the
        cache file ...") or why there are none; None under priority."""
        return self.data.get("tuning")

    @property
    def seconds(self):
        """Autotune's measured median seconds per (backend, variant) plan that
        was timed (training: forward + backward); empty when nothing was timed."""
        return {(b["name"], b["variant"]): b["seconds"] for b in self.data["backends"]
                if b.get("seconds") is not None}

    @property
    def deferred(self):
        """Per backend name, why it defers on this problem (a speed preference
        the priority strategy ranks after the others), for those that do."""
        return {name: v["deferred"] for name, v in self.verdicts.items() if v.get("deferred")}

    @property
    def verdicts(self):
        """Per backend name, the verdict of its chosen variant, else of its first
        variant this process may use (``variant_verdicts`` has every row)."""
        out = {}
        for b in self.data["backends"]:
            cur = out.get(b["name"])
            if cur is None or (not cur["chosen"] and (b["chosen"] or (cur["variant_excluded"] and not b["variant_excluded"]))):
                out[b["name"]] = b
        return out

    @property
    def variant_verdicts(self):
        """Every (backend, variant) row: {(name, variant): verdict}."""
        return {(b["name"], b["variant"]): b for b in self.data["backends"]}

    def reasons(self, backend):
        """Every reason `backend` gave, as (pass, code, message) tuples."""
        v = self.verdicts[backend]
        out = []
        for p in ("forward", "backward"):
            if v[p] is not None:
                out += [(p, r["code"], r["message"]) for r in v[p]["reasons"]]
        return out

    def __str__(self):
        return self.table

    def __repr__(self):
        return f"<attend.Explanation selected={self.selected!r} mode={self.mode!r}>"


def _target_text(target: Any) -> str:
    """explain()'s target as the text ATTEND_CUDNN_TARGET takes, else an attend error naming it (os.environ
    would raise a TypeError for a number and a ValueError for a NUL, naming neither the argument nor attend)."""
    why = None
    try:
        text = os.fsdecode(target)
    except TypeError:
        text = None
        why = f"expected a str or a path, got {type(target).__name__}"
    if text is not None and ("\0" in text or not text):
        why = "contains a NUL character" if text else "is empty"
    if why is None:
        return text
    value = repr(target)
    detail = why + ': a GPU ("a100", "h100", "h200", "b200"), a descriptor file (path.json) or "sm_XY"'
    raise InvalidArgumentError(f"attend [invalid_argument] target={value}: {detail}", "target", value, "", detail)


def explain(mode: str = "training", device: str = "cpu", target: Optional[str] = None, **spec: Any) -> "Explanation":
    """Verdict table for a problem described by attend::AttentionSpec fields, e.g.
    ``attend.explain(batch=2, seqlen_q=1024, seqlen_kv=1024, heads_q=16, heads_kv=16,
    head_dim_qk=192, head_dim_v=128, causal=True, mode="training")``.
    ``device="cuda"`` asks the GPU backends; ``target`` ("a100", "h100", "h200",
    "b200", a descriptor file, or "sm_90") is the GPU the cudnn backend answers
    for where this machine has none (sets ATTEND_CUDNN_TARGET for the process): a
    named GPU adds cuDNN's own deviceless verdict on each pass's graph.
    Never raises for "nothing fits" (``selected`` is then None)."""
    if target is None:
        table, js = _C.evaluate(spec, mode, device)
        return Explanation(table, js)
    target = _target_text(target)
    before = os.environ.get("ATTEND_CUDNN_TARGET")
    os.environ["ATTEND_CUDNN_TARGET"] = target
    try:
        table, js = _C.evaluate(spec, mode, device)
    except AttendError as e:
        # A refused target must not stay behind for every later selection.
        if before is None:
            del os.environ["ATTEND_CUDNN_TARGET"]
        else:
            os.environ["ATTEND_CUDNN_TARGET"] = before
        if e.field != "ATTEND_CUDNN_TARGET":
            raise
        raise type(e)(str(e).replace("ATTEND_CUDNN_TARGET", "target", 1), "target", e.value, e.limit,
                      e.detail) from None
    return Explanation(table, js)
