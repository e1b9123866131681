"""``python -m w4kernels layout``: the printed locations against the packing ops, the Marlin
seed's 32x32 worked example, and the m16n8k16 B-fragment rule of the PTX ISA.

Each location is checked the independent way round: a weight with one distinct value is packed
by the C++ ops (``marlin_repack``, ``awq_marlin_repack``, the KleidiAI packers), or a packed
buffer with one nibble set at the printed place is read by ``awq_dequantize``, and the value
must be exactly where the CLI said.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from w4kernels import __main__ as cli
from w4kernels import layout, ops, reference

SEED = os.path.join(os.path.dirname(__file__), "data", "layout", "marlin_w4_32x32_seed.txt")
WORD = re.compile(r"\(k=(\d+), n=(\d+)\): \S+(?: \S+)?\[(\d+)(?:, (\d+))?\] nibble (\d)")
LANE = re.compile(r"lane (\d+)")


def run_cli(capsys, *argv):
    """(exit code, stdout, stderr) of ``python -m w4kernels layout ...`` run in-process."""
    try:
        code = cli.main(["layout", *argv])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def printed(capsys, *argv):
    """{(k, n): (word index tuple, nibble, consuming lane)} from the CLI's --at lines."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    found = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = WORD.match(line)
        if m:
            k, n, w0, w1, nib = m.groups()
            word = (int(w0),) if w1 is None else (int(w0), int(w1))
            lane = LANE.search(lines[i + 1])
            found[(int(k), int(n))] = (word, int(nib), lane and int(lane.group(1)))
    return found


# A few elements per shape: the corners, tile and n8-half boundaries, odd k and n.
MARLIN_CASES = [(64, 64, [(0, 0), (1, 8), (15, 63), (17, 9), (63, 62)]),
                (32, 192, [(0, 64), (9, 130), (31, 191), (16, 100)])]


