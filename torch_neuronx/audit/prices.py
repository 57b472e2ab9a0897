"""Hourly prices and the cost of finished work (``--price``, ``--baseline``).

Hourly prices change and differ by region: the user's ``--price INSTANCE=USD_PER_HOUR`` wins
over this table, and every default carries its source and the date it was read.

Instances left out of DEFAULT_PRICES (searched 2026-12-02 in the stored public pages and docs,
no published on-demand price found): trn1.2xlarge, trn2.3xlarge, trn2.48xlarge, trn3.3xlarge,
trn3.48xlarge. Their rows have no cost until the user passes --price; no price is made up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# On-demand USD per instance-hour. One entry per instance of torch_neuronx.neuron.profiles.PROFILES
# for which a published figure was found.
DEFAULT_PRICES: dict[str, dict] = {
    "trn1.32xlarge": {
        "usd_per_hour": 21.50,
        "source": "usage.ai, \"AWS Trainium vs GPU Instances: What Actually Costs Less for AI "
                  "Training\" (updated 2026-06-25), "
                  "https://www.usage.ai/blogs/aws/ai-ml-cost/trainium-vs-gpu-instances/ "
                  "(third-party article quoting the on-demand rate; region not stated)",
        "read": "2026-12-02",
    },
}

PRICE_FORM = "INSTANCE=USD_PER_HOUR with your own hourly price, for example --price trn2.48xlarge=30.0"
BASELINE_FORM = ("NAME:SECONDS_PER_STEP:USD_PER_HOUR with your measured step time and price, for example "
                 "--baseline p4d.24xlarge:0.85:32.77")


def _positive(text: str, what: str, given: str, form: str) -> float:
    """A finite number > 0, or a ValueError that says what was wrong and the expected form."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{given!r}: {what} {text.strip()!r} is not a number; expected {form}.") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{given!r}: {what} must be a number greater than 0, got {text.strip()!r}; "
                         f"expected {form}.")
    return value


def parse_price(text: str) -> tuple[str, float]:
    """``--price INSTANCE=USD_PER_HOUR`` -> (instance, usd_per_hour)."""
    instance, sep, usd = text.partition("=")
    if not sep:
        raise ValueError(f"--price {text!r} has no '=': expected {PRICE_FORM}.")
    instance = instance.strip()
    if not instance:
        raise ValueError(f"--price {text!r} names no instance before '=': expected {PRICE_FORM}.")
    if not usd.strip():
        raise ValueError(f"--price {text!r} has no price after '=': expected {PRICE_FORM}.")
    return instance, _positive(usd, "the price", f"--price {text}", PRICE_FORM)


def parse_baseline(text: str) -> dict:
    """``--baseline NAME:SECONDS_PER_STEP:USD_PER_HOUR`` -> {name, seconds_per_step, usd_per_hour}.

    The last two ':' separate the numbers, so the name itself may contain ':'.
    """
    parts = text.rsplit(":", 2)
    if len(parts) != 3:
        raise ValueError(f"--baseline {text!r} needs three parts separated by ':', got {len(parts)}; "
                         f"expected {BASELINE_FORM}.")
    name, seconds, usd = (part.strip() for part in parts)
    if not name:
        raise ValueError(f"--baseline {text!r} has an empty name; expected {BASELINE_FORM}.")
    given = f"--baseline {text}"
    return {
        "name": name,
        "seconds_per_step": _positive(seconds, "SECONDS_PER_STEP", given, BASELINE_FORM),
        "usd_per_hour": _positive(usd, "USD_PER_HOUR", given, BASELINE_FORM),
    }


def _price_of(prices: Mapping, name: str) -> tuple[float | None, str | None]:
    """(usd_per_hour, source) from a table of floats or of DEFAULT_PRICES-style entries."""
    entry = prices.get(name)
    if isinstance(entry, Mapping):
        return float(entry["usd_per_hour"]), f"{entry.get('source', '?')} (read {entry.get('read', '?')})"
    return (float(entry), "--price") if entry is not None else (None, None)


def _per_unit(seconds_per_step: float, usd_per_hour: float | None, units_per_step: float):
    """(seconds_per_unit, units_per_dollar, usd_per_million_units); the last two None without price."""
    seconds_per_unit = seconds_per_step / units_per_step
    if usd_per_hour is None:
        return seconds_per_unit, None, None
    units_per_dollar = 3600.0 / (seconds_per_unit * usd_per_hour)
    return seconds_per_unit, units_per_dollar, 1e6 / units_per_dollar


def cost_table(estimates, prices: Mapping, units_per_step: float, unit: str, baseline: dict | None = None
               ) -> list[dict]:
    """One row per target (the baseline's row first): time and cost of a unit of finished work.

    ``estimates``: estimate_step results (a list, or a mapping whose values are results).
    ``prices``: instance -> USD per hour, as a float or a DEFAULT_PRICES-style entry.
    ``baseline``: parse_baseline's dict, or None.

    Convention: a target's ranged fields are ``[best, worst]`` pairs. best comes from the
    estimate's low (optimistic) step time, worst from its high (pessimistic) one; so
    ``seconds_per_step`` is ``[low_s, high_s]`` and units_per_dollar is ``[more, fewer]``.
    The baseline row has single values. Row fields: name, kind ("baseline" | "target"), unit,
    seconds_per_step, usd_per_hour (None when unknown), price_source, seconds_per_unit,
    units_per_dollar, usd_per_million_units (None without a price), and
    work_per_dollar_vs_baseline = target units per dollar / baseline units per dollar
    (None without a baseline or a price; 1.0 on the baseline row).
    """
    if not isinstance(units_per_step, (int, float)) or not 0 < units_per_step < math.inf:
        raise ValueError(f"units_per_step must be a number greater than 0 (units of {unit!r} finished "
                         f"per step), got {units_per_step!r}.")
    rows, base_per_dollar = [], None
    if baseline is not None:
        spu, upd, upm = _per_unit(baseline["seconds_per_step"], baseline["usd_per_hour"], units_per_step)
        base_per_dollar = upd
        rows.append({"name": baseline["name"], "kind": "baseline", "unit": unit,
                     "seconds_per_step": baseline["seconds_per_step"],
                     "usd_per_hour": baseline["usd_per_hour"], "price_source": "--baseline",
                     "seconds_per_unit": spu, "units_per_dollar": upd, "usd_per_million_units": upm,
                     "work_per_dollar_vs_baseline": 1.0})
    for estimate in (estimates.values() if isinstance(estimates, Mapping) else estimates):
        rows.append(_target_row(estimate, prices, units_per_step, unit, base_per_dollar))
    return rows


def _target_row(estimate: dict, prices: Mapping, units_per_step: float, unit: str,
                base_per_dollar: float | None) -> dict:
    usd, source = _price_of(prices, estimate["instance"])
    best = _per_unit(estimate["low_s"], usd, units_per_step)
    worst = _per_unit(estimate["high_s"], usd, units_per_step)
    pair = lambda i: None if best[i] is None else [best[i], worst[i]]  # noqa: E731
    ratio = None
    if base_per_dollar is not None and usd is not None:
        ratio = [best[1] / base_per_dollar, worst[1] / base_per_dollar]
    return {"name": estimate["instance"], "kind": "target", "unit": unit,
            "seconds_per_step": [estimate["low_s"], estimate["high_s"]],
            "usd_per_hour": usd, "price_source": source,
            "seconds_per_unit": pair(0), "units_per_dollar": pair(1), "usd_per_million_units": pair(2),
            "work_per_dollar_vs_baseline": ratio}
