"""The CUDA kernel of w4a16_gemm (csrc/kernels/w4a16_gemm.cuh) under the SIMT emulator, on the
shapes and options that exercise its structure, beyond tests/test_w4a16_gemm.py (which runs its
numerical parametrization on 'simt' too).

* Numerics: against ``reference.w4a16_gemm`` (float64) within the derived fp32-accumulation bound
  of tests/test_w4a16_gemm.py (``check_against_reference``): several 128-column tiles and
  N = 64 x odd, several row tiles, every M tile height (16/32/48/64), every scale path
  (per-channel, per-stage groups, row groups), K that is not a multiple of the 128-row pipeline
  stage, groups that are not a multiple of the 16-row k-tile, a with a row stride, split-K
  (arrival counters, bits independent of block order under every emulator schedule), workspace
  sizes and a dirty workspace.
* Dispatch: from W4K_W4A16_DEQUANT_THRESHOLD rows on, grouped layers are dequantized once by the
  emulated marlin_dequant_kernel and multiplied with a matmul (both sides of the threshold, the
  weight's bits, per-channel staying on the kernel).
* Layout: the golden vectors through the kernel with a = I (exact decoded weights).
* Argument checks: the emulator binding reports exactly the CPU backend's messages.
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from test_w4a16_gemm import (BAD_INPUTS, DTYPES, OP, _base, call, check_against_reference,
                             identity_gemm, make_case, op_args)
from w4kernels import reference


def simt():
    return backend_or_skip("simt", OP)


# ---- numerics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size_k,size_n,group_size", [
    (k, n, g) for k, n in [(128, 256), (256, 128)] for g in (-1, 32, 64, 128) if g < k])
@pytest.mark.parametrize("m", [1, 3, 16, 33, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_blocks(dtype, m, size_k, size_n, group_size):
    """Several 64-column blocks, every tile height (M = 1, 3: 16 rows; 16; 33: 48; 128: two
    64-row block rows)."""
    check_against_reference(simt(), make_case(m, size_k, size_n, group_size, dtype, seed=m + 100))


@pytest.mark.parametrize("m", [17, 48, 65, 130])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_partial_block_rows(dtype, m):
    """M that ends inside a 16-row m-tile or a 64-row block row (zero-filled A rows, masked
    stores), with zero points and bias."""
    check_against_reference(simt(), make_case(m, 128, 128, 32, dtype, zp=True, bias=True, seed=m))


@pytest.mark.parametrize("size_k,group_size", [(16, -1), (48, 16), (80, -1), (112, 16),
                                                (208, 16), (96, 32), (160, 32), (192, 64)])
@pytest.mark.parametrize("act_order", [None, "k_full"], ids=["noact", "act"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_partial_last_stage(dtype, act_order, size_k, group_size):
    """K not a multiple of the 128-row pipeline stage: the copies past K are zero-filled (A,
    weights, scales), so the last stage needs no special compute. Groups of 32 and 64 take the
    per-stage group path (act-order in group order too), whose last stage then holds fewer group
    rows than it has slots."""
    case = make_case(5, size_k, 64, group_size, dtype, act_order, zp=True, bias=True, seed=size_k)
    check_against_reference(simt(), case)


@pytest.mark.parametrize("size_k,group_size", [(128, 8), (96, 24), (96, 48), (160, 40)])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_groups_inside_a_k_tile(dtype, size_k, group_size):
    """Group sizes that are not a multiple of 16: the rows of one k-tile (and of one lane's row
    pair, for group size 8) take scales and zero points from different groups."""
    case = make_case(9, size_k, 128, group_size, dtype, zp=True, seed=group_size)
    check_against_reference(simt(), case)


@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_act_order_shard_small_groups(dtype, zp):
    """Row-parallel act-order shard with many small groups: g_idx changes inside k-tiles."""
    case = make_case(7, 128, 64, 8, dtype, "shard", zp=zp, bias=True, seed=21)
    check_against_reference(simt(), case)


@pytest.mark.parametrize("row_stride,offset", [(296, 8), (301, 3)], ids=["aligned", "unaligned"])
def test_a_with_row_stride(row_stride, offset):
    """a as a column slice of a wider tensor: read in place when rows stay 16-byte aligned,
    copied first otherwise (cp.async needs 16-byte aligned sources)."""
    b = simt()
    case = make_case(7, 256, 128, 64, torch.float16, seed=2)
    wide = torch.randn(7, row_stride).to(torch.float16)
    wide[:, offset:offset + 256] = case["a"]
    case["a"] = wide[:, offset:offset + 256]
    assert case["a"].stride(0) == row_stride
    check_against_reference(b, case)


@pytest.mark.parametrize("act_order", [None, "k_full"], ids=["noact", "act"])
@pytest.mark.parametrize("group_size", [-1, 64])
def test_unaligned_views(group_size, act_order):
    """b_q_weight, b_scales, b_zeros and g_idx as views that are not 16-byte aligned (the kernel
    loads them 16 bytes at a time; the binding copies such views first). Regression: b_zeros
    was passed as it came, which the group path's cp.async rejects (found by the fuzzer once
    act-order in group order took that path)."""
    b = simt()
    case = make_case(5, 256, 128, group_size, torch.float16, act_order, zp=True, seed=4)

    def shifted(t):
        flat = torch.cat([torch.zeros(1, dtype=t.dtype), t.flatten()])
        view = flat[1:].view(t.shape)
        assert view.data_ptr() % 16 != 0
        return view

    for name in ("b_q_weight", "b_scales", "b_zeros", "g_idx"):
        if case[name] is not None:
            case[name] = shifted(case[name])
    check_against_reference(b, case)


@pytest.mark.parametrize("m,size_n", [(1, 64), (3, 128), (40, 64)])
def test_split_k_reuses_the_workspace(m, size_n):
    """Split-K (the emulated device has 8 SMs, so grids of 1-2 tiles split the 8 stages of
    K = 1024 in two): correct, the arrival counters are zero again afterwards, and a second call
    with the same workspace gives the same bits (the partial tiles add up in split order)."""
    b = simt()
    case = make_case(m, 1024, size_n, 128, torch.bfloat16, "k_full", zp=True, bias=True, seed=m)
    check_against_reference(b, case)
    assert int(case["workspace"].abs().sum()) == 0
    assert golden.same_bits(call(b, case), call(b, case))


# (schedule of the threads in a block, blocks run at once): with one worker the blocks run one
# after another, with four the splits of a tile arrive in varying order.
SCHEDULES = [("forward", 1), ("reverse", 1), ("shuffle", 1), ("forward", 4), ("shuffle", 4)]


def same_bits_under_schedules(monkeypatch, b, case, schedules, seed):
    """The op's output under each (schedule, workers): the same bits every time, and the split-K
    counters back at zero after each call."""
    outs = []
    for schedule, workers in schedules:
        monkeypatch.setenv("W4K_SIMT_SCHEDULE", schedule)
        monkeypatch.setenv("W4K_SIMT_WORKERS", str(workers))
        monkeypatch.setenv("W4K_SIMT_SEED", str(len(outs) + seed))
        outs.append(call(b, case))
        assert int(case["workspace"].abs().sum()) == 0
    for out in outs[1:]:
        assert golden.same_bits(out, outs[0])


@pytest.mark.parametrize("m,size_n,size_k,group_size,zp,act_order", [
    (1, 128, 4096, 128, False, None),    # 1 tile, 8 splits of 4 stages (kGroup)
    (9, 192, 2048, -1, True, None),      # N = 64 x 3 (a half-empty tile), per-channel + zp
    (17, 128, 2048, 64, True, "k_full"),  # act-order in group order (group path), 32 rows
    (17, 128, 2048, 64, True, "unordered"),  # act-order, a row out of group order (row groups)
    (40, 64, 1024, 32, True, None),      # group 32 with zero points, 48-row tile
    (64, 128, 1536, 256, False, None),   # group 256 (scales advance every 2 stages), 64 rows
], ids=["m1-g128", "n192-chan-zp", "act-g64", "act-g64-rows", "g32-zp", "m64-g256"])
def test_split_k_bits_do_not_depend_on_block_order(monkeypatch, m, size_n, size_k, group_size,
                                                   zp, act_order):
    """No block waits for another: every split writes its partial tile and the last to arrive
    adds them in split order. Same bits under every thread schedule and with 1 or 4 blocks in
    flight; counters back at zero after each call."""
    b = simt()
    unordered = act_order == "unordered"
    case = make_case(m, size_k, size_n, group_size, torch.float16,
                     "k_full" if unordered else act_order, zp=zp, bias=True, seed=size_k + m)
    if unordered:
        case = rows_out_of_group_order(case, 1024 + group_size)
    same_bits_under_schedules(monkeypatch, b, case, SCHEDULES, seed=7)
    check_against_reference(b, case)


# Balanced split-K (W4K_W4A16_SPLIT_BLOCKS = B): B blocks take equal runs of the tiles x stages
# (tile, stage) units, tile-major. K = 2048 is 16 stages. (M, N, B): 3 tiles, B = 2: runs of 24
# stages, a whole tile written directly plus half of the next; B = 5: every run crosses a tile
# boundary (a block with two partial tiles, tiles of 2-3 parts); 48: one stage per block (16
# parts per tile); 6 tiles (two 64-row tiles x 3) in 7 and 13 runs; 1 tile in 3 uneven runs.
SPLIT_RUNS = [(5, 384, 2), (5, 384, 5), (5, 384, 48), (70, 384, 7), (70, 384, 13), (20, 128, 3)]


@pytest.mark.parametrize("m,size_n,blocks", SPLIT_RUNS,
                         ids=[f"m{m}-n{n}-b{b}" for m, n, b in SPLIT_RUNS])
def test_split_runs_across_tiles(monkeypatch, m, size_n, blocks):
    """Runs that start and end inside tiles: every tile's parts add up in block order, whoever
    arrives last; the same bits under every schedule, the counters back at zero."""
    monkeypatch.setenv("W4K_W4A16_SPLIT_BLOCKS", str(blocks))
    b = simt()
    case = make_case(m, 2048, size_n, 128, torch.bfloat16, zp=True, bias=True, seed=m + blocks)
    same_bits_under_schedules(monkeypatch, b, case,
                              SCHEDULES if blocks in (5, 13) else SCHEDULES[:1], seed=3)
    check_against_reference(b, case)


def test_split_runs_act_order_row_groups(monkeypatch):
    """A run crossing tiles on the row-group path (act-order, a row out of group order): the
    lane's cached scale groups start afresh in each segment."""
    monkeypatch.setenv("W4K_W4A16_SPLIT_BLOCKS", "5")
    case = rows_out_of_group_order(
        make_case(9, 2048, 384, 64, torch.float16, "k_full", zp=True, bias=True, seed=77), 1088)
    check_against_reference(simt(), case)


