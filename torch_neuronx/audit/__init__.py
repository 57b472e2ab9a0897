"""`torch-neuronx audit`: will a workload port to Trainium, what must change, and
what a finished unit of work will cost.

- recorder.py: the recording switched on in every process the audit runs
  (csrc/Recorder.h underneath), written as one record per process;
- estimate.py: the step-time model per target instance (REFERENCE.md §2 rates);
- prices.py: hourly prices and the cost of finished work;
- report.py: records -> the report (JSON, schema in schema.py);
- units.py: units of work detected in the HF Trainer and generate;
- terminal.py: the terminal summary.

The one public call for scripts: mark_step(), where no optimizer marks steps.
"""


def mark_step() -> None:
    """Marks the end of a step for `torch-neuronx audit` (an inference loop, a
    custom training loop without torch.optim). Does nothing when not audited;
    ignored when an optimizer's step() already marks the steps."""
    from torch_neuronx.audit import recorder

    if recorder.ACTIVE is not None:
        recorder.ACTIVE.mark_step("mark_step")
