"""benchmarks.gpu_kernels: counting the kernels of a compiled XLA:GPU module's text (no GPU and
no XLA:GPU compiler needed: a hand-written module in the compiled text's form)."""

import pytest

from benchmarks import gpu_kernels as gk

# ENTRY: 2 kernels, a scan of 5 trips (body: 3 kernels and a scan of 4 trips of 2 kernels), a
# solver loop of unknown length (body 6 kernels, test 1 kernel), a conditional (2 or 4 kernels)
# and a call of a computation with 1 kernel
MODULE = """HloModule jit_run, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%inner_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %g = f32[4]{0} get-tuple-element(%t), index=1
  %k1 = f32[4]{0} fusion(%g), kind=kLoop, calls=%fused_a
  %k2 = f32[4]{0} fusion(%k1), kind=kLoop, calls=%fused_a
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %r = (s32[], f32[4]{0}) tuple(%i, %k2)
}

%inner_cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %c = pred[] fusion(%t), kind=kLoop, calls=%fused_a
}

%scan_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %g = f32[4]{0} get-tuple-element(%t), index=1
  %k1 = f32[4]{0} fusion(%g), kind=kLoop, calls=%fused_a
  %gemm = (f32[4]{0}, s8[0]{0}) custom-call(%k1), custom_call_target="__cublas$gemm"
  %k3 = f32[4]{0} copy(%k1)
  %w = (s32[], f32[4]{0}) while(%t), condition=%inner_cond, body=%inner_body, @META3@, @TRIPS4@
  ROOT %r = (s32[], f32[4]{0}) tuple(%t, %k3)
}

%scan_cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %c = pred[] fusion(%t), kind=kLoop, calls=%fused_a
}

%solve_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %a1 = f32[4]{0} fusion(%t), kind=kLoop, calls=%fused_a
  %a2 = f32[4]{0} fusion(%a1), kind=kInput, calls=%fused_a
  %a3 = f32[4]{0} fusion(%a2), kind=kLoop, calls=%fused_a
  %a4 = f32[4]{0} fusion(%a3), kind=kLoop, calls=%fused_a
  %a5 = f32[4]{0} fusion(%a4), kind=kCustom, calls=%fused_a
  %a6 = f32[4]{0} fusion(%a5), kind=kLoop, calls=%fused_a
  ROOT %r = (s32[], f32[4]{0}) tuple(%t, %a6)
}

%branch_small (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %b1 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_a
  ROOT %b2 = f32[4]{0} fusion(%b1), kind=kLoop, calls=%fused_a
}

%branch_big (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %b1 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_a
  %b2 = f32[4]{0} fusion(%b1), kind=kLoop, calls=%fused_a
  %b3 = f32[4]{0} fusion(%b2), kind=kLoop, calls=%fused_a
  ROOT %b4 = f32[4]{0} fusion(%b3), kind=kLoop, calls=%fused_a
}

%called (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %c1 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_a
}

ENTRY %main.1 (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %c = f32[] constant(0)
  %e1 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %bc = f32[4]{0} bitcast(%e1)
  %tup = (s32[], f32[4]{0}) tuple(%c, %bc)
  %scan = (s32[], f32[4]{0}) while(%tup), condition=%scan_cond, body=%scan_body, @META1@, @TRIPS5@
  %solve = (s32[], f32[4]{0}) while(%scan), condition=%inner_cond, body=%solve_body, @META2@
  %g = f32[4]{0} get-tuple-element(%solve), index=1
  %pred = s32[] fusion(%g), kind=kLoop, calls=%fused_a
  %cnd = f32[4]{0} conditional(%pred, %g, %g), branch_computations={%branch_small, %branch_big}
  %cl = f32[4]{0} call(%cnd), to_apply=%called
  ROOT %out = f32[4]{0} fusion(%cl), kind=kLoop, calls=%fused_a
}

FileNames
1 "/repo/bchg_jax/tabular/rollout.py"
2 "/repo/bchg_jax/core/host_tests.py"
3 "/repo/bchg_jax/tabular/follower.py"

FunctionNames
1 "rollout"
2 "chunked_while_loop"
3 "solve"

FileLocations
1 {file_name_id=1 function_name_id=1 line=235 end_line=235 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=98 end_line=98 column=1 end_column=2}
3 {file_name_id=3 function_name_id=3 line=40 end_line=40 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=4}
3 {file_location_id=2 parent_frame_id=0}
4 {file_location_id=3 parent_frame_id=0}
"""
_TRIPS = 'backend_config={"known_trip_count":{"n":"%d"},"known_init_step":{"init":"0","step":"1"}}'
for _frame in (1, 2, 3):
    MODULE = MODULE.replace(
        f"@META{_frame}@", f'metadata={{op_name="jit(run)/while" stack_frame_id={_frame}}}'
    )
