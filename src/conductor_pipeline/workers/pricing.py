"""List prices of workers: dollars per prompt token and per completion token.

One rule, used wherever a cost is computed from token counts outside a live call (the
training reward's list cost, evaluation's price for a reply served from the response
cache): a worker's configured ``input_cost_per_token``/``output_cost_per_token`` win;
without them LiteLLM's model price map is asked; a model it does not know has no price
(``None``; so is a $0 entry). The pool prices a live call the same way (configured prices first, else
LiteLLM's ``completion_cost`` of the response).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["TokenPrices", "pool_token_prices", "token_prices"]

# (dollars per prompt token, dollars per completion token)
TokenPrices = tuple[float, float]


def token_prices(spec: Any) -> TokenPrices | None:
    """The list prices of one worker (a ``WorkerSpec`` or anything with its price fields).

    ``None`` when neither the configuration nor LiteLLM's map prices the worker's model.
    Offline, LiteLLM reads its bundled map when ``LITELLM_LOCAL_MODEL_COST_MAP=True``.
    """
    if getattr(spec, "has_prices", False):
        return (float(spec.input_cost_per_token), float(spec.output_cost_per_token))
    model = getattr(spec, "model", None)
    if not model:
        return None
    return _litellm_token_prices(model)


def pool_token_prices(pool: Any) -> list[TokenPrices | None]:
    """:func:`token_prices` of each worker of ``pool`` (its ``specs``, in worker order)."""
    specs: Iterable[Any] = getattr(pool, "specs", None) or []
    return [token_prices(spec) for spec in specs]


def _litellm_token_prices(model: str) -> TokenPrices | None:
    import litellm

    try:
        info = litellm.get_model_info(model)
    except Exception:  # unmapped model: LiteLLM raises rather than returning nothing
        return None
    prompt, completion = info.get("input_cost_per_token"), info.get("output_cost_per_token")
    if prompt is None or completion is None:
        return None
    # A Router registers its deployments in the map at $0; like the pool (which counts a
    # $0 LiteLLM price as unknown), a zero price is no price.
    if not (float(prompt) or float(completion)):
        return None
    return (float(prompt), float(completion))
