"""Where element (k, n) of a 4-bit weight lands in each packed format, and who consumes it.

The index math is the reference's own (:mod:`w4kernels.reference`): :func:`marlin_tile_rows`
and :func:`marlin_weight_perm` for Marlin, ``AWQ_NIBBLE`` for AutoAWQ, ``_kai_weight_index``
for KleidiAI; this module only asks them where one element goes. ``python -m w4kernels layout``
prints the answers and draws the tile maps.

Vocabulary (K = in_features, N = out_features; the weight is ``w[k, n]``, K x N):

* A *word* is one int32 of the packed tensor (KleidiAI: one byte); *nibble* i is its bits
  ``4i .. 4i+3``.
* ``mma.sync.m16n8k16`` B fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16", .f16/.bf16):
  the 16 x 8 (k x n) B operand is held by the 32 lanes of a warp, lane = ``4 * groupID +
  threadID_in_group``; lane ``(g, t)`` holds elements ``b0, b1 = (2t, g), (2t + 1, g)`` in its
  first .b32 register and ``b2, b3 = (2t + 8, g), (2t + 9, g)`` in its second (low half first).
  So element (k, n) of an aligned 16 x 8 block is ``b_i`` of lane ``4 * (n % 8) + (k % 8) // 2``
  with ``i = k % 2 + 2 * ((k % 16) // 8)``: register ``i // 2``, half ``i % 2``.
"""

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from . import reference

FORMATS = ("marlin", "awq", "kleidiai")


