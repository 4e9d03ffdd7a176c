#!/bin/bash
# Regenerates crates/sucl-nccl/api/nccl-api.txt from a git clone of NVIDIA/nccl (with its tags):
# every function defined with NCCL_API (and the typed ncclParamGet* getters) in the newest tag
# given, the release that introduced it, its return type and parameters; "own" marks the
# functions the drop-in implements itself (src/api.rs), every other one is forwarded.
# usage: scripts/nccl-dropin-api-table.sh path/to/nccl-clone > crates/sucl-nccl/api/nccl-api.txt
set -euo pipefail
[ "${1:-}" = "--help" ] || [ $# -ne 1 ] && { sed -n 2,6p "$0" | sed 's/^# \{0,1\}//'; [ "${1:-}" = "--help" ]; exit; }
cd "$1"
python3 - <<'PY'
import re, subprocess
TAGS = ["v2.26.2-1", "v2.27.3-1", "v2.28.3-1", "v2.28.7-1", "v2.28.9-1", "v2.29.2-1", "v2.29.7-1", "v2.30.3-1", "v2.30.7-1"]
OWN = {"ncclGetLastError", "ncclGroupStart", "ncclGroupEnd", "ncclGroupSimulateEnd", "ncclCommInitRank",
       "ncclCommInitRankConfig", "ncclCommSplit", "ncclCommShrink", "ncclCommGrow", "ncclCommDestroy",
       "ncclCommAbort", "ncclCommRevoke", "ncclAllReduce"}
KIND = {"ncclResult_t": "result", "const char*": "string", "void": "void", "int": "int", "ncclTeam_t": "team"}
def git(*a):
    return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout
def decls(tag):
    d = {}
    for f in git("ls-tree", "-r", "--name-only", tag, "src").split():
        if not f.endswith((".cc", ".cu", ".h", ".cpp")):
            continue
        t = git("show", f"{tag}:{f}")
        for m in re.finditer(r"NCCL_API\(([^;{]*?)\)\s*[;{]", t, re.S):
            p = [x.strip() for x in " ".join(m.group(1).split()).split(",", 2)]
            if len(p) >= 2 and re.fullmatch(r"nccl\w+", p[1]):
                d[p[1]] = (p[0], p[2] if len(p) > 2 else "void")
        # The getters' uses, not the macro's own #define line.
        for m in re.finditer(r"^NCCL_PARAM_DEFINE_TYPED_GETTER\((\w+),\s*([\w ]+),", t, re.M):
            d["ncclParamGet" + m.group(1)] = ("ncclResult_t", f"ncclParamHandle_t h, {m.group(2).strip()}* out")
    return d
every = {t: decls(t) for t in TAGS}
last = dict(every[TAGS[-1]])
last["ncclResetDebugInitInternal"] = ("void", "void")
print("# NCCL's exported C API: every function libnccl.so.2 exports (2.26 .. 2.30.7), one per line.")
print("# name | returns | first release | how the shim handles it (forward: a jump to the real function;")
print("# own: an explicit function in src/api.rs) | parameters (nccl.h / NCCL_API declarations)")
print("# Every name is exported twice, as nccl* and as its profiling alias pnccl*, except")
print("# ncclResetDebugInitInternal (no alias). Regenerate: scripts/nccl-dropin-api-table.sh.")
for n in sorted(last):
    since = "2.28.3" if n == "ncclResetDebugInitInternal" else next(t for t in TAGS if n in every[t])[1:].rsplit("-", 1)[0]
    print(f"{n} | {KIND[last[n][0]]} | {since} | {'own' if n in OWN else 'forward'} | {last[n][1]}")
PY
