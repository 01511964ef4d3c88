"""Resource fields fed by environment variables the Dagster way: ``EnvVar`` values the UI shows by name.

Dagster fails a run whose resource has an ``EnvVar`` field naming an unset variable, so a variable
unset when the code location loads gives its field the default instead (:func:`env_or_default`).
"""

from __future__ import annotations

import os

from dagster import EnvVar


def env_or_default(name: str, default: str) -> EnvVar | str:
    """``EnvVar(name)`` for a resource field when the variable is set, else ``default``."""
    return EnvVar(name) if name in os.environ else default


def resolved_field(value: str) -> str:
    """A resource field's value; an ``EnvVar`` not resolved by a run (a resource used outside one) is
    read here, as empty when unset."""
    return (value.get_value("") or "") if isinstance(value, EnvVar) else value


def seconds_field(value: str, field: str, env: str, default: float) -> float:
    """A field holding seconds as text (an ``EnvVar`` resolves to text): a number, or ``default`` when blank."""
    raw = resolved_field(value).strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{field}={raw!r} ({env}): expected a number of seconds, e.g. {default:.0f}") from None
