"""The tests' own tools: the backend params (only the GPU ones carry the ``gpu`` marker, so the
NumPy backend's cases run everywhere) and ``helpers.force_path``, the one place tests force the
planner's choices (through the tuning table's override)."""

import pytest
from backends import NUMPY_AND_GPU, backends
from helpers import LAUNCH_CHOICES, PLAIN_PATHS, force_path, launch_choice

from fp8_group_quant import _plan, _tuning


def launch_choices() -> dict:
    return {name: launch_choice(name) for name in LAUNCH_CHOICES}


def test_only_the_gpu_params_carry_the_gpu_marker():
    marks = {}
    for param in NUMPY_AND_GPU:
        values, param_marks = (param, ()) if isinstance(param, str) else param[:2]
        name = values if isinstance(values, str) else values[0]
        marks[name] = {mark.name for mark in param_marks}
    assert marks == {"numpy": set(), "cupy": {"gpu"}, "torch": {"gpu"}}
    assert backends("numpy") == ["numpy"]


# a value of each choice the table accepts, none of them its default (pdl's is
# FP8_GROUP_QUANT_PDL's)
FORCED = {"one_pass_max_waves": 3.0, "one_pass_threads": 64, "waves": 2.0, "norm_waves": 0.5,
          "norm_lanes": 2, "norm_stash": False, "silu_six_blocks_waves": 9.0,
          "table_by_threads_waves": 7.0, "persistent_fused_waves": 11.0,
          "pdl": not _tuning.DEFAULT.pdl}  # fmt: skip


def test_force_path_sets_every_choice_and_restores_it():
    assert set(FORCED) == set(LAUNCH_CHOICES)
    before, token = launch_choices(), _tuning.active()[0]
    assert all(before[name] != value for name, value in FORCED.items())
    with force_path(**FORCED):
        assert launch_choices() == FORCED
        assert _tuning.active()[0] != token  # plans of its own
    assert launch_choices() == before and _tuning.active()[0] == token


def test_force_path_restores_after_an_error_and_gives_fresh_plans_when_told():
    before, token = launch_choices(), _tuning.active()[0]
    with pytest.raises(KeyError), force_path(**PLAIN_PATHS["row loop"]):
        assert launch_choices()["one_pass_max_waves"] == 0
        raise KeyError("a failing test")
    assert launch_choices() == before and _tuning.active()[0] == token
    with force_path():  # nothing forced: the library's own plans
        assert _tuning.active()[0] == token
    with force_path(fresh_plans=True):
        assert _tuning.active()[0] != token and launch_choices() == before
    with force_path(one_pass_threads=0):  # 0 is the table's default block size
        assert launch_choice("one_pass_threads") == 128
    with pytest.raises(TypeError, match="force_path: unknown choices"), force_path(lanes=2):
        pass
    assert launch_choices() == before and _tuning.active()[0] == token


def test_force_path_sizes_the_masked_grid(monkeypatch):
    sized = []

    def masked_grid(key, device):  # (handle, blocks an SM, SMs) as the planner's is
        sized.append(key)
        return 7, 10, 132

    monkeypatch.setattr(_plan, "_masked_grid", masked_grid)
    with force_path(masked_blocks_per_sm=1):
        assert _plan._masked_grid("key", 0) == (7, 1, 132)
    assert _plan._masked_grid("key", 0) == (7, 10, 132) and sized == ["key", "key"]
