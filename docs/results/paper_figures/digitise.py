"""Read the 75 window values of each curve off the authors' Permuted-MNIST figures (Figure 1 a/b, Figure 4 left).

The PNGs are the authors' (gauthambekal93/query-only-attention-for-continual-learning,
comparisons/Experiment_Results/permuted_mnist_{forward_performance,backward_performance,forward_effective_rank}_
averaged.png, 550 x 280 pixels). Extract them next to this file, then:

    python docs/results/paper_figures/digitise.py /tmp/dig

Method: the axes are calibrated from the tick marks (one-pixel dark marks outside the left and bottom spines; a
least-squares line from tick pixel to tick value on each axis). Each curve is found by its matplotlib colour (BP
red, CBP blue, full attention ("Transformer") dark green, QOA V1 black, QOA V2 brown, MAML orange): in the pixel
column of window w the pixels holding the curve's colour are averaged, weighted by how much of it they hold
(:func:`column_row`); a fractional column is interpolated between its two neighbours.
Where another curve is drawn over it (no pixel of its colour in that column), the value is interpolated between the
nearest windows read and flagged. Prints YAML-ready lists, and the count of interpolated windows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {  # matplotlib's named colours as drawn (the legend's line samples)
    "bp": (255, 0, 0),
    "cbp": (0, 0, 255),
    "full_attention": (0, 100, 0),
    "qoa_v1": (0, 0, 0),
    "qoa_v2": (165, 42, 42),
    "maml": (255, 165, 0),
}
FIGURES = {  # name: (file stem, y tick values top to bottom, legend rows to ignore)
    "forward": ("permuted_mnist_forward_performance_averaged", [90, 80, 70, 60, 50, 40, 30, 20, 10]),
    "backward": ("permuted_mnist_backward_performance_averaged", [80, 60, 40, 20]),
    "effective_rank": ("permuted_mnist_forward_effective_rank_averaged", [4, 2, 0, -2, -4]),
}
X_TICKS = [0, 10, 20, 30, 40, 50, 60, 70]
WINDOWS = 75
MAX_JUMP = 12  # pixels: a run further than this from the window before is another curve's blend, not this one


def frame(img: np.ndarray) -> tuple[int, int, int, int]:
    """The axes box (left, right, top, bottom pixel) from its dark spines."""
    dark = img.max(-1) < 90
    cols, rows = np.argsort(-dark.sum(0))[:2], np.argsort(-dark.sum(1))[:2]
    return int(cols.min()), int(cols.max()), int(rows.min()), int(rows.max())


def ticks(img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel rows of the y ticks and columns of the x ticks (dark marks just outside the spines)."""
    left, right, top, bottom = frame(img)
    grey = img.mean(-1)
    ys = [r for r in range(top, bottom + 2) if grey[r, left - 2] < 195]
    xs = [c for c in range(left, right + 2) if grey[bottom + 2, c] < 195]
    return np.array(ys, float), np.array(xs, float)


def calibrate(pixels: np.ndarray, values: list[float]) -> tuple[np.poly1d, float]:
    """Pixel -> value by least squares, and the largest tick residual in value units."""
    fit = np.poly1d(np.polyfit(pixels, values, 1))
    return fit, float(np.abs(fit(pixels) - np.array(values)).max())


def legend_rows(img: np.ndarray, left: int, right: int, top: int, bottom: int) -> tuple[int, int, int, int]:
    """The legend box (its light grey frame), to ignore: (row0, row1, col0, col1)."""
    grey = img.mean(-1)
    edge = (grey > 190) & (grey < 235) & (np.ptp(img, axis=-1) < 10)
    rows = [r for r in range(top + 1, bottom) if edge[r, left + 1 : right].sum() > 0.6 * (right - left)]
    if not rows:
        return (0, 0, 0, 0)
    r0, r1 = min(rows), max(rows)
    cols = [c for c in range(left + 1, right) if edge[r0 + 1 : r1, c].sum() > 0.8 * (r1 - r0 - 1)]
    return r0, r1, min(cols), max(cols)