@pytest.mark.parametrize("value", ["abc", "-3", "4x"])
def test_split_blocks_override_must_be_a_count(monkeypatch, value):
    monkeypatch.setenv("W4K_W4A16_SPLIT_BLOCKS", value)
    case = make_case(1, 1024, 128, 128, torch.float16, seed=2)
    with pytest.raises(RuntimeError, match=rf"W4K_W4A16_SPLIT_BLOCKS: expected a number >= 0, "
                                           rf"got '{value}'"):
        call(simt(), case)


@pytest.mark.parametrize("workspace_size", [1, 8, 10000], ids=["one", "per-sm", "large"])
def test_any_workspace_size(workspace_size):
    """One int (split-K only when a single tile splits), vLLM's one int per SM (8 here) or more:
    all legal, all correct, all left zero."""
    b = simt()
    for m, size_n in [(1, 128), (20, 384)]:  # 1 tile (splits) and 3 tiles
        case = make_case(m, 2048, size_n, 128, torch.bfloat16, zp=True, seed=workspace_size)
        case["workspace"] = torch.zeros(workspace_size, dtype=torch.int32)
        check_against_reference(b, case)
        assert int(case["workspace"].abs().sum()) == 0


def test_dirty_workspace_is_an_error_not_a_hang():
    """A workspace that is not zero (torch.empty, or a crashed call) is rejected at once on the
    host backends, naming the workspace; the GPU kernel never waits on it either."""
    b = simt()
    case = make_case(1, 4096, 128, 128, torch.float16, seed=1)
    case["workspace"][0] = 7
    with pytest.raises(RuntimeError, match=r"workspace must be all zeros .* workspace\[0\] = 7"):
        call(b, case)


