"""The tests' own tools: the backend params (only the GPU ones carry the ``gpu`` marker, so the
NumPy backend's cases run everywhere) and ``helpers.force_path``, the one place tests force the
launch layer's choices. Its contract here is what a replacement over the tuning table must keep."""

import pytest
from backends import NUMPY_AND_GPU, backends
from helpers import LAUNCH_CHOICES, PLAIN_PATHS, force_path

from fp8_group_quant import _launch, api


def launch_choices() -> dict:
    return {name: getattr(_launch, attribute) for name, attribute in LAUNCH_CHOICES.items()}


def test_only_the_gpu_params_carry_the_gpu_marker():
    marks = {}
    for param in NUMPY_AND_GPU:
        values, param_marks = (param, ()) if isinstance(param, str) else param[:2]
        name = values if isinstance(values, str) else values[0]
        marks[name] = {mark.name for mark in param_marks}
    assert marks == {"numpy": set(), "cupy": {"gpu"}, "torch": {"gpu"}}
    assert backends("numpy") == ["numpy"]


def test_force_path_sets_every_choice_and_restores_it():
    before, plans = launch_choices(), api._PLANS
    forced = {name: object() for name in LAUNCH_CHOICES}  # stand-ins, never launched with
    with force_path(**forced):
        assert all(launch_choices()[name] is value for name, value in forced.items())
        assert api._PLANS is not plans and len(api._PLANS) == 0  # plans made afresh
    assert launch_choices() == before and api._PLANS is plans


def test_force_path_restores_after_an_error_and_keeps_plans_only_when_told():
    before, plans = launch_choices(), api._PLANS
    with pytest.raises(KeyError), force_path(**PLAIN_PATHS["row loop"]):
        assert launch_choices()["one_pass_max_waves"] == 0
        raise KeyError("a failing test")
    assert launch_choices() == before and api._PLANS is plans
    with force_path():  # nothing forced: the library's own plans
        assert api._PLANS is plans
    with force_path(fresh_plans=True):
        assert api._PLANS is not plans
    with force_path(pdl=False, fresh_plans=False):
        assert api._PLANS is plans
    with pytest.raises(TypeError, match="force_path: unknown choices"), force_path(lanes=2):
        pass
    assert launch_choices() == before and api._PLANS is plans


def test_force_path_sizes_the_masked_grid(monkeypatch):
    sized = []

    def masked_grid(key, device):  # (handle, blocks an SM, SMs) as the launch layer's is
        sized.append(key)
        return 7, 10, 132

    monkeypatch.setattr(_launch, "_masked_grid", masked_grid)
    with force_path(masked_blocks_per_sm=1):
        assert _launch._masked_grid("key", 0) == (7, 1, 132)
    assert _launch._masked_grid("key", 0) == (7, 10, 132) and sized == ["key", "key"]
