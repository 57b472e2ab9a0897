"""JSON Schema (draft 2020-12) of the audit's report, `--json FILE`.

`schema_version` changes when a field is renamed, removed or changes meaning;
adding a field does not (objects allow more properties). docs/tools.md
documents the fields; tests/test_audit.py validates reports against this.
"""

from __future__ import annotations

from torch_neuronx.audit.report import REPORT_SCHEMA_VERSION

_NUM = {"type": "number"}
_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NULLABLE_STR = {"type": ["string", "null"]}
_RANGE = {"type": "array", "items": _NUM, "minItems": 2, "maxItems": 2}
_NUM_OR_RANGE = {"anyOf": [_NUM, _RANGE, {"type": "null"}]}


def _object(required: dict, optional: dict | None = None) -> dict:
    return {"type": "object", "required": sorted(required),
            "properties": {**required, **(optional or {})}}


def _array(items: dict) -> dict:
    return {"type": "array", "items": items}


SITE = {"anyOf": [{"type": "null"}, _object(
    {"file": _STR, "line": _INT, "function": _STR, "backward": _BOOL, "code": _STR},
    {"calls": _INT, "steps": _INT, "in_step_loop": _BOOL, "phases": _array(_STR),
     "library": _object({"file": _STR, "line": _INT, "function": _STR, "code": _STR})})]}

FUSION_CUT = _object({"reason": _STR, "op": _NULLABLE_STR, "site": SITE, "per_step": _NUM})

