"""Whatever posfair module a program imports first, it imports, and posfair's attention ends up registered with
transformers (the hook of posfair.calibration.backends runs once transformers' modelling code is imported; a route
module that itself imported that code registers when it is complete). Each order runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = (
    "from transformers import AttentionInterface\n"
    "from posfair.calibration.backends import ATTN_SDPA\n"
    "assert ATTN_SDPA in AttentionInterface._global_mapping, 'not registered'\n"
    "from posfair.model import calibrated_transformer\n"
    "print('ok')\n"
)

FIRST_IMPORTS = [
    "import posfair",
    "import posfair.calibration.registry",
    "from posfair.model import calibrated_transformer",
    "import posfair.calibration.attention_wiring",
    "from posfair.model import load_model",
    "import transformers.modeling_utils; import posfair",
    "from transformers import AutoModel; import posfair.model.fair_model",
]


@pytest.mark.parametrize("first", FIRST_IMPORTS)
def test_any_first_import_loads_and_registers(first):
    res = subprocess.run([sys.executable, "-c", f"{first}\n{CHECK}"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
