"""The break-even chart of the docs: PODS pays in wall-clock time where its learning per update beats its step-time
ratio. Each point is a measured study under benchmarks/results/cpu-2core-amd-epyc/ (one method against its study's
GRPO baseline); the diagonal is break-even.

    python benchmarks/plot_break_even.py            # writes docs/results/img/break_even.png

Read from each study's study.json:
- `pods study` studies (evidence/shipped, adaptive_quiet, adaptive_strong): the headline's learning per update (the
  evidence study's interpolated between evaluations, as its page quotes it) and the step-time ratio the runs logged;
- the older script's studies (study600, study_strong): updates to GRPO's peak (`comparisons["steps/peak"]`) and the
  methods' step ratio.
Both with their 95% bootstrap CIs over seeds. Random-selection controls are left out (they are not PODS).
The paper's single-GPU step-time ratios (Qwen2.5-3B with vLLM, 1.04 at 32 -> 16, 1.33 at 64 -> 16) are drawn as
reference lines, labelled as the paper's: no GPU was measured here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "cpu-2core-amd-epyc"
OUT = ROOT / "docs" / "results" / "img" / "break_even.png"

# (folder, legend name, {method label: short name}); the order is the legend's.
STUDIES = [
    ("evidence/shipped", "evidence study, shipped model (32 seeds x 300)",
     {"pods-mv-n32m8": "PODS 32->8", "pods-mv-n32m8-pilot8c": "adaptive"}),
    ("adaptive_quiet", "adaptive study, shipped model (8 seeds x 120)",
     {"pods-mv-n32m8": "PODS 32->8", "pods-mv-n32m8-pilot8c": "adaptive"}),
    ("adaptive_strong", "adaptive study, strong model (6 seeds x 300)",
     {"pods-mv-n64m16": "PODS 64->16", "pods-mv-n64m16-pilot16c": "adaptive",
      "pods-mv-n64m16-pilot32c": "adaptive, pilot 32", "pods-mv-n64m16-b24c": "budgeted"}),
    ("study600", "evidence study, model before #24 (8 seeds x 600)",
     {"pods-mv-n32m16": "PODS 32->16", "pods-mv-n64m16": "PODS 64->16"}),
    ("study_strong", "high-accuracy regime, before #24 (8 seeds x 300)",
     {"pods-mv-n64m16": "PODS 64->16"}),
]
PAPER_RATIOS = {"paper, 1 GPU, 32->16": 1.04, "paper, 1 GPU, 64->16": 1.33}


def points() -> list[dict]:
    """One dict per (study, method): study, method, learning (value, low, high), ratio (value, low, high)."""
    found = []
    for folder, study_name, methods in STUDIES:
        data = json.loads((RESULTS / folder / "study.json").read_text())
        for label, method in methods.items():
            if data.get("headline"):
                head = data["headline"][label]
                interpolated = data["study"].get("comparisons_interpolated")
                if interpolated:
                    entry = interpolated["steps/peak"]["labels"][label]
                    learning = (entry["speedup"], *entry["speedup_ci95"])
                else:
                    learning = (head["learning_per_update"]["value"], *head["learning_per_update"]["ci95"])
                ratio = (head["step_time_ratio"]["value"], *head["step_time_ratio"]["ci95"])
            else:
                entry = data["study"]["comparisons"]["steps/peak"]["labels"][label]
                learning = (entry["speedup"], *entry["speedup_ci95"])
                method_data = data["study"]["methods"][label]
                ratio = (method_data["step_ratio"], *method_data["step_ratio_ci95"])
            found.append({"folder": folder, "study": study_name, "method": method, "learning": learning,
                          "ratio": ratio})
    return found


def draw(out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = points()
    fig, ax = plt.subplots(figsize=(8.2, 6.6), dpi=110)
    low, high = 0.8, 2.1
    ax.fill_between([low, high], [low, high], [high, high], color="#2e7d32", alpha=0.07, linewidth=0)
    ax.fill_between([low, high], [low, low], [low, high], color="#c62828", alpha=0.06, linewidth=0)
    ax.plot([low, high], [low, high], color="black", linewidth=1.2)
    ax.text(0.83, 2.06, "PODS pays:\nlearning per update > step-time ratio", color="#2e7d32", fontsize=9, va="top")
    ax.text(2.07, 0.83, "PODS costs wall-clock time:\nlearning per update < step-time ratio", color="#c62828",
            fontsize=9, ha="right")
    ax.text(1.83, 1.87, "break-even", rotation=35, fontsize=8, ha="center", va="bottom")
    for name, value in PAPER_RATIOS.items():
        ax.axvline(value, color="grey", linestyle=":", linewidth=1)
        ax.text(value + 0.01, 0.82, name, rotation=90, fontsize=7, color="grey", va="bottom")
    colors = ["#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#558b2f"]
    markers = {"adaptive": "^", "budgeted": "v", "adaptive, pilot 32": "^"}
    for color, (folder, study_name, _) in zip(colors, STUDIES):
        first = True
        for point in (p for p in data if p["folder"] == folder):
            (x, x_low, x_high), (y, y_low, y_high) = point["ratio"], point["learning"]
            ax.errorbar(x, y, xerr=[[x - x_low], [x_high - x]], yerr=[[y - y_low], [y_high - y]], color=color,
                        marker=markers.get(point["method"], "o"), markersize=6, capsize=2, linewidth=1,
                        label=study_name if first else None)
            left = point["method"] == "adaptive, pilot 32"  # beside the strong model's other adaptive point
            ax.annotate(point["method"], (x, y), textcoords="offset points", xytext=(-5, -11) if left else (5, 4),
                        ha="right" if left else "left", fontsize=7, color=color)
            first = False
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("step-time ratio: seconds per update, PODS / GRPO (measured, 2-core CPU)")
    ax.set_ylabel("learning per update: updates GRPO needs / PODS needs\n(to GRPO's peak accuracy)")
    ax.set_title("When PODS pays: measured studies against the break-even line (95% CIs over seeds)", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    ax.grid(alpha=0.2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})  # no version stamp: the same data gives the same file
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the PNG to write (default: {OUT.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    print(draw(args.out))
    for point in points():
        print(f"{point['folder']:>18} {point['method']:<18} learning {point['learning'][0]:.2f} "
              f"ratio {point['ratio'][0]:.2f}")


if __name__ == "__main__":
    main()
