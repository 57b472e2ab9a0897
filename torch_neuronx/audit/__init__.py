"""`torch-neuronx audit`: will a workload port to Trainium, what must change, and
what a finished unit of work will cost.

- recorder.py: the recording switched on in every process the audit runs
  (csrc/Recorder.h underneath), written as one record per process;
- estimate.py: the step-time model per target instance (chip rates of docs/hardware-figures.md);
- prices.py: hourly prices and the cost of finished work;
- report.py: records -> the report (JSON, schema in schema.py);
- units.py: units of work detected in the HF Trainer and generate, and the
  phases that are not training steps there (evaluate, predict, generate after
  training);
- terminal.py: the terminal summary.

Public calls for scripts: mark_step(), where no optimizer marks steps, and
phase(name), around work that is not a training step.
"""

import contextlib


def mark_step() -> None:
    """Marks the end of a step for `torch-neuronx audit` (an inference loop, a
    custom training loop without torch.optim). Does nothing when not audited;
    ignored when an optimizer's step() already marks the steps."""
    from torch_neuronx.audit import recorder

    if recorder.ACTIVE is not None:
        recorder.ACTIVE.mark_step("mark_step")


@contextlib.contextmanager
def phase(name: str):
    """Work that is not a training step (an evaluation loop between steps, saving,
    export): `with torch_neuronx.audit.phase("evaluate"): ...`. `torch-neuronx audit`
    reports it as a phase of its own, with its own op table and estimate, and
    leaves it out of every per-step figure. Work after the last step is such a
    phase without being marked. Does nothing when not audited."""
    from torch_neuronx.audit import recorder

    recording = recorder.ACTIVE
    if recording is None:
        yield
        return
    with recording.phase(name):
        yield
