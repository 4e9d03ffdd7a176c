#!/usr/bin/env python3
"""Turns a benchmark's text output into CSV (stdout), so each figure keeps one compact data file.

usage: tocsv.py md  FILE [--section TEXT] [--cols A,B,..] [--set K=V ...]
         the first markdown table after a heading containing TEXT (default: the first table)
       tocsv.py ws  FILE [--cols ...] [--set ...]
         a whitespace table whose header line starts with `bytes` (`sucl bench --compare` text)
       tocsv.py jsonl FILE [--set ...]
         every JSON object line (a `[rank] ` prefix is dropped), as JSON lines, not CSV
--cols keeps and renames columns: `NEW=OLD` or `OLD`; --set prepends a constant column.
"""
import argparse, csv, json, re, sys


def md_table(lines, section):
    start = 0
    if section:
        start = next(i for i, l in enumerate(lines) if l.startswith("#") and section in l)
    rows = []
    for line in lines[start:]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            break
    return rows[0], rows[1:]


def ws_table(lines):
    start = next(i for i, l in enumerate(lines) if l.split()[:1] == ["bytes"])
    head = lines[start].split()
    body = []
    for line in lines[start + 1:]:
        f = line.split()
        if not f or not f[0].isdigit():
            break
        body.append(f)
    return head, body


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["md", "ws", "jsonl"])
    p.add_argument("file")
    p.add_argument("--section")
    p.add_argument("--cols")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--no-header", action="store_true")
    a = p.parse_args()
    lines = open(a.file, encoding="utf-8").read().splitlines()
    consts = [kv.split("=", 1) for kv in a.set]
    if a.kind == "jsonl":
        for line in lines:
            line = re.sub(r"^\[\d+\] ", "", line)
            if line.startswith("{"):
                obj = dict(consts)
                obj.update(json.loads(line))
                print(json.dumps(obj))
        return
    head, body = md_table(lines, a.section) if a.kind == "md" else ws_table(lines)
    pick = [(c.split("=", 1) + [c])[:2] if "=" in c else [c, c] for c in a.cols.split(",")] if a.cols else [[h, h] for h in head]
    idx = []
    for new, old in pick:
        if old not in head:
            sys.exit(f"tocsv.py: {a.file}: no column `{old}` in {head}")
        idx.append(head.index(old))
    out = csv.writer(sys.stdout, lineterminator="\n")
    if not a.no_header:
        out.writerow([k for k, _ in consts] + [new for new, _ in pick])
    for r in body:
        out.writerow([v for _, v in consts] + [r[i].replace("+", "") if r[i].startswith("+") else r[i] for i in idx])


if __name__ == "__main__":
    main()
