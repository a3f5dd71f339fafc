"""Markdown report of benchmark medians."""

from __future__ import annotations

import argparse
import os
import platform
from itertools import pairwise
from statistics import median

from loadgen import WrkResult, threads_for

Results = dict[tuple[str, int], list[WrkResult]]


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.1%}" if base else "–"


def _medians(runs: list[WrkResult]) -> tuple[float, float, float, int]:
    return (median(r.rps for r in runs), median(r.p50_ms for r in runs), median(r.p99_ms for r in runs),
            sum(r.errors for r in runs))


def _cpu(runs: list[WrkResult], attr: str) -> float | None:
    """Median CPU ms per call of one kind over the runs that have it."""
    values = [v for v in (getattr(r, attr) for r in runs) if v is not None]
    return median(values) if values else None


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "–"


def render(results: Results, names: list[str], args: argparse.Namespace, reference: str | None,
           notes: list[str], elapsed_s: float, pairs: list[tuple[str, str, str]] | None = None) -> str:
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
        ("CPU: utime + stime from /proc, before and after each run, divided by its calls (medians): "
        "the target's own processes (all gateway workers or replicas), the load balancer in front "
        "of it, and the Redis server."),
        "",
        ("| target | c | req/s | p50 ms | p99 ms | errors | vs stub | vs pass-through "
        "| CPU ms/call | LB ms/call | Redis ms/call |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        for c in conc:
            if (name, c) not in med:
                continue
            rps, p50, p99, errors = med[(name, c)]
            stub = med.get(("stub", c), (None,))[0] if name != "stub" else None
            ref = med.get((reference, c), (None,))[0] if reference and name not in ("stub", reference) else None
            runs = results[(name, c)]
            lines.append(f"| {name} | {c} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {errors} | "
                         f"{_ratio(rps, stub)} | {_ratio(rps, ref)} | {_ms(_cpu(runs, 'cpu_ms'))} | "
                         f"{_ms(_cpu(runs, 'lb_cpu_ms'))} | {_ms(_cpu(runs, 'redis_cpu_ms'))} |")
    lines += _tollhouse_summary(med, conc, reference)
    lines += _side_by_side(results, med, conc, pairs or [])
    lines += _concurrency_steps(results, names, conc, getattr(args, "order", "concurrency"))
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


def _side_by_side(results: Results, med: dict[tuple[str, int], tuple[float, float, float, int]],
                  conc: list[int], pairs: list[tuple[str, str, str]]) -> list[str]:
    """Each pair measured in the same rounds: the other as a ratio of (or added to) the base."""
    rows = []
    for label, base, other in pairs:
        for c in conc:
            if (base, c) not in med or (other, c) not in med:
                continue
            (b_rps, b_p50, b_p99, _), (o_rps, o_p50, o_p99, _) = med[(base, c)], med[(other, c)]
            b_cpu, o_cpu = _cpu(results[(base, c)], "cpu_ms"), _cpu(results[(other, c)], "cpu_ms")
            o_lb = _cpu(results[(other, c)], "lb_cpu_ms")
            cpu_delta = f"{o_cpu / b_cpu - 1:+.1%}" if b_cpu and o_cpu is not None else "–"
            rows.append(f"| {label}: {other} vs {base} | {c} | {b_rps:,.0f} → {o_rps:,.0f} | "
                        f"{_ratio(o_rps, b_rps)} | "
                        f"{_paired(results[(base, c)], results[(other, c)])} | "
                        f"{b_p50:.2f} → {o_p50:.2f} ({o_p50 - b_p50:+.2f}) | "
                        f"{b_p99:.2f} → {o_p99:.2f} | {_ms(b_cpu)} → {_ms(o_cpu)} ({cpu_delta}) | "
                        f"{_ms(o_lb)} |")
    if not rows:
        return []
    return ["", ("Side by side (same interleaved rounds, medians; \"by round\": the median of each "
            "round's own ratio, req/s then CPU a call, with the rounds' range of req/s):"), "",
            ("| comparison | c | req/s | ratio | by round | p50 ms (Δ) | p99 ms "
             "| gateway CPU ms/call (Δ) | + LB ms/call |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|", *rows]


def _paired(base: list[WrkResult], other: list[WrkResult]) -> str:
    """The ratio of each round's two runs (run seconds apart: a slow spell of the machine
    that spans both cancels out), its median and range over the rounds, then the CPU's."""
    rps = [o.rps / b.rps for b, o in zip(base, other, strict=False) if b.rps]
    cpu = [o.cpu_ms / b.cpu_ms for b, o in zip(base, other, strict=False)
           if b.cpu_ms and o.cpu_ms is not None]
    if not rps:
        return "–"
    text = f"{median(rps):.1%} ({min(rps):.0%}–{max(rps):.0%})"
    return text + (f"; {median(cpu):.2f} x" if cpu else "")


def _concurrency_steps(results: Results, names: list[str], conc: list[int], order: str
                       ) -> list[str]:
    """How each target's throughput holds from one concurrency to the next (above 1), as a
    ratio of the medians and of each round's own two runs."""
    steps = [(lo, hi) for lo, hi in pairwise(conc) if lo > 1]
    rows = []
    for name in names:
        for lo, hi in steps:
            if (name, lo) not in results or (name, hi) not in results:
                continue
            base, other = results[(name, lo)], results[(name, hi)]
            lo_rps, hi_rps = _medians(base)[0], _medians(other)[0]
            rows.append(f"| {name} | {lo} → {hi} | {lo_rps:,.0f} → {hi_rps:,.0f} | "
                        f"{_ratio(hi_rps, lo_rps)} | {_paired(base, other)} |")
    if not rows:
        return []
    apart = ("seconds apart (--order target)" if order == "target"
             else "a whole round's sweep of the targets apart (--order target sets them side by side)")
    return ["", (f"From one concurrency to the next, per target (each round's two runs {apart}; "
                 "\"by round\": the median of each round's own ratio, req/s then CPU a call):"), "",
            "| target | c | req/s | ratio | by round |", "|---|---:|---:|---:|---:|", *rows]
