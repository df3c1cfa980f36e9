"""The load's Markdown: one table per run (per RPC), its process figures, the scaling rows and
their targets, the SDK anchor; and the block of docs/benchmarks.md it rewrites (`--update-docs`),
between markers of its own, as benchmarks/docs.py does for `make bench`."""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.common import Report, Target, fmt_kb, fmt_ratio, fmt_time, ratio_target
from benchmarks.docs import DOC
from benchmarks.load.analysis import FAULTS

# Each kind of run keeps a block of its own: one server, two replicas, the scaling rows.
BLOCKS = ("one-server", "replicas", "scaling")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- load:{name}:begin -->", f"<!-- load:{name}:end -->"


MAX_GROWTH = 1.5  # issue 41, item 3: CPU per call and the no-CLI p99, 1,000 sessions over 50


def _errors(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in errors.items()) or "-"


def _trend(row: Mapping[str, Any]) -> str:
    early, late = row["p50_first_third"], row["p50_last_third"]
    if math.isnan(early) or math.isnan(late):
        return "-"
    return f"{fmt_time(early)} → {fmt_time(late)}"


def _title(a: Mapping[str, Any]) -> str:
    o = a["options"]
    where = "one server" if o["replicas"] == 1 else f"{o['replicas']} replicas on PostgreSQL"
    if o.get("rate"):
        offered = f", {o['rate']:g} calls/s offered"
    elif o.get("think"):
        offered = f", a mean {o['think']:g} s between a loop's calls"
    else:
        offered = ", closed loops"
    return (
        f"{o['sessions']:,} sessions of {o['principals']} principals, {where}, --max-live-sessions "
        f"{o['max_live']}, {o['watchers']} watchers{offered}, {a['window_s']:.0f} s"
    )