ACTION = _object({"rank": _INT, "kind": {"enum": ["fallback", "shape_churn", "host_sync", "float64",
                                                  "data_dependent_shape", "fp8", "dynamic_shape",
                                                  "graph_break", "memory", "fusion"]},
                  "what": _STR, "where": _STR, "cost_per_step_s": {"type": ["number", "null"]},
                  "remedy": _STR})

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torch-neuronx audit report",
    **_object({
        "schema_version": {"const": REPORT_SCHEMA_VERSION},
        "tool": _object({"name": _STR, "version": _STR}),
        "command": _array(_STR),
        "exit_code": {"type": "integer"},
        "status": {"enum": ["completed", "failed", "interrupted"]},
        "exception": _NULLABLE_STR,
        "wall_s": _NUM,
        "emulated_instance": _STR,
        "steps": _object({"count": _INT, "source": _STR, "note": _STR}),
        "ranks": {**_array(_object({
            "rank": _INT, "pid": _INT, "steps": _INT, "calls": _INT, "signatures": _INT,
            "fallback_calls": _INT, "peak_memory_bytes": _INT, "duration_s": _NUM,
            "exception": _NULLABLE_STR, "interrupted": _BOOL})), "minItems": 1},
        "ops": _array(_object({"op": _STR, "path": {"enum": ["native", "fallback", "direct"]},
                               "calls": _INT, "calls_per_step": _NUM, "host_s": _NUM,
                               "host_s_per_step": _NUM, "signatures": _INT, "share_of_step": _NUM})),
        "fallbacks": _array(_object({"op": _STR, "calls": _INT, "calls_per_step": _NUM,
                                     "host_s_per_step": _NUM, "trainium_s_per_step": _NUM,
                                     "share_of_step": _NUM, "sites": _array(SITE)})),
        "eager_compilations": _object({
            "total_signatures": _INT, "first_step": _INT, "new_per_step": _array(_INT),
            "after_last_step": _INT, "in_phases": {"type": "object", "additionalProperties": _INT},
            "churn": _array(_object({"op": _STR, "site": SITE, "new_signatures": _INT,
                                     "steps_with_new": _INT, "example_shapes": _array(_array(_array(_INT)))}))}),
        "fusion": _object({
            "enabled": _BOOL, "launches_per_step_unfused": _NUM, "launches_per_step_fused": _NUM,
            "ops_per_fused_launch": _NUM, "sequences_per_step": _NUM, "kernels": _INT, "kernels_in_steps": _INT,
            "kernels_new_after_step_1": _INT,
            "sequences": _array(_object({"ops": _array(_STR), "length": _INT, "launches_per_step": _NUM,
                                         "ended_by": _array(FUSION_CUT)})),
            "cuts": _array(FUSION_CUT)}),
        "torch_compile": _object({
            "used": _BOOL, "graphs": _INT, "compiles": _INT, "compile_seconds": _NUM, "graph_runs": _INT,
            "graph_breaks": _array(_object({"reason": _STR, "site": SITE, "count": _INT})),
            "recompiles": _INT, "recompile_reasons": _array(_STR),
            "unlowered": _array(_object({"op": _STR, "source": _STR, "graph": _STR, "count": _INT}))}),
        "memory": _object({
            "peak_bytes_per_core": _INT, "core": _INT,
            "timeline": _array(_object({"step": _INT, "peak_bytes": _INT, "allocated_bytes": _INT})),
            "targets": _array(_object({"instance": _STR, "hbm_per_core_bytes": _INT, "fits": _BOOL,
                                       "cores_needed": _INT, "cores_available": _INT,
                                       "fits_sharded": _BOOL})),
            "largest_allocations": _array(_object({"op": _STR, "bytes": _INT,
                                                   "shapes": _array(_array(_INT)), "site": SITE}))}),
        "hazards": _array(_object({"kind": _STR, "op": _STR, "detail": _STR, "calls": _INT,
                                   "calls_per_step": _NUM, "in_step_loop": _BOOL, "sites": _array(SITE)},
                                  {"phases": _array(_STR)})),
        "collectives": _array(_object({"op": _STR, "bytes": _INT, "world_size": _INT,
                                       "calls_per_step": _NUM, "calls": _INT})),
        "estimates": {**_array(_object({
            "instance": _STR, "low_s": _NUM, "high_s": _NUM, "label": {"const": "estimate"},
            "by_class": {"type": "object", "additionalProperties": _RANGE},
            "assumptions": {**_array({**_STR, "minLength": 1}), "minItems": 1},
            "not_runnable": _array(_STR)})), "minItems": 1},
        "cost": _object({
            "unit": _STR, "units_per_step": _NUM, "units_source": _STR,
            "rows": _array(_object({"name": _STR, "usd_per_hour": {"type": ["number", "null"]},
                                    "seconds_per_unit": _NUM_OR_RANGE, "units_per_dollar": _NUM_OR_RANGE,
                                    "usd_per_million_units": _NUM_OR_RANGE,
                                    "work_per_dollar_vs_baseline": _NUM_OR_RANGE,
                                    "price_source": _NULLABLE_STR}))}),
        "phases": _array(_object({
            "name": _STR, "label": _STR, "source": _STR, "occurrences": _INT, "before_first_step": _INT,
            "between_steps": _INT, "after_last_step": _INT, "wall_s": _NUM, "calls": _INT, "host_s": _NUM,
            "graph_runs": _INT, "new_kernels": _INT, "peak_bytes": _INT,
            "ops": _array(_object({"op": _STR, "path": _STR, "calls": _INT, "calls_per_occurrence": _NUM,
                                   "host_s": _NUM, "host_s_per_occurrence": _NUM, "signatures": _INT,
                                   "share_of_phase": _NUM})),
            "fallbacks": _array(_STR), "unit": _NULLABLE_STR,
            "units_per_occurrence": {"type": ["number", "null"]},
            "estimates": _array(_object({"instance": _STR, "low_s": _NUM, "high_s": _NUM,
                                         "label": {"const": "estimate"}})),
            "cost": _array(_object({"name": _STR, "seconds_per_unit": _NUM_OR_RANGE}))})),
        "verdict": _object({"status": {"enum": ["ready", "ready_after_fixes", "blocked"]},
                            "reasons": _array(_STR), "actions": _array(ACTION)}),
    }),
}


def validate(report: dict) -> None:
    """Raises jsonschema.ValidationError when `report` does not follow SCHEMA
    (needs the `audit` extra: pip install 'torch-neuronx[audit]')."""
    import jsonschema

    jsonschema.validate(report, SCHEMA)
