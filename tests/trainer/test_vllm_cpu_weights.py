"""`gtpo.trainer.vllm_cpu`: on vLLM's CPU platform a colocated engine keeps its linear layers unpacked, so that TRL's
per-parameter weight sync writes where the engine reads (the real engine: tests/trainer/test_vllm_training.py, in
`make test-vllm`). Here vLLM is a stand-in module with vLLM's names, so the decision and the replacement dispatch are
checked in `make test` too: which configs get it, that a 2-D weight stays the layer's loadable Parameter and is used
as is by the plain linear, that other weights go to vLLM's own dispatch, and that it is installed once."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from gtpo.trainer import vllm_cpu


@pytest.fixture
def fake_vllm(monkeypatch):
    """A `vllm` package with a CPU (or, with `.set_cpu(False)`, a GPU) platform and vLLM's packing dispatch."""
    calls = []

    def packing_dispatch(layer, remove_weight):  # what vLLM does: pack the weight away and empty the Parameter
        calls.append(layer)
        layer.cpu_linear = "packed"
        if remove_weight:
            layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    platform = types.SimpleNamespace(cpu=True)
    platform.is_cpu = lambda: platform.cpu
    utils = types.ModuleType("vllm.model_executor.layers.utils")
    utils.dispatch_cpu_unquantized_gemm = packing_dispatch
    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.platforms": types.ModuleType("vllm.platforms"),
        "vllm.model_executor": types.ModuleType("vllm.model_executor"),
        "vllm.model_executor.layers": types.ModuleType("vllm.model_executor.layers"),
        "vllm.model_executor.layers.utils": utils,
    }
    modules["vllm.platforms"].current_platform = platform
    modules["vllm.model_executor.layers"].utils = utils
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return types.SimpleNamespace(utils=utils, platform=platform, calls=calls)


def _args(**overrides):
    return types.SimpleNamespace(**{"use_vllm": True, "vllm_mode": "colocate", **overrides})


def test_only_a_colocated_engine_on_the_cpu_platform_is_changed(fake_vllm):
    assert not vllm_cpu.keep_engine_weights_loadable(_args(use_vllm=False))
    assert not vllm_cpu.keep_engine_weights_loadable(_args(vllm_mode="server"))  # the server loads its own weights
    fake_vllm.platform.cpu = False
    assert not vllm_cpu.keep_engine_weights_loadable(_args())  # a GPU: TRL's sync works as it is
    assert fake_vllm.utils.dispatch_cpu_unquantized_gemm.__name__ == "packing_dispatch"


def test_a_linear_weight_stays_loadable_and_is_read_at_each_call(fake_vllm):
    assert vllm_cpu.keep_engine_weights_loadable(_args())
    dispatch = fake_vllm.utils.dispatch_cpu_unquantized_gemm
    layer = torch.nn.Linear(3, 2)
    weight = layer.weight
    weight.weight_loader = "vLLM's loader"
    dispatch(layer, remove_weight=True)
    assert layer.weight is weight and layer.weight.weight_loader == "vLLM's loader" and not fake_vllm.calls
    x = torch.randn(4, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.ones(2, 3))  # what TRL's sync does: write into the Parameter's storage
    expected = x @ torch.ones(3, 2) + layer.bias
    assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), expected)
    # Anything that is not a 2-D weight (a conv or MoE weight) is left to vLLM's own dispatch.
    conv = types.SimpleNamespace(weight=torch.zeros(2, 1, 3))
    dispatch(conv, remove_weight=True)
    assert fake_vllm.calls == [conv]
    # Installed once: a second trainer does not wrap the replacement again.
    assert vllm_cpu.keep_engine_weights_loadable(_args())
    assert fake_vllm.utils.dispatch_cpu_unquantized_gemm is dispatch