def rows_out_of_group_order(case, row):
    """The act-order case with row `row` (a group's first row) moved into the previous group:
    g_idx stays sorted, but is no longer r / group_size."""
    g_idx = case["g_idx"].clone()
    assert row > 0 and g_idx[row] == g_idx[row - 1] + 1
    g_idx[row] -= 1
    c = {k: v for k, v in case.items() if k not in ("_w", "_qz")}  # no longer what they were
    # The tolerance's weight magnitudes: the reference's weight under the new g_idx.
    c.update(g_idx=g_idx, _w_ref=reference.w4a16_weight(c["b_q_weight"], c["b_scales"],
                                                         c["b_zeros"], g_idx, c["size_k"],
                                                         c["size_n"]))
    return c


# K = 4352: the gather kernel's g_idx check spans three blocks of 2048 rows (the last partial).
@pytest.mark.parametrize("row", [None, 128, 2048 + 640, 4096 + 128],
                         ids=["in-order", "block0", "block1", "last-block"])
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
def test_act_order_group_order_check(zp, row):
    """Act-order with group size 32/64/128 and K % G == 0: the gather kernel checks on the GPU
    whether g_idx is r / group_size (GPTQ desc_act once sorted) and the GEMM then takes the
    per-stage group path; any row out of that order, in any gather block, keeps the row-group
    path. Both must match the reference."""
    case = make_case(5, 4352, 256, 128, torch.float16, "k_full", zp=zp, bias=True, seed=41 + zp)
    if row is not None:
        case = rows_out_of_group_order(case, row)
    check_against_reference(simt(), case)