def run_report(a: Mapping[str, Any], title: str = "") -> Report:
    report = Report(
        title or _title(a),
        ["RPC", "calls", "calls/s", "p50", "p99", "errors (status/reason)", "p50 first → last third"],
    )
    for rpc, row in a["rpcs"].items():
        report.rows.append(
            [
                rpc,
                f"{row['calls']:,}",
                f"{row['calls_per_s']:.1f}",
                fmt_time(row["p50"]),
                fmt_time(row["p99"]),
                _errors(row["errors"]),
                _trend(row),
            ]
        )
        for mode, sub in row.get("by_mode", {}).items():
            report.rows.append(
                [
                    f"  {mode}",
                    f"{sub['calls']:,}",
                    f"{sub['calls_per_s']:.1f}",
                    fmt_time(sub["p50"]),
                    fmt_time(sub["p99"]),
                    _errors(sub["errors"]),
                    _trend(sub),
                ]
            )
    report.rows.append(
        [
            "all",
            f"{a['calls']:,}",
            f"{a['calls_per_s']:.1f}",
            "",
            "",
            _errors(a["errors"]),
            "",
        ]
    )
    cli, cpu, server, ev, nc = a["cli"], a["cpu"], a["server"], a["events"], a["no_cli"]
    c = a["consistency"]
    report.targets = [
        Target(
            "the consistency check: every session's points, last message and files as its model says",
            c["passed"],
            f"{c['violations']} violations; checked {_counts(c['checked'])}; events: {ev['missing']} missing, "
            f"{ev['duplicates']} duplicated, {ev['out_of_order']} out of order",
        ),
        Target(
            f"no {' or '.join(FAULTS)}",
            a["faults"] == 0 and a["faults_metrics"] == 0,
            f"{a['faults']} answered to the clients, {a['faults_metrics']:.0f} counted by the servers",
        ),
        Target(
            "CLI processes alive at most the bound",
            cli["peak_alive"] <= cli["bound"],
            f"peak {cli['peak_alive']} (sampled each second), bound {cli['bound']}",
        ),
    ]
    report.infos = [
        f"calls answered OK: {a['ok']:,}, {a['ok_per_s']:.1f}/s; LIVE_SESSIONS_EXHAUSTED (back-pressure, "
        f"retried with backoff): {a['backpressure']:,}; a Prompt from its first attempt to its answer: "
        f"p50 {fmt_time(a['prompt_wait']['p50'])}, p99 {fmt_time(a['prompt_wait']['p99'])}",
        f"CPU per call: {fmt_time(cpu['server_per_call_s'])} of the server processes' own "
        f"({cpu['server_s']:.1f} s over the window, over every call; per call answered OK "
        f"{fmt_time(cpu['server_per_ok_s'])}); CLI processes that exited in it {cpu['exited_clis_s']:.1f} s; "
        f"the client processes {cpu['clients_s']:.1f} s",
        _parts(a["prompt_parts"]),
        f"the servers' event loops (main threads) over the window: ran {server['event_loop']['ran_s']:.1f} s, "
        f"runnable but waiting for a CPU {server['event_loop']['waited_for_cpu_s']:.1f} s",
        f"CLI processes started: {cli['starts']:.0f}, {cli['starts_per_min']:.1f}/min; by RPC "
        f"{_counts(cli['starts_by_rpc'])}; a start took p50 {cli['start_ms']['p50']:.0f} ms, "
        f"p99 {cli['start_ms']['p99']:.0f} ms",
        f"calls that start no CLI (ListRewindPoints, GetSession, DryRun with no CLI start of its session, "
        f"{nc['dry_runs_without_cli']:,} of {nc['dry_runs']:,}): {nc['calls']:,}, p50 {fmt_time(nc['p50'])}, "
        f"p99 {fmt_time(nc['p99'])}; the floor, a GetCapabilities four times a second: p50 "
        f"{fmt_time(a['floor']['p50'])}, p99 {fmt_time(a['floor']['p99'])}; the machine's CPU busy "
        f"{a['machine_busy']:.0%} of the window",
        f"peak resident memory: the server processes {fmt_kb(server['peak_rss_kb'])} (VmHWM "
        f"{fmt_kb(server['hwm_kb'])}), every CLI process at once {fmt_kb(cli['peak_rss_kb'])} "
        f"({cli['peak_alive']} alive at most)",
        f"watchers: {ev['watchers']}, {ev['events_made']:,} events made, {ev['receipts']:,} receipts, from the "
        f"call's return to receipt p50 {fmt_time(ev['lag_p50'])}, p99 {fmt_time(ev['lag_p99'])}; "
        f"stream errors {_counts(ev['stream_errors'])}",
        f"left after the run (3 s after the checks): CLI processes {server['settled']['cli_alive']}, slots held "
        f"{server['settled']['slots_held']:.0f}, watchers {server['settled']['watchers']:.0f}; server RSS "
        f"{_span(server['rss_kb'], fmt_kb)}, open files {_span(server['open_files'], str)}, threads "
        f"{_span(server['threads'], str)} (window start → end → settled); open files grown by kind "
        f"{_counts(server['open_files_grown'])}",
    ]
    report.seconds = a["window_s"]
    if a["options"].get("cli_nice") is not None:
        report.notes.append(
            f"the servers ran with --cli-nice {a['options']['cli_nice']} (their default is 10)"
        )
    report.notes += [
        f"set-up (untimed): {a['sessions_made']:,} sessions made in all, {a['setup_s']:.0f} s to create the "
        f"first {a['options']['sessions']:,} with {a['options']['warmup_turns']} turns each",
    ]
    return report


def _parts(parts: Mapping[str, Any]) -> str:
    def both(key: str) -> str:
        return f"p50 {fmt_time(parts[key]['p50'])}, p99 {fmt_time(parts[key]['p99'])}"

    return (
        f"a Prompt answered OK that started a CLI process ({parts['with_cli_start']:,}): before the start "
        f"(a live slot) {both('before_start')}; the start {both('start')}; after it (the turn) {both('after_start')}"
    )


def _counts(counts: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in counts.items()) or "-"


def _span(values: Mapping[str, Any], fmt: Any) -> str:
    return f"{fmt(values['before'])} → {fmt(values['after'])} → {fmt(values['settled'])}"


