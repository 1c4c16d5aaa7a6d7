"""Errors in the caller's words, for the JAX and PyTorch bindings.

Every message of the library (SPEC.md section 4) and of the bindings' own checks starts with the name of the argument
it is about, spelled as ``sinkattn_params_t`` spells it (``"sinks: shape must be [64], got [63]"``, ``"v: dtype must
match q's (fp32), got bf16"``; a call no backend can run: ``"no backend can run this call: cpu: q: head dim ..."``).
An API whose caller spells an argument otherwise (FlashAttention's ``learnable_sink`` / ``s_aux`` and ``k_cache``,
HF's ``query`` and ``s_aux``, jax.nn's ``query`` and ``key_value_seq_lengths``) runs its work inside
``argument_names(...)``, which maps those names back to what the caller typed: the leading name, and the tensor a
dtype must match.
"""

from __future__ import annotations

import contextlib
import functools
import re

# "sinkattn: " [+ "no backend can run this call: <backend>: "] + the argument's name, followed by ":" or " "
_LEAD = re.compile(r"^(sinkattn: (?:no backend can run this call: \w+: )?)([A-Za-z_][A-Za-z0-9_]*)(?=[: ])")
_MATCH = re.compile(r"(must match )([A-Za-z_][A-Za-z0-9_]*)('s)")


def reword(message: str, names: dict) -> str:
    """``message`` with the library's argument names replaced by the caller's (``names``: library name -> caller's)."""
    m = _LEAD.match(message)
    if m is not None and m.group(2) in names:
        message = m.group(1) + names[m.group(2)] + message[m.end():]
    return _MATCH.sub(lambda x: x.group(1) + names.get(x.group(2), x.group(2)) + x.group(3), message)


@contextlib.contextmanager
def argument_names(**names):
    """Re-raises a ValueError, TypeError or RuntimeError of the block whose message names an argument in ``names``
    (library name = the caller's name) as the same exception type with the caller's names; anything else passes
    through unchanged."""
    try:
        yield
    except (ValueError, TypeError, RuntimeError) as e:
        text = str(e)
        new = reword(text, names)
        if new == text:
            raise
        try:
            err = type(e)(new)
        except Exception:  # an exception type that cannot be rebuilt from a message: keep the original
            raise e from None
        raise err.with_traceback(e.__traceback__) from None


def with_argument_names(**names):
    """Decorator: the function's work inside ``argument_names(**names)`` (its signature and docstring kept)."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with argument_names(**names):
                return fn(*args, **kwargs)

        return wrapper

    return decorate
