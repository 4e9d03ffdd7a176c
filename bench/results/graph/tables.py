#!/usr/bin/env python3
"""Markdown tables from sched.jsonl and steps.jsonl (bench/results/graph/run.sh)."""
import json, sys, os
d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
rows = [json.loads(l) for l in open(os.path.join(d, "sched.jsonl")) if l.startswith("{")]
print("| program | ranks | tasks/s | vs 1 rank | commands/task |")
print("|---|---:|---:|---:|---:|")
base = {}
for r in rows:
    base.setdefault(r["program"], r["tasks_per_s"])
    print(f'| {r["program"]} | {r["ranks"]} | {r["tasks_per_s"]:.0f} | {r["tasks_per_s"]/base[r["program"]]:.3f} | {r["commands_per_task"]:.2f} |')
print()
steps = [json.loads(l) for l in open(os.path.join(d, "steps.jsonl")) if l.startswith("{")]
print("| program | size | ranks | graph ms/step | hand ms/step | graph steps/s | hand steps/s | graph/hand | #wrong |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in sorted(steps, key=lambda r: (r["program"], r["ranks"])):
    print(f'| {r["program"]} | {r["size"]} | {r["ranks"]} | {r["graph_ms_per_step"]:.1f} | {r["hand_ms_per_step"]:.1f} | {r["graph_steps_per_s"]:.2f} | {r["hand_steps_per_s"]:.2f} | {r["ratio"]:.3f} | {r["wrong"]} |')