def scaling_report(runs: Sequence[Mapping[str, Any]], anchor: Mapping[str, Any] | None) -> Report:
    report = Report(
        "Scaling: the same mix at each number of sessions",
        [
            "sessions",
            "calls/s answered",
            "CPU per call",
            "no-CLI calls p99",
            "Prompt p50 / p99",
            "CLI starts/min",
            "LIVE_SESSIONS_EXHAUSTED",
            "INTERNAL / UNKNOWN",
            "consistent",
        ],
    )
    for a in runs:
        prompt = a["rpcs"].get("Prompt", {})
        report.rows.append(
            [
                f"{a['options']['sessions']:,}",
                f"{a['ok_per_s']:.1f}",
                fmt_time(a["cpu"]["server_per_call_s"]),
                fmt_time(a["no_cli"]["p99"]),
                f"{fmt_time(prompt.get('p50', math.nan))} / {fmt_time(prompt.get('p99', math.nan))}",
                f"{a['cli']['starts_per_min']:.0f}",
                f"{a['backpressure']:,}",
                f"{a['faults']}",
                "yes" if a["consistency"]["passed"] else "NO",
            ]
        )
    small, large = runs[0], runs[-1]
    n0, n1 = small["options"]["sessions"], large["options"]["sessions"]
    report.seconds = sum(a["window_s"] for a in runs)
    report.targets = [
        ratio_target(
            f"CPU per call, {n1:,} sessions / {n0:,}",
            large["cpu"]["server_per_call_s"],
            small["cpu"]["server_per_call_s"],
            at_most=MAX_GROWTH,
        ),
        ratio_target(
            f"p99 of the calls that start no CLI, {n1:,} sessions / {n0:,}",
            large["no_cli"]["p99"],
            small["no_cli"]["p99"],
            at_most=MAX_GROWTH,
        ),
        Target(
            "no INTERNAL or UNKNOWN at any size",
            all(a["faults"] == 0 and a["faults_metrics"] == 0 for a in runs),
            ", ".join(f"{a['options']['sessions']:,}: {a['faults']}" for a in runs),
        ),
        Target(
            "the consistency check passed at every size",
            all(a["consistency"]["passed"] for a in runs),
            ", ".join(
                f"{a['options']['sessions']:,}: {a['consistency']['violations']} violations" for a in runs
            ),
        ),
    ]
    if anchor is not None:
        sdk = {row["key"]: row for row in anchor["rows"]}
        for a in runs:
            prompt = a["rpcs"].get("Prompt", {}).get("p50", math.nan)
            for key, how in (("resumed", "resuming a session per prompt"), ("live", "kept live")):
                if key in sdk:
                    report.infos.append(
                        f"Prompt p50 at {a['options']['sessions']:,} sessions, the service / the SDK {how} at the "
                        f"same {anchor['clients']} clients at once: {fmt_time(prompt)} / {fmt_time(sdk[key]['p50'])} "
                        f"= {fmt_ratio(prompt / sdk[key]['p50'])}"
                    )
    rate = small["options"].get("rate") or 0
    if rate:
        report.notes.append(
            f"offered: {rate:g} calls/s in all at every size (each session's loop thinks a mean of "
            f"sessions/{rate:g} s between its calls), so what grows from row to row is the number of sessions"
        )
    report.notes += [
        "CPU per call: the server processes' own user + system time over the window, over every call they "
        "answered (a back-pressure refusal is a call: it costs the servers a slot check, and more)",
        "no-CLI calls: ListRewindPoints, GetSession, and each DryRun during which no CLI process of its session "
        "started (the servers' logs)",
    ]
    return report


def block(name: str, reports: Sequence[Report], facts: Mapping[str, str], summary: str) -> str:
    shown: list[str] = []
    argv = iter(sys.argv[1:])
    for arg in argv:  # what the run measured, not where it wrote its report
        if arg == "--json":
            next(argv, None)
        elif arg != "--update-docs" and not arg.startswith("--json="):
            shown.append(arg)
    args = shlex.join(shown)
    command = f'make load ARGS="{args}"' if args else "make load"
    begin, end = markers(name)
    out = [
        begin,
        '<!-- Generated from one run by `make load ARGS="--update-docs"`: do not edit by hand. -->',
        "",
        f"`{command}`, {facts.get('date', '?')}: **{summary}**.",
        "",
        *(f"- {key}: {value}" for key, value in facts.items() if key != "date"),
        "",
    ]
    for report in reports:
        out += [report.render(level=5), ""]
    out.append(end)
    return "\n".join(out)


def update_docs(name: str, reports: Sequence[Report], facts: Mapping[str, str], summary: str) -> None:
    """Replaces the block `name` of docs/benchmarks.md (one of BLOCKS) with this run's."""
    begin_marker, end_marker = markers(name)
    text = DOC.read_text()
    begin, end = text.find(begin_marker), text.find(end_marker)
    if begin < 0 or end < begin:
        raise RuntimeError(f"{DOC} lacks the markers {begin_marker} ... {end_marker}")
    DOC.write_text(text[:begin] + block(name, reports, facts, summary) + text[end + len(end_marker) :])
