"""Markdown report of benchmark medians."""

from __future__ import annotations

import argparse
import os
import platform
from statistics import median

from loadgen import WrkResult, threads_for

Results = dict[tuple[str, int], list[WrkResult]]


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.1%}" if base else "–"


def _medians(runs: list[WrkResult]) -> tuple[float, float, float, int]:
    return (median(r.rps for r in runs), median(r.p50_ms for r in runs), median(r.p99_ms for r in runs),
            sum(r.errors for r in runs))


def render(results: Results, names: list[str], args: argparse.Namespace, reference: str | None,
           notes: list[str], elapsed_s: float) -> str:
    conc = args.concurrency
    med = {key: _medians(runs) for key, runs in results.items()}
    lines = [
        "## Tollhouse benchmark",
        "",
        f"wrk `tools/call` POSTs, {args.duration:g} s per run, medians of {args.rounds} interleaved rounds "
        f"after a {args.warmup:g} s warm-up; wrk threads: "
        + ", ".join(f"{threads_for(c)} at c={c}" for c in conc)
        + f". Pass-through loop: {args.loop}, body {'streamed' if args.stream else 'buffered'}; "
        f"pinning: {'server under test on CPU 1, stub + wrk on CPU 0' if args.pin else 'none'}. "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; took {elapsed_s:.0f} s.",
        "",
        "| target | c | req/s | p50 ms | p99 ms | errors | vs stub | vs pass-through |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        for c in conc:
            if (name, c) not in med:
                continue
            rps, p50, p99, errors = med[(name, c)]
            stub = med.get(("stub", c), (None,))[0] if name != "stub" else None
            ref = med.get((reference, c), (None,))[0] if reference and name not in ("stub", reference) else None
            lines.append(f"| {name} | {c} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {errors} | "
                         f"{_ratio(rps, stub)} | {_ratio(rps, ref)} |")
    lines += _tollhouse_summary(med, conc, reference)
    if notes:
        lines += ["", "Notes:", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def _tollhouse_summary(med: dict[tuple[str, int], tuple[float, float, float, int]], conc: list[int],
                       reference: str | None) -> list[str]:
    if not any(name == "tollhouse" for name, _ in med):
        return []
    out = ["", "Tollhouse:"]
    for c in conc:
        toll = med.get(("tollhouse", c))
        if toll is None:
            continue
        parts = [f"c={c}: {toll[0]:,.0f} req/s"]
        if ("stub", c) in med:
            parts.append(f"{toll[0] / med[('stub', c)][0]:.1%} of the stub")
        if reference and (reference, c) in med:
            parts.append(f"{toll[0] / med[(reference, c)][0]:.1%} of {reference}")
        if ("tollhouse-compare", c) in med:
            parts.append(f"{toll[0] / med[('tollhouse-compare', c)][0]:.1%} of tollhouse-compare")
        out.append("- " + ", ".join(parts))
    c1 = med.get(("tollhouse", 1))
    if c1 and ("stub", 1) in med:
        line = f"- added p50 at c=1: {c1[1] - med[('stub', 1)][1]:+.2f} ms over the stub"
        if reference and (reference, 1) in med:
            line += f", {c1[1] - med[(reference, 1)][1]:+.2f} ms over {reference}"
        out.append(line)
    return out