MODULE = MODULE.replace("@TRIPS4@", _TRIPS % 4).replace("@TRIPS5@", _TRIPS % 5)


def test_counts_kernels_through_loops_conditionals_and_calls():
    c = gk.count(gk.parse(MODULE))
    # entry: e1, pred, out (3) + the larger branch (4) + the call (1) = 8; the scan: 5 trips of
    # (fusion, gemm, copy = 3, plus 4 x 2 of its inner scan) = 5 x 11 = 55
    assert c.fixed == 8 + 55
    # the solver loop: 6 kernels per trip and 1 for its test; its site skips the loop helper
    assert c.unknown == [("tabular/follower.py:40 (solve)", 7.0)]
    # the known loops, each with its trips per run of the entry (the inner one: 5 x 4)
    assert sorted(c.known) == [
        ("core/host_tests.py:98 (w)", 20, 2.0),
        ("tabular/rollout.py:235 (scan)", 5, 11.0),
    ]
    # a known loop inside the solver loop is listed per trip of it
    solver = MODULE.replace(
        "%a1 = f32[4]{0} fusion(%t), kind=kLoop, calls=%fused_a",
        "%a1 = (s32[], f32[4]{0}) while(%t), condition=%inner_cond, body=%inner_body, "
        + _TRIPS % 3,
    )
    inner = gk.count(gk.parse(solver))
    assert ("a1 [per trip of tabular/follower.py:40 (solve)]", 3, 2.0) in inner.known
    # the solver's trip: 5 kernels, the inner loop's 3 x 2, its test's 1
    assert inner.unknown == [("tabular/follower.py:40 (solve)", 5 + 3 * 2 + 1)]
    text = gk.report(c)
    assert "| `tabular/rollout.py:235 (scan)` | 5 | 11 |" in text
    assert "| `tabular/follower.py:40 (solve)` | 7 |" in text


def test_an_unknown_loop_inside_a_scan_is_listed_per_trip():
    inner = MODULE.replace(_TRIPS % 4, "")
    c = gk.count(gk.parse(inner))
    assert c.fixed == 8 + 5 * 3  # the inner loop's kernels no longer in the fixed count
    assert ("core/host_tests.py:98 (w)", 3.0) in c.unknown  # 2 per trip + 1 for its test


def test_a_module_without_an_entry_is_refused():
    with pytest.raises(ValueError, match="no ENTRY"):
        gk.parse("%a (p: f32[]) -> f32[] {\n  ROOT %p = f32[] parameter(0)\n}\n")


def test_without_the_compiler_the_error_says_how_to_install_it(monkeypatch):
    from jax.experimental import topologies

    def missing(*a, **k):
        raise NotImplementedError("topology not implemented for cuda")

    monkeypatch.setattr(topologies, "get_topology_desc", missing)
    with pytest.raises(SystemExit, match="gpu_compiler.sh"):
        gk.cuda_device(gk.TARGET_FILE, attached=False)


def test_an_unknown_experiment_is_refused_before_compiling(capsys):
    with pytest.raises(SystemExit):
        gk.main(["--experiments", "fourrooms,nope"])
    assert "unknown experiments ['nope']" in capsys.readouterr().err