def test_act_order_more_rows_than_grid_y():
    """M = 65537 act-order rows: the gather kernel's grid is capped at 65535 in y (the CUDA
    limit) and its blocks loop over the rows. On the GPU only: the emulator needs ~35 s for the
    65535 gather blocks (it ran there once, 2026-11-24, and matched)."""
    b = backend_or_skip("cuda", OP)
    check_against_reference(b, make_case(65537, 32, 64, 16, torch.float16, "k_full", seed=3))


@pytest.mark.parametrize("m", [1, 7, 8, 9, 16, 17, 33, 64, 65, 200])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_every_tile_height(dtype, m):
    """M across the 16/32/48/64-row configurations and several row tiles, N = 64 x 3 (the second
    128-column tile is half empty), group 128 with zero points and bias."""
    case = make_case(m, 512, 192, 128, dtype, zp=True, bias=True, seed=m + 300)
    check_against_reference(simt(), case)


# (group size, act-order); a row-parallel act-order shard has groups by construction.
SCALE_MODES = [(g, act) for g in (-1, 32, 64, 128, 256, 96) for act in (None, "k_full", "shard")
               if not (act == "shard" and g == -1)]


@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("group_size,act_order", SCALE_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_scale_modes(dtype, group_size, act_order, zp):
    """Every scale path: per-channel (scales in the epilogue), per-stage groups (32, 64, 128),
    row groups (act-order, and groups 256 and 96 through a generated g_idx), with N = 64 x 3 (the
    warps of the half-empty second tile must not read scales past N)."""
    case = make_case(5, 768, 192, group_size, dtype, act_order, zp=zp, bias=True,
                     seed=group_size + 11 * zp)
    check_against_reference(simt(), case)


def test_empty_m_returns_empty():
    out = call(simt(), make_case(0, 128, 64, 32, torch.bfloat16))
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


def test_matches_cpu_backend_closely():
    """Same weights rounding as the CPU kernel: the two backends differ by fp32 summation order
    only, far below the output rounding."""
    b = simt()
    case = make_case(33, 256, 192, 64, torch.float16, "k_full", zp=True, bias=True, seed=9)
    cpu = backend_or_skip("cpu", OP)
    ref = reference.w4a16_gemm(**op_args(case))
    diff = (call(b, case).double() - call(cpu, case).double()).abs()
    assert bool((diff <= 2.0 ** -10 * ref.abs() + 1e-4).all())


# ---- dispatch: dequantize once + dense matmul from the token threshold on ---------------------


@pytest.mark.parametrize("group_size,act_order,zp,size_n", [
    (128, None, False, 192), (64, None, True, 640), (32, "k_full", True, 192),
    (128, "shard", False, 640), (96, None, True, 192)],
    ids=["g128", "g64-zp-n640", "act-g32-zp", "shard-g128-n640", "g96-rows"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_dense_path_from_the_threshold(monkeypatch, backend, dtype, group_size, act_order, zp,
                                       size_n):
    """W4K_W4A16_DEQUANT_THRESHOLD=8: M = 7 runs the tensor-core kernel, M = 8 and 9 the emulated
    dequantization kernel (N = 640: two blocks of 8 chunks, the second half empty) and a CPU
    matmul with the bias; both sides within the reference's bound."""
    b = backend_or_skip(backend, OP)
    monkeypatch.setenv("W4K_W4A16_DEQUANT_THRESHOLD", "8")
    for m in (7, 8, 9):
        case = make_case(m, 384, size_n, group_size, dtype, act_order, zp=zp, bias=True, seed=m)
        check_against_reference(b, case)


@pytest.mark.parametrize("act_order,zp", [(None, True), ("k_full", False)], ids=["zp", "act"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_dense_path_weight_bits(monkeypatch, backend, dtype, act_order, zp):
    """a = I on the dense path (M = K = 256 >= the threshold): the output is the reference's
    dequantized weight (reference.marlin_dequantize) exactly, i.e. the dequantization kernel
    rounds (q - z) * s once, as the tensor-core path's B fragments. (Equal values: the identity
    matmul adds +0 terms, so a -0 weight comes out +0.)"""
    monkeypatch.setenv("W4K_W4A16_DEQUANT_THRESHOLD", "8")
    c = make_case(1, 256, 576, 64, dtype, act_order, zp=zp, seed=3)
    b = backend_or_skip(backend, OP)
    dev = {k: v.to(b.device) if isinstance(v, torch.Tensor) else v for k, v in c.items()}
    out = identity_gemm(b, dev["b_q_weight"], dev["b_scales"], dev["b_zeros"], 256, 576,
                        dev["g_idx"], dev["perm"]).cpu()
    assert torch.equal(out, c["_w"])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_per_channel_stays_on_the_kernel(monkeypatch, backend, dtype):
    """Per channel (G == 1) the kernel multiplies the fp32 sum by the scale, which no dense
    fp16/bf16 weight reproduces: above the threshold it keeps the kernel and still meets the
    bound of the unrounded weight (a dense rounded weight would miss it on these inputs)."""
    b = backend_or_skip(backend, OP)
    monkeypatch.setenv("W4K_W4A16_DEQUANT_THRESHOLD", "8")
    check_against_reference(b, make_case(40, 512, 128, -1, dtype, zp=True, bias=True, seed=11))


# ---- layout against the golden vectors ------------------------------------------------------


@pytest.mark.parametrize("case", golden.cases("marlin", "gptq_marlin_repack"))
def test_golden_gptq_repack_layout(case):
    """Upstream gptq_marlin_repack output decodes to q - 8 (unit scales, a = I)."""
    b = simt()
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    gptq = case["inputs"]["b_q_weight"]
    q = (gptq.repeat_interleave(8, dim=0) >> (4 * (torch.arange(k) % 8)).reshape(k, 1)) & 0xF
    if case["inputs"]["perm"].numel() > 0:
        q = q[case["inputs"]["perm"].long()]
    out = identity_gemm(b, case["expected"]["out"], torch.ones(1, n, dtype=torch.float16), None,
                        k, n)
    assert torch.equal(out, (q - 8).to(torch.float16))


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_permute_scales"))
def test_golden_scale_permutation(case):
    """Upstream-permuted scales (32-wide and 64-wide perms) decode to the original ones."""
    b = simt()
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    s, s_marlin = case["inputs"]["s"], case["expected"]["out"]
    nines = torch.full((k // 16, 2 * n), 0x99999999 - (1 << 32), dtype=torch.int32)
    out = identity_gemm(b, nines, s_marlin, None, k, n)
    assert golden.same_bits(out, s.repeat_interleave(k // s.shape[0], dim=0))


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_zero_points"))
def test_golden_zero_points(case):
    """Upstream Marlin zero points decode to the original ones (codes 0, unit scales)."""
    b = simt()
    g, n, k = case["params"]["size_k"], case["params"]["size_n"], case["params"]["weight_size_k"]
    out = identity_gemm(b, torch.zeros(k // 16, 2 * n, dtype=torch.int32),
                        torch.ones(g, n, dtype=torch.bfloat16), case["expected"]["out"], k, n)
    assert torch.equal(out, -case["inputs"]["zp"].repeat_interleave(k // g, dim=0).bfloat16())


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_layer_pack"))
def test_golden_layer_pack(case):
    """IST-DASLab Marlin Layer.pack: a = I returns fp16((q - 8) * s) bit for bit."""
    b = simt()
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    q, s = case["inputs"]["q"].int(), case["inputs"]["s"]
    out = identity_gemm(b, case["expected"]["B"], case["expected"]["s"], None, k, n)
    expected = ((q - 8).float() * s.float().repeat_interleave(k // s.shape[0], dim=0)).half()
    assert golden.same_bits(out, expected)


# ---- argument checks: the CPU backend's messages ------------------------------------------------


def _message(namespace, case):
    c = case
    op = getattr(torch.ops, namespace).w4a16_gemm.default
    try:
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), c["a"], c["b_q_weight"],
                      c["b_scales"], c["b_zeros"], c["g_idx"], c["perm"], c["workspace"],
                      c["num_bits"], c["size_m"], c["size_n"], c["size_k"], c["is_k_full"],
                      c["b_bias"], c["use_fp32_reduce"])
    except RuntimeError as e:
        return str(e).split("\n")[0]
    return None


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_errors_match_cpu(name):
    simt()
    backend_or_skip("cpu", OP)
    case = _base()
    assert _message("w4kernels_simt", case) is None  # the base case itself is valid
    BAD_INPUTS[name][0](case)
    cpu, emulated = _message("w4kernels", case), _message("w4kernels_simt", case)
    assert cpu is not None and cpu.startswith("w4a16_gemm: ") and emulated == cpu
