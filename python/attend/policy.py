"""The selection policy and verdict tables, mirroring the environment variables.

    ATTEND_BACKEND=name   ->  set_policy(force="name")
    ATTEND_DISABLE=a,b    ->  set_policy(disable=["a", "b"])
    ATTEND_LOG=info|debug ->  set_policy(log="info")

The process starts from the environment; set_policy replaces the whole policy
(and clears the selection cache); reset_policy() goes back to the environment.
"""

import contextlib
import json
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _C


def set_policy(force: Optional[str] = None, disable: Union[str, Sequence[str]] = (), log: str = "off") -> None:
    """Replaces the process-wide policy. Unknown backend names raise InvalidArgumentError."""
    if isinstance(disable, str):
        disable = [d.strip() for d in disable.split(",") if d.strip()]
    _C.set_policy(force, list(disable), log)


def get_policy() -> Dict[str, Any]:
    """The policy in force: {'force': str|None, 'disable': [str], 'log': 'off'|'info'|'debug'}."""
    return _C.get_policy()


def reset_policy() -> None:
    """Back to the policy the environment describes."""
    p = _C.policy_from_env()
    _C.set_policy(p["force"], p["disable"], p["log"])


@contextlib.contextmanager
def policy(force: Optional[str] = None, disable: Union[str, Sequence[str]] = (),
           log: str = "off") -> Iterator[None]:
    """Temporarily sets the policy: ``with attend.policy(force="reference"): ...``."""
    saved = get_policy()
    set_policy(force, disable, log)
    try:
        yield
    finally:
        _C.set_policy(saved["force"], saved["disable"], saved["log"])


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


def explain(mode: str = "training", **spec: Any) -> "Explanation":
    """Verdict table for a problem described by attend::AttentionSpec fields, e.g.
    ``attend.explain(batch=2, seqlen_q=1024, seqlen_kv=1024, heads_q=16, heads_kv=16,
    head_dim_qk=192, head_dim_v=128, causal=True, mode="training")``.
    Never raises for "nothing fits" (``selected`` is then None)."""
    table, js = _C.evaluate(spec, mode)
    return Explanation(table, js)
