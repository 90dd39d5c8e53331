#!/usr/bin/env python3
"""A build's wall time on N cores, from one Ninja build's step times (its .ninja_log) and dependency graph.

Ninja's log holds how long each step took; `ninja -t graph` which step needs which. The steps are then
scheduled on N cores as Ninja does (a ready step starts when a core is free, the longest remaining chain
first), so a 2-core machine can say what a 16-core one would take, and which build layout is shorter:
  bench/build_schedule.py BUILD_DIR CORES [--make] [--seq] [--top] TARGET...
  --make  as CMake's Unix Makefiles: a target's files wait for every library it links
  --seq   the targets one after another, as Makefiles build several --target goals (.NOTPARALLEL)
  --top   the longest steps and the critical path
The step times are this machine's; scale them by a measured build of the other machine.
"""
import collections
import heapq
import re
import subprocess
import sys

flags = {a for a in sys.argv[1:] if a.startswith('--')}
args = [a for a in sys.argv[1:] if not a.startswith('--')]
if len(args) < 3 or flags - {'--make', '--seq', '--top'}:
    sys.exit(__doc__)
bdir, ncores, targets = args[0], int(args[1]), args[2:]

secs = {}
for line in open(f"{bdir}/.ninja_log"):
    if not line.startswith('#'):
        start, end, _, out, _ = line.split('\t')
        secs[out] = (int(end) - int(start)) / 1000
graph = subprocess.run(["ninja", "-C", bdir, "-t", "graph", *targets], capture_output=True, text=True,
                       check=True).stdout
label, into = {}, collections.defaultdict(set)
for m in re.finditer(r'"(0x[0-9a-f]+)" \[label="([^"]*)"(, shape=ellipse)?', graph):
    label[m.group(1)] = (m.group(2), bool(m.group(3)))
for m in re.finditer(r'"(0x[0-9a-f]+)" -> "(0x[0-9a-f]+)"', graph):
    into[m.group(2)].add(m.group(1))


def inputs(n):  # the files a file is made from (through the graph's rule nodes)
    out = set()
    for p in into[n]:
        out |= inputs(p) if label.get(p, ("", False))[1] else {p}
    return out


files = {n: name for n, (name, rule) in label.items() if not rule}
step = {n: secs.get(name, 0.0) for n, name in files.items()}
dep = {n: inputs(n) for n in files}
if '--make' in flags:
    target_of = lambda name: (re.search(r'CMakeFiles/([^/]+)\.dir/', name) or [None, None])[1]
    libs = {}
    for n, name in files.items():
        objs = [d for d in dep[n] if files.get(d, '').endswith('.o')]
        if objs and not name.endswith('.o'):
            libs[target_of(files[objs[0]])] = {d for d in dep[n] if files.get(d, '').endswith('.a')}
    for n, name in files.items():
        if name.endswith(('.o', '.gch')):
            dep[n] |= libs.get(target_of(name), set())
succ = collections.defaultdict(set)
for n, ds in dep.items():
    for d in ds:
        succ[d].add(n)
chain = {}


def rest(n):  # the longest chain from n to the end, n included
    if n not in chain:
        chain[n] = step[n] + max((rest(s) for s in succ[n]), default=0)
    return chain[n]


def simulate(nodes):
    waiting = {n: len(dep[n] & nodes) for n in nodes}
    ready = [(-rest(n), n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    running, now, busy = [], 0.0, 0.0

    def finished(n):
        for s in succ[n] & nodes:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (-rest(s), s))
    while ready or running:
        while ready and len(running) < ncores:
            _, n = heapq.heappop(ready)
            if step[n] == 0:
                finished(n)
                continue
            heapq.heappush(running, (now + step[n], n))
            busy += step[n]
        if running:
            now, n = heapq.heappop(running)
            finished(n)
    return now, busy


def closure(n, acc):
    if n not in acc:
        acc.add(n)
        for d in dep[n]:
            closure(d, acc)
    return acc


def node(target):
    for n, name in files.items():
        if name in (target, 'tests/' + target, 'bench/' + target):
            return n
    sys.exit(f"build_schedule: no target {target} in {bdir}")


if '--seq' in flags:
    built, total = set(), 0.0
    for t in targets:
        nodes = closure(node(t), set()) - built
        total += simulate(nodes)[0]
        built |= nodes
    print(f"{ncores} cores, the targets one after another: {total:.0f} s")
    sys.exit(0)
wall, busy = simulate(set(files))
print(f"{ncores} cores: {wall:.0f} s; {busy:.0f} CPU s in all; critical path {max(map(rest, files)):.0f} s")
if '--top' in flags:
    for s, name in sorted(((step[n], files[n]) for n in files), reverse=True)[:12]:
        print(f"  {s:6.1f} s  {name}")
    print("critical path:")
    n = max(files, key=rest)
    while n:
        if step[n] > 0.5:
            print(f"  {step[n]:6.1f} s  {files[n]}")
        n = max(succ[n], key=rest) if succ[n] else None
