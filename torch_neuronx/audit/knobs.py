"""The options of libraries a user does not edit that control host reads made
inside them: the audit's remedy for such a read names the option, since "read
values once every N steps" is not something the user can do to the library's
code (recorder.user_site records the library frame that made the read).

Keyed by (package, function of the innermost library frame); checked against
transformers 5.22's Trainer and TrainingArguments.
"""

from __future__ import annotations

import os

_LOGGING = ("the Trainer reads the loss, the gradient norm and the learning rate on the host at each "
            "logging step: raise `logging_steps` in TrainingArguments (e.g. 50 or more) so that it reads "
            "them less often")
_NAN_FILTER = ("the Trainer checks each micro-batch's loss for nan/inf on the host (`logging_nan_inf_filter`, "
               "on by default): pass `logging_nan_inf_filter=False` in TrainingArguments")
_EVALUATION = ("the Trainer's evaluation reads its metrics on the host: evaluate less often with "
               "`eval_strategy` and `eval_steps` in TrainingArguments")

KNOBS: dict[tuple[str, str], str] = {
    # `if torch.isnan(loss) or torch.isinf(loss)` on every micro-batch (logging_nan_inf_filter=True).
    ("transformers", "_run_epoch"): _NAN_FILTER,
    ("transformers", "_inner_training_loop"): _NAN_FILTER,
    ("transformers", "_maybe_log_save_evaluate"): _LOGGING,
    ("transformers", "_get_learning_rate"): _LOGGING,
    ("transformers", "_get_grad_norm"): _LOGGING,
    ("transformers", "_track_num_input_tokens"): (
        "the Trainer counts the tokens seen on the host at every step (`include_num_input_tokens_seen`): "
        "set it to \"no\" in TrainingArguments"),
    # masking_utils: with position_ids and no attention_mask, every forward checks on the host
    # whether the batch packs several sequences.
    ("transformers", "find_packed_sequence_indices"): (
        "the model checks on the host, at every forward, whether a batch packs several sequences, "
        "because the batch has position_ids and no attention_mask: give the batches an attention_mask "
        "(the tokenizer's or the data collator's), or compile the model (torch.compile skips the check)"),
    # masking_utils: with an attention mask, every forward asks on the host whether it is all
    # ones (no padding), to skip building the mask.
    ("transformers", "_ignore_causal_mask_sdpa"): (
        "the model checks on the host, at every forward, whether the attention mask has any padding "
        "(to skip building the mask): compile the model (torch.compile skips the check)"),
    ("transformers", "evaluate"): _EVALUATION,
    ("transformers", "evaluation_loop"): _EVALUATION,
    ("transformers", "prediction_step"): _EVALUATION,
    # SFTTrainer.compute_loss: `(entropy_sum / num_valid).item()` and the token accuracy, each
    # micro-batch; trl 1.16 has no switch for them.
    ("trl", "compute_loss"): (
        "TRL's SFTTrainer reads its entropy and token-accuracy metrics on the host at every micro-batch, "
        "and trl 1.16 has no option that turns them off: count on these round trips, or override "
        "compute_loss in a subclass to drop the metrics"),
}


def package_of(filename: str) -> str:
    """'…/site-packages/transformers/trainer.py' -> 'transformers'; the file's name otherwise."""
    parts = os.path.normpath(filename).split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts and parts.index(marker) + 1 < len(parts):
            return parts[parts.index(marker) + 1].removesuffix(".py")
    return os.path.basename(filename)


def library_remedy(library: dict) -> str:
    """The remedy for a host read made inside a library: its option when known."""
    package = package_of(library["file"])
    known = KNOBS.get((package, library["function"]))
    where = f"{package} makes this host read in {library['function']}() ({library['file']}:{library['line']})"
    if known:
        return f"{where}, not your code: {known}"
    return (f"{where}, not your code: look for that library's option that controls how often it reads "
            "values (logging, metrics or evaluation frequency)")
