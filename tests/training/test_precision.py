"""Precision on CUDA is the run's decision (run-config ``cuda-tf32``), not PyTorch's default.

PyTorch enables TF32 for cuDNN convolutions by default and disables it for matmuls; both apps
set both flags from the run config before building a model, so a run's summary.json (which
records the validated config) says which arithmetic it trained with.
"""

from __future__ import annotations

import pytest
import torch

from fl_app.config import ConfigError
from fl_app.registry import validate_config
from tasks.models import set_cuda_precision


@pytest.fixture
def restore_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_default_is_full_fp32_and_both_flags_follow_the_key(restore_flags):
    cfg = validate_config({})
    assert cfg["cuda-tf32"] is False
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's own default for convolutions
    set_cuda_precision(cfg["cuda-tf32"])
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    set_cuda_precision(validate_config({"cuda-tf32": True})["cuda-tf32"])
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)


def test_a_non_boolean_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="cuda-tf32"):
        validate_config({"cuda-tf32": "yes"})


def test_the_client_app_applies_the_run_s_choice(restore_flags):
    """client_fn sets both flags from the run config before the method's client builds its
    model, whatever they were (PyTorch's defaults, or an earlier run in the same actor)."""
    from flwr.app import Context, RecordDict

    from fl_app.client_app import client_fn

    def context(run_config):
        return Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 2},
                       state=RecordDict(), run_config={"dataset": "synthetic", "model": "logreg", **run_config})

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    client_fn(context({}))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    client_fn(context({"cuda-tf32": True}))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