def column_row(
    img: np.ndarray,
    col: int,
    colour: tuple[int, int, int],
    rows: range,
    skip: range,
    near: float | None,
    limit: float | None = None,
) -> float | None:
    """The mean row of ``colour`` in one pixel column, weighted by how much of the colour each pixel holds (None: not
    there). A pixel is taken as ``a * colour + (1 - a) * white`` (antialiasing over a white or light background):
    ``a`` by least squares, kept where ``a >= 0.35`` and the pixel lies within 35 of that mixture (black: grey pixels
    only). The kept pixels fall in runs of adjacent rows; the run nearest ``near`` (the curve's row one window before)
    is the curve, unless it is more than ``limit`` pixels away (``MAX_JUMP`` plus the slope of the
    last two readings times the gap);
    the heaviest run when there is no window before."""
    pix = img[rows.start : rows.stop, col].astype(float)
    white, c = np.full(3, 255.0), np.array(colour, float)
    d = white - c
    a = ((white - pix) @ d) / (d @ d)
    resid = np.sqrt((((white - a[:, None] * d) - pix) ** 2).sum(-1))
    weight = np.where((a >= 0.35) & (resid < 35), np.clip(a, 0, 1), 0.0)
    idx = np.arange(rows.start, rows.stop)
    weight[(idx >= skip.start) & (idx < skip.stop)] = 0
    if colour == (0, 0, 0):
        weight[np.ptp(pix, axis=-1) >= 25] = 0
    kept = np.flatnonzero(weight > 0)
    if not kept.size:
        return None
    runs = np.split(kept, np.flatnonzero(np.diff(kept) > 2) + 1)
    centres = [(float((weight[r] * idx[r]).sum() / weight[r].sum()), float(weight[r].sum())) for r in runs]
    centres = [c for c in centres if c[1] >= 0.35]
    if not centres:
        return None
    if near is None:
        return max(centres, key=lambda c: c[1])[0]
    row = min(centres, key=lambda c: abs(c[0] - near))[0]
    return row if limit is None or abs(row - near) <= limit else None


def read(folder: Path, name: str) -> dict[str, object]:
    """Every curve of one figure at the 75 windows."""
    stem, yvals = FIGURES[name]
    img = np.array(Image.open(folder / f"{stem}.png").convert("RGB")).astype(int)
    left, right, top, bottom = frame(img)
    ys, xs = ticks(img)
    to_value, y_err = calibrate(ys, yvals)
    to_col, _ = calibrate(np.array(X_TICKS, float), list(xs))  # window -> column
    r0, r1, c0, c1 = legend_rows(img, left, right, top, bottom)
    out: dict[str, object] = {"y_per_pixel": float(abs(to_value(1) - to_value(0))), "tick_residual": y_err}
    for curve, colour in COLOURS.items():
        values, missing, seen = [], [], []  # seen: (window, row) read so far
        for w in range(WINDOWS):
            near, limit = (seen[-1][1], None) if seen else (None, None)
            if len(seen) >= 2:  # near the last reading, by MAX_JUMP and the recent slope over the gap
                (w1, y1), (w2, y2) = seen[-2], seen[-1]
                limit = MAX_JUMP + abs(y2 - y1) / (w2 - w1) * (w - w2)
            x = float(to_col(w))
            lo, frac = int(np.floor(x)), x - np.floor(x)
            got = []
            for col, wt in ((lo, 1 - frac), (lo + 1, frac)):
                skip = range(r0, r1 + 1) if c0 <= col <= c1 else range(0)
                row = column_row(img, col, colour, range(top + 2, bottom - 1), skip, near, limit)
                if row is not None:
                    got.append((row, wt))
            if not got:
                values.append(np.nan)
                missing.append(w)
                continue
            row = sum(r * wt for r, wt in got) / sum(wt for _, wt in got)
            seen.append((w, row))
            values.append(float(to_value(row)))
        arr = np.array(values)
        if np.isnan(arr).all():
            continue
        known = ~np.isnan(arr)
        arr[~known] = np.interp(np.flatnonzero(~known), np.flatnonzero(known), arr[known])
        out[curve] = {"values": arr.tolist(), "interpolated": missing}
    return out


def main() -> None:
    """Print every figure's readings."""
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for name in FIGURES:
        res = read(folder, name)
        print(f"# {name}: {res['y_per_pixel']:.3f} per pixel, tick residual {res['tick_residual']:.3f}")
        for curve in COLOURS:
            if curve in res:
                r = res[curve]
                scale = 100 if name != "effective_rank" else 1
                vals = ", ".join(f"{v / scale:.3f}" for v in r["values"])
                print(f"{name}.{curve}: [{vals}]  # interpolated at {r['interpolated']}")


if __name__ == "__main__":
    main()