@pytest.mark.parametrize("size_k,size_n,elements", MARLIN_CASES)
def test_marlin_location_matches_repack_ops(capsys, size_k, size_n, elements):
    at = [a for k, n in elements for a in ("--at", f"{k},{n}")]
    found = printed(capsys, "marlin", "--k", str(size_k), "--n", str(size_n), *at)
    for (k, n), ((row, col), nibble, _) in found.items():
        q = torch.zeros(size_k, size_n, dtype=torch.int32)
        q[k, n] = 11
        for packed in (ops.marlin_repack(reference.pack_rows(q), None, size_k, size_n),
                       ops.awq_marlin_repack(reference.awq_pack(q), size_k, size_n)):
            assert packed.shape == (size_k // 16, 2 * size_n)
            nonzero = packed.nonzero().tolist()
            assert nonzero == [[row, col]], f"(k={k}, n={n}): value in words {nonzero}"
            assert (int(packed[row, col]) & 0xFFFFFFFF) == 11 << (4 * nibble)
    assert len(found) == len(elements)


@pytest.mark.parametrize("k,n", [(0, 0), (5, 9), (63, 17), (40, 127)])
def test_awq_location_read_back_by_awq_dequantize(capsys, k, n):
    size_k, size_n = 64, 128
    found = printed(capsys, "awq", "--k", str(size_k), "--n", str(size_n), "--at", f"{k},{n}")
    (row, col), nibble, _ = found[(k, n)]
    qweight = torch.zeros(size_k, size_n // 8, dtype=torch.int32)
    qweight[row, col] = 3 << (4 * nibble)
    scales = torch.ones(1, size_n, dtype=torch.float16)
    qzeros = torch.zeros(1, size_n // 8, dtype=torch.int32)
    w = ops.awq_dequantize(qweight, scales, qzeros)
    assert w.nonzero().tolist() == [[k, n]] and w[k, n] == 3


KLEIDIAI_CASES = [  # (K, N, bl, nr, kr, sr, elements (k, n))
    (64, 16, 0, 8, 16, 2, [(0, 0), (17, 9), (40, 15), (63, 3)]),
    (40, 10, 0, 4, 16, 2, [(39, 9), (16, 0), (23, 7)]),  # K, N not multiples of 32, nr
    (96, 8, 32, 8, 16, 2, [(0, 0), (49, 7), (95, 2)]),
    (64, 8, 64, 4, 8, 2, [(31, 1), (33, 6)]),
]


@pytest.mark.parametrize("size_k,size_n,bl,nr,kr,sr,elements", KLEIDIAI_CASES)
def test_kleidiai_location_matches_packers(capsys, size_k, size_n, bl, nr, kr, sr, elements):
    at = [a for k, n in elements for a in ("--at", f"{k},{n}")]
    found = printed(capsys, "kleidiai", "--k", str(size_k), "--n", str(size_n), "--bl", str(bl),
                    "--nr", str(nr), "--kr", str(kr), "--sr", str(sr), *at)

    def pack(codes, kxn):  # uint4 codes [N, K], zero point 8 -> packed bytes
        if kxn:
            src = codes.t().contiguous()
            src = torch.nn.functional.pad(src, (0, src.shape[1] % 2), value=8)
            rhs = (src[:, 0::2] | (src[:, 1::2] << 4)).to(torch.uint8)
        else:
            src = torch.nn.functional.pad(codes, (0, codes.shape[1] % 2), value=8)
            rhs = (src[:, 0::2] | (src[:, 1::2] << 4)).to(torch.uint8)
        if bl:
            scale = torch.ones(size_n, size_k // bl, dtype=torch.bfloat16)
            packer = (ops.rhs_pack_kxn_qsi4c32p_qsu4c32s1s0 if kxn
                      else ops.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0)
            return packer(rhs, scale, None, size_n, size_k, bl, nr, kr, sr)
        packer = ops.rhs_pack_kxn_qsi4cxp_qs4cxs1s0 if kxn else ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0
        return packer(rhs, torch.ones(size_n), None, size_n, size_k, nr, kr, sr)

    for kxn in (False, True):
        background = torch.full((size_n, size_k), 8, dtype=torch.int32)  # w = 0 everywhere
        base = pack(background, kxn)
        for (k, n), ((offset,), nibble, _) in found.items():
            codes = background.clone()
            codes[n, k] = 13  # w = 5, stored as the int4 5
            packed = pack(codes, kxn)
            assert int(packed[offset]) >> (4 * nibble) & 15 == 5
            assert int(packed[offset]) >> (4 * (1 - nibble)) & 15 == int(base[offset]) >> (
                4 * (1 - nibble)) & 15
            # Besides that byte only the row's reduction sum (4 bytes) may change, unless the
            # row is the last one and the block has padding rows (they copy row N - 1).
            if n == size_n - 1 and size_n % nr:
                continue
            others = [i for i in (packed != base).nonzero().flatten().tolist() if i != offset]
            assert len(others) <= 4 and (not others or others[-1] - others[0] < 4), others


def read_seed():
    with open(SEED) as f:
        rows = [[int(v) for v in line.split()] for line in f if not line.startswith("#")]
    assert len(rows) == 32 and all(len(r) == 32 for r in rows)
    return rows


def test_marlin_seed_32x32_worked_example():
    """shared/seeds/marlin-w4-format.md: element 32 k + n of a 32 x 32 weight is entry j of line
    t of the permuted layout: thread t holds it, at packed position 32 t + j, i.e. nibble j % 8
    of word 4 t + j // 8 of the chunk (b_q_weight [2, 64] holds the one 1024-value chunk)."""
    rows = read_seed()
    for t, row in enumerate(rows):
        for j, e in enumerate(row):
            loc = layout.marlin_location(e // 32, e % 32, 32, 32)
            flat_word = loc.word[0] * 64 + loc.word[1]
            assert (flat_word, loc.nibble) == (4 * t + j // 8, j % 8), (t, j, e)
            assert loc.consumer["lane"] == t
    # Step 2: thread 0 uses [0, 32, 256, 288, 8, 40, 264, 296] (before the step-3 interleave);
    # step 4: those sit in word 0 as nibbles b0..b7 = 0, 256, 8, 264, 32, 288, 40, 296.
    assert sorted(rows[0][:8]) == sorted([0, 32, 256, 288, 8, 40, 264, 296])
    assert rows[0][:8] == [0, 256, 8, 264, 32, 288, 40, 296]


def test_marlin_seed_example_through_the_cli(capsys):
    rows = read_seed()
    picks = [(0, 0), (0, 1), (5, 17), (31, 31)]
    at = [a for t, j in picks for a in ("--at", f"{rows[t][j] // 32},{rows[t][j] % 32}")]
    found = printed(capsys, "marlin", "--k", "32", "--n", "32", *at)
    for t, j in picks:
        e = rows[t][j]
        (row, col), nibble, lane = found[(e // 32, e % 32)]
        assert (row * 64 + col, nibble, lane) == (4 * t + j // 8, j % 8, t)


@pytest.mark.parametrize("size_k,size_n", [(32, 32), (48, 128)])
def test_marlin_lanes_agree_with_the_mma_b_fragment(size_k, size_n):
    """For every element: the lane whose 16-byte load holds it (from the packing permutation) is
    the lane the PTX m16n8k16 B-fragment rule gives, and the nibble decodes (Marlin's lop3 on
    nibbles (0, 4), (1, 5) of q and of q >> 8) into that fragment's register and half, in the
    right n8 half of the 16x16 tile."""
    for k in range(size_k):
        for n in range(size_n):
            c = layout.marlin_location(k, n, size_k, size_n).consumer
            nib = layout.marlin_location(k, n, size_k, size_n).nibble
            assert c["lane"] == c["lane_from_fragment"] == 4 * (n % 8) + (k % 8) // 2
            assert c["n8_half"] == (n % 16) // 8
            assert (c["register"], c["half"]) == (nib % 2, nib // 4)


def test_awq_consumer_is_the_remapped_mma_column():
    """awq_gemm (csrc/kernels/awq_gemm.cuh) remaps mma columns: n8 tile j, mma column p of the
    warp's 64 columns is real column 8 * (8 * warp + p) + AWQ_ORDER[j], and the lane is the
    PTX B-fragment lane of (k, p)."""
    for k in range(32):
        for n in range(128):
            c = layout.awq_location(k, n, 32, 128).consumer
            real = 8 * (8 * c["warp_columns"] + c["mma_column"]) + \
                reference.AWQ_ORDER[c["n8_tile_of_warp"]]
            assert real == n
            frag = layout.mma_b_fragment(k, c["mma_column"])
            assert (c["lane"], c["register"], c["half"]) == \
                (frag["lane"], frag["register"], frag["half"])


def test_tile_map_text(capsys):
    code, out, _ = run_cli(capsys, "marlin", "--k", "32", "--n", "64", "--map")
    assert code == 0
    lines = out.splitlines()
    body = lines[lines.index(next(x for x in lines if x.startswith("k \\ n"))) + 1:]
    assert len(body) == 16
    for k, line in enumerate(body):
        lanes = [int(v) for v in line.split()[1:]]
        assert lanes == [layout.marlin_location(k, n, 32, 64).consumer["lane"]
                         for n in range(64)]


def test_png(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional (only --png needs it)")
    for fmt in ("marlin", "awq", "kleidiai"):
        path = tmp_path / f"{fmt}.png"
        code, out, err = run_cli(capsys, fmt, "--k", "64", "--n", "64", "--png", str(path))
        assert code == 0, err
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" raises
    code, out, err = run_cli(capsys, "marlin", "--png", str(tmp_path / "x.png"))
    assert code == 1
    assert "--png needs matplotlib, which is not installed (pip install matplotlib)" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["marlin", "--k", "64", "--n", "64", "--at", "64,0"],
     "layout marlin: element (k=64, n=0) is outside the K x N = 64 x 64 weight"),
    (["marlin", "--k", "40", "--n", "64"],
     "layout marlin: K = 40, N = 64: Marlin needs K and N multiples of 16"),
    (["awq", "--n", "12"], "layout awq: K = 128, N = 12: AutoAWQ packs 8 columns per int32"),
    (["kleidiai", "--k", "64", "--bl", "48"], "layout kleidiai: bl = 48: the per-block format "
                                             "needs bl a multiple of 32"),
    (["kleidiai", "--kr", "12"], "nr=8, kr=12, sr=2: need"),
    (["marlin", "--bl", "32"], "--bl, --nr, --kr and --sr describe the KleidiAI packing; marlin"),
    (["awq", "--at", "3"], "'3': expected k,n (two integers, e.g. 17,130)"),
    (["awq", "--map", "--origin", "200,0"],
     "layout awq: element (k=200, n=0) is outside the K x N = 128 x 128 weight"),
])
def test_errors_name_the_argument(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err


def test_module_entry_point():
    """The real command line, once (the rest run in-process)."""
    proc = subprocess.run([sys.executable, "-m", "w4kernels", "layout", "marlin", "--at", "17,9"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "(k=17, n=9): b_q_weight[1, 16] nibble 6" in proc.stdout
