"""``python -m torch_neuronx``: the torch-neuronx command (torch_neuronx/cli)."""

import sys

from torch_neuronx.cli import main

sys.exit(main())