def mma_b_fragment(k: int, n: int) -> Dict[str, int]:
    """The m16n8k16 B-fragment slot of element (k, n) of a weight cut into aligned 16 x 8
    blocks: the block ``(k // 16, n // 8)``, the lane, ``i`` of ``b_i``, the .b32 register and
    its half (0 = low 16 bits)."""
    i = k % 2 + 2 * ((k % 16) // 8)
    return {"k_tile": k // 16, "n8_tile": n // 8, "lane": 4 * (n % 8) + (k % 8) // 2,
            "b": i, "register": i // 2, "half": i % 2}


@dataclass
class Location:
    """Where element (k, n) is stored and how a kernel consumes it."""

    fmt: str
    k: int
    n: int
    tensor: str  # the packed tensor's name
    shape: Tuple[int, ...]  # its shape (int32 words; KleidiAI: bytes)
    word: Tuple[int, ...]  # index of the word (byte) holding the element
    nibble: int  # 0..7 (KleidiAI: 0 low, 1 high)
    stored: str  # what the nibble holds
    consumer: Dict[str, int] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)


def _check(name, k, n, size_k, size_n):
    if not (0 <= k < size_k and 0 <= n < size_n):
        raise ValueError(f"layout {name}: element (k={k}, n={n}) is outside the K x N = "
                         f"{size_k} x {size_n} weight")


# ---- Marlin -----------------------------------------------------------------------------------

def _marlin_check(size_k, size_n):
    if size_k <= 0 or size_n <= 0 or size_k % 16 or size_n % 16 or (size_k * size_n) % 1024:
        raise ValueError(f"layout marlin: K = {size_k}, N = {size_n}: Marlin needs K and N "
                         f"multiples of 16 and K * N a multiple of 1024 (the kernels also need "
                         f"N % 64 == 0)")


@functools.lru_cache(maxsize=8)
def _marlin_row_position(size_n: int) -> torch.Tensor:
    """Position in its Marlin row (before the chunk permutation) of element ``(k % 16) * N + n``
    of a k-tile: :func:`reference.marlin_tile_rows` applied to the element indices."""
    row = reference.marlin_tile_rows(torch.arange(16 * size_n).reshape(16, size_n))[0]
    position = torch.empty_like(row)
    position[row] = torch.arange(row.numel())
    return position


@functools.lru_cache(maxsize=1)
def _marlin_perm_inverse() -> torch.Tensor:
    """Packed position p of chunk value i: the inverse of :func:`reference.marlin_weight_perm`."""
    perm = reference.marlin_weight_perm()
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    return inverse


def marlin_location(k: int, n: int, size_k: int, size_n: int) -> Location:
    """Element (k, n) in Marlin ``b_q_weight`` int32 ``[K/16, 2N]``.

    Row ``k // 16`` of the layout holds that k-tile's values in :func:`reference.marlin_tile_rows`
    order; the rows, concatenated, are cut into 1024-value chunks and packed position p of a
    chunk takes chunk value ``marlin_weight_perm()[p]``; position p is nibble ``p % 8`` of word
    ``p // 8``. Lane ``(p % 1024) // 32`` loads words ``4 lane .. 4 lane + 3`` of the chunk (one
    16-byte load), one per 16x16 tile, and decodes nibbles (0, 4) and (1, 5) into the B fragment
    of the tile's left n8 half, (2, 6) and (3, 7) into the right half (Marlin's lop3 dequant on
    ``q`` and ``q >> 8``).
    """
    _marlin_check(size_k, size_n)
    _check("marlin", k, n, size_k, size_n)
    # Only the element's k-tile row is laid out: rows are independent of each other.
    f = (k // 16) * 16 * size_n + int(_marlin_row_position(size_n)[(k % 16) * size_n + n])
    chunk, i = divmod(f, 1024)
    p = int(_marlin_perm_inverse()[i])
    word = divmod(chunk * 128 + p // 8, 2 * size_n)
    nibble = p % 8
    frag = mma_b_fragment(k, n)
    consumer = {"lane": p // 32, "load_word": (p % 32) // 8, **frag}
    consumer["lane_from_fragment"] = frag.pop("lane")
    consumer["n8_half"] = (nibble // 2) % 2
    notes = [f"source GPTQ qweight[{k // 8}, {n}] nibble {k % 8} (without act-order; with it, "
             f"Marlin row r holds GPTQ row perm[r]), or AutoAWQ qweight[{k}, {n // 8}] nibble "
             f"{reference.AWQ_NIBBLE[n % 8]}"]
    return Location("marlin", k, n, "b_q_weight", (size_k // 16, 2 * size_n), word, nibble,
                    "uint4 code (GPTQ: value + 8; AWQ: q, with its zero point apart)", consumer,
                    notes)


# ---- AutoAWQ ----------------------------------------------------------------------------------

def awq_location(k: int, n: int, size_k: int, size_n: int) -> Location:
    """Element (k, n) in AutoAWQ ``qweight`` int32 ``[K, N/8]``: word ``[k, n // 8]``, nibble
    ``AWQ_NIBBLE[n % 8]``. Consumer: this project's CUDA ``awq_gemm``
    (csrc/kernels/awq_gemm.cuh), which feeds mma.m16n8k16 straight from the words: lane
    ``(g, t)`` of a warp owns word column g of the warp's 8 (64 real columns) and rows 2t, 2t+1,
    2t+8, 2t+9 of each k16 step, and n8 tile j of the warp is nibble j of every lane's word."""
    if size_k <= 0 or size_n <= 0 or size_n % 8:
        raise ValueError(f"layout awq: K = {size_k}, N = {size_n}: AutoAWQ packs 8 columns per "
                         f"int32, so N must be a positive multiple of 8")
    _check("awq", k, n, size_k, size_n)
    nibble = reference.AWQ_NIBBLE[n % 8]
    i = k % 2 + 2 * ((k % 16) // 8)
    g, t = (n // 8) % 8, (k % 8) // 2
    consumer = {"warp_columns": n // 64, "k_tile": k // 16, "n8_tile_of_warp": nibble,
                "mma_column": g, "lane": 4 * g + t, "b": i, "register": i // 2, "half": i % 2}
    notes = [f"qzeros[g, {n // 8}] nibble {nibble} holds the zero point of column {n} (the same "
             f"nibble order); scales[g, {n}] its scale, g = k // group_size"]
    return Location("awq", k, n, "qweight", (size_k, size_n // 8), (k, n // 8), nibble,
                    "uint4 code q, w = (q - z) * s", consumer, notes)


# ---- KleidiAI ---------------------------------------------------------------------------------

def kleidiai_location(k: int, n: int, size_k: int, size_n: int, bl: int = 0, nr: int = 8,
                      kr: int = 16, sr: int = 2) -> Location:
    """Element (n, k) of the N x K RHS in a KleidiAI packed buffer (uint8): per-channel qsi4cxp
    (``bl = 0``) or per-block qsi4c32p (block length ``bl``); the same for the nxk and kxn
    packers (only the source differs). Byte offsets from ``reference._kai_weight_index`` and
    the block sizes of :data:`reference.KAI_LAYOUT`."""
    reference._kai_check_nr_kr_sr(nr, kr, sr)
    if size_k <= 0 or size_n <= 0:
        raise ValueError(f"layout kleidiai: K = {size_k}, N = {size_n}: need positive sizes")
    if bl and (bl % 32 or bl % kr or size_k % bl or nr % 4):
        raise ValueError(f"layout kleidiai: bl = {bl}: the per-block format needs bl a multiple "
                         f"of 32 and of kr = {kr} dividing K = {size_k}, and nr % 4 == 0")
    _check("kleidiai", k, n, size_k, size_n)
    k_i = reference._kai_roundup(size_k, 32)
    n_p = reference._kai_roundup(size_n, nr)
    seg = kr // sr
    if bl:
        area_k, area, kk = bl, k // bl, k % bl
        area_bytes = nr * bl // 2 + nr * 2  # weights, then nr bf16 scales
        block_bytes = area_bytes * (size_k // bl) + nr * 8  # + rsum f32, bias f32
        total = reference.rhs_packed_size_qsi4c32p(size_n, size_k, bl, nr, kr, sr)
        name = "rhs_packed qsi4c32p"
    else:
        area_k, area, kk = k_i, 0, k
        area_bytes = nr * k_i // 2
        block_bytes = nr * (k_i // 2 + 12)  # weights, rsum int32, scale f32, bias f32
        total = reference.rhs_packed_size_qsi4cxp(size_n, size_k, nr, kr, sr)
        name = "rhs_packed qsi4cxp"
    assert block_bytes * (n_p // nr) == total
    rows, k0 = reference._kai_weight_index(nr, kr, sr, area_k)
    high = (kk % 32) >= 16
    hit = ((rows == n % nr) & (k0 == kk - 16 * high)).nonzero()
    byte_in_area = int(hit)
    offset = (n // nr) * block_bytes + area * area_bytes + byte_in_area
    consumer = {"nr": nr, "nr_block": n // nr, "row_in_block": n % nr, "k_block": area,
                "segment": byte_in_area // seg, "byte_in_segment": byte_in_area % seg,
                "segment_bytes": seg}
    notes = [f"segment {byte_in_area // seg} of the block holds {seg} consecutive bytes of row "
             f"{n % nr}; k and k + 16 share a byte (low, high nibble)",
             "nibble = q ^ 8, the two's-complement int4 q - 8 (zero point 8)"]
    return Location("kleidiai", k, n, name, (total,), (offset,), int(high),
                    "int4 w = q - 8", consumer, notes)


def locate(fmt: str, k: int, n: int, size_k: int, size_n: int, **kw) -> Location:
    if fmt == "marlin":
        return marlin_location(k, n, size_k, size_n)
    if fmt == "awq":
        return awq_location(k, n, size_k, size_n)
    if fmt == "kleidiai":
        return kleidiai_location(k, n, size_k, size_n, **kw)
    raise ValueError(f"layout: format {fmt!r}, expected one of {', '.join(FORMATS)}")


def describe(loc: Location) -> str:
    """The CLI's lines for one element."""
    c = loc.consumer
    word = ", ".join(str(w) for w in loc.word)
    unit = "byte" if loc.fmt == "kleidiai" else "word"
    nib = (f"nibble {loc.nibble} ({'high' if loc.nibble else 'low'})" if loc.fmt == "kleidiai"
           else f"nibble {loc.nibble} (bits {4 * loc.nibble}-{4 * loc.nibble + 3})")
    lines = [f"(k={loc.k}, n={loc.n}): {loc.tensor}[{word}] {nib}   "
             f"[{unit} of {loc.tensor} {list(loc.shape)}; holds the {loc.stored}]"]
    if loc.fmt == "marlin":
        lines.append(
            f"  loaded by lane {c['lane']} (its 16-byte load of the chunk, word {c['load_word']} "
            f"of 4); mma.m16n8k16 B fragment of k-tile {c['k_tile']}, n8-tile {c['n8_tile']} "
            f"(columns {8 * c['n8_tile']}-{8 * c['n8_tile'] + 7}): lane "
            f"{c['lane_from_fragment']}, b{c['b']} = register {c['register']} "
            f"{'high' if c['half'] else 'low'} half")
    elif loc.fmt == "awq":
        lines.append(
            f"  awq_gemm: warp column block {c['warp_columns']} (columns "
            f"{64 * c['warp_columns']}-{64 * c['warp_columns'] + 63}), k-tile {c['k_tile']}, "
            f"mma.m16n8k16 n8-tile {c['n8_tile_of_warp']} of the warp, mma column "
            f"{c['mma_column']}: lane {c['lane']}, b{c['b']} = register {c['register']} "
            f"{'high' if c['half'] else 'low'} half")
    else:
        first = c["nr_block"] * c["nr"]
        lines.append(
            f"  nr-block {c['nr_block']} (rows {first}-{first + c['nr'] - 1}), row "
            f"{c['row_in_block']}, k-block {c['k_block']}, segment {c['segment']}, byte "
            f"{c['byte_in_segment']} of {c['segment_bytes']}")
    lines.extend(f"  {note}" for note in loc.notes)
    return "\n".join(lines)


# ---- tile maps ----------------------------------------------------------------------------------

def tile_map(fmt: str, size_k: int, size_n: int, k0: int = 0, n0: int = 0,
             rows: Optional[int] = None, cols: Optional[int] = None, **kw):
    """Locations of a ``rows x cols`` window of the weight starting at (k0, n0) (defaults: one
    Marlin chunk of 16 x 64, 16 x 64 for AWQ, nr x 32 for KleidiAI), as a list of rows."""
    default = {"marlin": (16, 64), "awq": (16, 64), "kleidiai": (kw.get("nr", 8), 32)}[fmt]
    _check(fmt, k0, n0, size_k, size_n)  # the window's first element
    rows = rows or default[0]
    cols = cols or default[1]
    if fmt == "kleidiai":  # the window is n (rows of the RHS) x k
        return [[locate(fmt, k0 + c, n0 + r, size_k, size_n, **kw) for c in range(cols)
                 if k0 + c < size_k] for r in range(rows) if n0 + r < size_n]
    return [[locate(fmt, k0 + r, n0 + c, size_k, size_n, **kw) for c in range(cols)
             if n0 + c < size_n] for r in range(rows) if k0 + r < size_k]


def _cell(fmt: str, loc: Location) -> int:
    """The number a map shows for one element: the consuming lane (Marlin, AWQ), or the byte
    within its nr-block's weight area (KleidiAI)."""
    if fmt == "kleidiai":
        c = loc.consumer
        return c["segment"] * c["segment_bytes"] + c["byte_in_segment"]
    return loc.consumer["lane"]


def format_map(fmt: str, window: List[List[Location]]) -> str:
    """Text map of a :func:`tile_map` window. Marlin / AWQ: rows k, columns n, cell = lane.
    KleidiAI: rows n, columns k, cell = byte of the nr-block's weight area + l/h nibble."""
    first = window[0][0]
    if fmt == "kleidiai":
        head = "n \\ k " + "".join(f"{loc.k:>5}" for loc in window[0])
        body = [f"{row[0].n:>6}" + "".join(
            f"{_cell(fmt, loc):>4}{'h' if loc.nibble else 'l'}" for loc in row)
            for row in window]
        what = "byte of the nr-block's weight area, l/h = low/high nibble"
    else:
        head = "k \\ n " + "".join(f"{loc.n:>3}" for loc in window[0])
        body = [f"{row[0].k:>6}" + "".join(f"{_cell(fmt, loc):>3}" for loc in row)
                for row in window]
        what = "consuming lane"
    return "\n".join([f"map from (k={first.k}, n={first.n}): {what}", head] + body)


def draw_map(fmt: str, window: List[List[Location]], path: str, title: str) -> None:
    """Draw a :func:`tile_map` window to ``path`` (PNG): cells coloured by the lane (Marlin,
    AWQ) or the segment (KleidiAI), labelled with lane / nibble or byte / nibble. Raises
    ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = len(window), len(window[0])
    if fmt == "kleidiai":
        values = [[loc.consumer["segment"] for loc in row] for row in window]
        labels = [[f"{_cell(fmt, loc)}{'h' if loc.nibble else 'l'}" for loc in row]
                  for row in window]
        ylabel, xlabel = "n (RHS row)", "k"
        yticks, xticks = [row[0].n for row in window], [loc.k for loc in window[0]]
    else:
        values = [[loc.consumer["lane"] for loc in row] for row in window]
        labels = [[f"{loc.consumer['lane']}\n{loc.nibble}" for loc in row] for row in window]
        ylabel, xlabel = "k", "n"
        yticks, xticks = [row[0].k for row in window], [loc.n for loc in window[0]]
    fig, ax = plt.subplots(figsize=(max(6.0, cols * 0.42), max(3.0, rows * 0.42)))
    ax.imshow(values, cmap="tab20" if fmt != "kleidiai" else "tab10", aspect="auto")
    for r in range(rows):
        for c in range(cols):
            ax.text(c, r, labels[r][c], ha="center", va="center", fontsize=5)
    ax.set_xticks(range(cols), xticks, fontsize=5)
    ax.set_yticks(range(rows), yticks, fontsize=5)
    # Tile boundaries: 16 x 16 tiles and their n8 halves (Marlin, AWQ), segments (KleidiAI).
    step = 8 if fmt != "kleidiai" else 16
    for c in range(step, cols, step):
        ax.axvline(c - 0.5, color="black", linewidth=0.5 if c % 16 else 1.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    legend = ("cell: consuming lane / nibble of its word" if fmt != "kleidiai"
              else "cell: byte of the nr-block's weight area, l/h nibble; colour: segment")
    ax.set_title(f"{title}\n{legend}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
