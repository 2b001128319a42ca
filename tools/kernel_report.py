#!/usr/bin/env python3
"""A static report on snug's CUDA kernels, with no GPU (issue 36).

Usage: python3 tools/kernel_report.py [OUTPUT_DIR] [--build DIR]

Writes OUTPUT_DIR/kernels.md and OUTPUT_DIR/kernels.csv (default
benchmarks/static/): for each kernel a GPT-2 124M bf16 training step launches
(benchmarks/static/step_kernels.cu says which, at which shapes) and each of
sm_86, sm_89 and sm_90: registers per thread, spill bytes, static and dynamic
shared memory per block, threads per block, the resident blocks and warps per
SM those allow, and for the tensor-core kernels the SASS instructions per MMA
in the innermost loop that holds HMMA instructions.

How: the host compiler builds step_kernels.cu against the emulated backend and
runs it with a launch recorder, which prints each launch's configuration as the
launchers chose it; nvcc compiles the same file to one cubin per architecture,
with ptxas -v giving each kernel's registers, static shared memory and spill
bytes (checked against the cubin's own record, cuobjdump --dump-resource-usage);
nvdisasm gives the SASS. Rows are joined to cubin symbols by mangled name and
named through c++filt. cuobjdump and nvdisasm
are not in every CUDA toolkit: the tool fetches NVIDIA's PyPI wheels
(nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm, of the toolkit's major version)
into third_party_tools/ (ignored by git) with pip, once. Intermediate files
(recorded launches, cubins, ptxas logs, SASS) stay in the build directory
(default build/kernel_report/). Needs nvcc, a C++20 host compiler (CXX, else
c++), c++filt (binutils) and, the first time, pip and PyPI. Python's standard
library only.
"""

import argparse
import csv
import dataclasses
import datetime
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("benchmarks/static/step_kernels.cu")  # relative to ROOT


# ---- the architectures' limits ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Arch:
    name: str
    # CUDA C++ Programming Guide, "Compute Capabilities", table "Technical
    # Specifications per Compute Capability" (columns 8.6, 8.9, 9.0):
    max_warps_per_sm: int          # "Maximum number of resident warps per SM": 48, 48, 64
    max_blocks_per_sm: int         # "Maximum number of resident blocks per SM": 16, 24, 32
    smem_per_sm: int               # "Maximum amount of shared memory per SM": 100 KB, 100 KB, 228 KB
    max_smem_per_block: int        # "Maximum amount of shared memory per thread block": 99 KB, 99 KB, 227 KB
    # The SM count of a card of the architecture (RTX 3090, RTX 4090, H100 SXM or
    # H200): the emulated device takes it and max_smem_per_block when the
    # architecture's launches are recorded, for launchers that size grids by it.
    multiprocessors: int
    regs_per_sm: int = 64 * 1024   # "Number of 32-bit registers per SM": 64 K on all three
    regs_per_block: int = 64 * 1024  # "Maximum number of 32-bit registers per thread block": 64 K
    warp_size: int = 32
    # The same guide, "Shared Memory" (compute capability 8.x and 9.0): 1 KB of
    # an SM's shared memory is reserved for system use per thread block.
    reserved_smem_per_block: int = 1024
    # Allocation granularities, from the CUDA toolkit's occupancy calculator
    # (include/cuda_occupancy.h, the arithmetic cudaOccupancyMaxActiveBlocksPerMultiprocessor
    # follows): registers go to warps in units of 256
    # (cudaOccRegAllocationGranularity), within each of 4 SM sub-partitions
    # holding a quarter of the register file (cudaOccSubPartitionsPerMultiprocessor);
    # shared memory goes to blocks in units of 128 bytes on 8.x and 9.0
    # (cudaOccSMemAllocationGranularity).
    reg_alloc_unit: int = 256
    sub_partitions: int = 4
    smem_alloc_unit: int = 128


KIB = 1024
ARCHS = [
    Arch("sm_86", max_warps_per_sm=48, max_blocks_per_sm=16, smem_per_sm=100 * KIB, max_smem_per_block=99 * KIB,
         multiprocessors=82),
    Arch("sm_89", max_warps_per_sm=48, max_blocks_per_sm=24, smem_per_sm=100 * KIB, max_smem_per_block=99 * KIB,
         multiprocessors=128),
    Arch("sm_90", max_warps_per_sm=64, max_blocks_per_sm=32, smem_per_sm=228 * KIB, max_smem_per_block=227 * KIB,
         multiprocessors=132),
]


# ---- occupancy ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Occupancy:
    blocks: int        # resident blocks per SM
    warps: int         # resident warps per SM
    limited_by: str    # what sets `blocks`: warps, blocks, registers, shared memory (ties: all of them)


def round_up(x, unit):
    return (x + unit - 1) // unit * unit


def occupancy(arch, threads, registers, static_smem, dynamic_smem):
    """Resident blocks and warps per SM of a launch, as CUDA's occupancy
    calculator works them out (include/cuda_occupancy.h, default carveout:
    all of the SM's shared memory available)."""
    warps_per_block = (threads + arch.warp_size - 1) // arch.warp_size
    limits = {"warps": arch.max_warps_per_sm // warps_per_block, "blocks": arch.max_blocks_per_sm}

    regs_per_warp = round_up(registers * arch.warp_size, arch.reg_alloc_unit)
    # The launch check assumes a block's warps spread over every sub-partition.
    fits = regs_per_warp * round_up(warps_per_block, arch.sub_partitions) <= arch.regs_per_block
    warps_per_partition = (arch.regs_per_sm // arch.sub_partitions) // regs_per_warp if registers else math.inf
    limits["registers"] = warps_per_partition * arch.sub_partitions // warps_per_block if fits else 0

    smem = static_smem + dynamic_smem
    smem_per_block = round_up(smem + arch.reserved_smem_per_block, arch.smem_alloc_unit)
    limits["shared memory"] = arch.smem_per_sm // smem_per_block if smem <= arch.max_smem_per_block else 0

    blocks = min(limits.values())
    limited_by = ", ".join(name for name, limit in limits.items() if limit == blocks)
    return Occupancy(blocks=blocks, warps=blocks * warps_per_block, limited_by=limited_by)


# ---- ptxas, cuobjdump and nvdisasm output -------------------------------------------

@dataclasses.dataclass(frozen=True)
class Resources:
    registers: int      # per thread
    static_smem: int    # bytes per block: the kernel's own __shared__ data
    spill_stores: int   # bytes per thread
    spill_loads: int


def parse_ptxas(text):
    """ptxas -v: {mangled name: Resources} of each entry function."""
    resources = {}
    for chunk in text.split("Compiling entry function '")[1:]:
        name = chunk[:chunk.index("'")]
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", chunk)
        used = re.search(r"Used (\d+) registers[^\n]*", chunk)
        smem = re.search(r"(\d+) bytes smem", used.group(0))
        resources[name] = Resources(registers=int(used.group(1)), static_smem=int(smem.group(1)) if smem else 0,
                                    spill_stores=int(spills.group(1)), spill_loads=int(spills.group(2)))
    return resources


def parse_resource_usage(text):
    """cuobjdump --dump-resource-usage: {mangled name: (registers, shared bytes)},
    the cubin's own record. Its shared bytes include, on sm_90, the 1 KiB the
    system reserves per block, which the cubin places in each kernel's shared
    window (section .nv.shared.reserved); ptxas -v counts the kernel's own."""
    pattern = r"^\s*Function (\S+):\s*\n\s*REG:(\d+)\b.*?\bSHARED:(\d+)"
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(pattern, text, re.M)}


@dataclasses.dataclass
class Instruction:
    address: int
    predicate: str   # "", "P0", "!P1", ...
    opcode: str      # "HMMA.16816.F32.BF16", "BRA", ...
    target: str      # the label a branch names, else ""


INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(?:@(\S+)\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^([.$\w]+):\s*$")
SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")


def parse_sass(text):
    """nvdisasm's listing: {mangled name: (instructions, {label: address})}."""
    functions = {}
    current = None
    pending = []  # labels waiting for the next instruction's address
    for line in text.splitlines():
        if m := SECTION.match(line):
            current = functions.setdefault(m.group(1), ([], {}))
            pending = []
        elif current is None:
            continue
        elif m := INSTRUCTION.match(line):
            address = int(m.group(1), 16)
            target = re.search(r"`\((\.L_x_\d+)\)", m.group(4))
            current[0].append(Instruction(address, m.group(2) or "", m.group(3), target.group(1) if target else ""))
            for label in pending:
                current[1][label] = address
            pending = []
        elif m := LABEL.match(line):
            pending.append(m.group(1))
    return functions


# ---- the innermost loop that holds HMMA ---------------------------------------------

def is_hmma(instruction):
    return instruction.opcode.startswith("HMMA")


def successors(instructions, target_index, i):
    """Indices of the instructions that may run after instruction i;
    target_index maps a label to the index of its instruction."""
    ins = instructions[i]
    base = ins.opcode.split(".")[0]
    always = ins.predicate in ("", "PT")
    falls = [i + 1] if i + 1 < len(instructions) else []
    if base in ("BRX", "JMX", "JMP"):
        raise ValueError(f"indirect branch {ins.opcode} at {ins.address:#x}: its targets are unknown")
    if ins.predicate == "!PT":  # never runs
        return falls
    # CALL.REL.NOINC to a label of the function is how ptxas leaves a loop: a jump.
    if base == "BRA" or (base == "CALL" and ins.target):
        target = [target_index[ins.target]]
        return target if always else target + falls
    if base in ("EXIT", "RET") and always:
        return []
    return falls


def natural_loops(instructions, labels):
    """The loops of a function's control flow graph (instructions as nodes),
    one per header: {header index: (latch index, set of the loop's instruction
    indices)}, from the back edges whose target dominates their source; with
    several back edges to one header, the last latch and the union of bodies."""
    index = {ins.address: k for k, ins in enumerate(instructions)}
    target_index = {label: index[address] for label, address in labels.items() if address in index}
    succ = [successors(instructions, target_index, i) for i in range(len(instructions))]
    # Reverse post-order from the entry (instruction 0), iteratively.
    order, seen, stack = [], {0}, [(0, iter(succ[0]))]
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(succ[nxt])))
    rpo = order[::-1]
    position = {node: k for k, node in enumerate(rpo)}
    pred = {node: [] for node in rpo}
    for node in rpo:
        for s in succ[node]:
            pred[s].append(node)
    # Immediate dominators (Cooper, Harvey and Kennedy, "A Simple, Fast Dominance Algorithm").
    idom = {0: 0}

    def intersect(a, b):
        while a != b:
            while position[a] > position[b]:
                a = idom[a]
            while position[b] > position[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for node in rpo[1:]:
            done = [p for p in pred[node] if p in idom]
            new = done[0]
            for p in done[1:]:
                new = intersect(p, new)
            if idom.get(node) != new:
                idom[node] = new
                changed = True

    def dominates(a, b):
        while b != a and idom[b] != b:
            b = idom[b]
        return a == b

    loops = {}
    for latch in rpo:
        for header in succ[latch]:
            if dominates(header, latch):
                body, work = {header, latch}, [latch]
                while work:
                    for p in pred[work.pop()]:
                        if p not in body:
                            body.add(p)
                            work.append(p)
                last, union = loops.get(header, (latch, set()))
                loops[header] = (max(last, latch), union | body)
    return loops


@dataclasses.dataclass(frozen=True)
class MmaLoop:
    instructions: int  # from the loop's header to its back edge, inclusive, in address order
    hmma: int          # HMMA instructions among them

    @property
    def per_mma(self):
        return self.instructions / self.hmma


def innermost_mma_loop(instructions, labels):
    """The innermost loop holding HMMA instructions (of several, the one with
    the most HMMA), counted over the instructions laid out from its header to
    its back edge: both sides of every branch inside, not the out-of-line code
    it jumps to (slow paths and divergence fallbacks placed after the exit).
    None when no loop holds HMMA."""
    loops = [(header, latch, body) for header, (latch, body) in natural_loops(instructions, labels).items()
             if any(is_hmma(instructions[i]) for i in body)]
    innermost = [loop for loop in loops if not any(other[2] < loop[2] for other in loops)]
    counts = []
    for header, latch, _ in innermost:
        if header > latch:
            raise ValueError(f"loop at {instructions[header].address:#x} is laid out after its back edge")
        span = instructions[header:latch + 1]
        counts.append(MmaLoop(instructions=len(span), hmma=sum(map(is_hmma, span))))
    return max(counts, key=lambda c: c.hmma, default=None)


# ---- tools and builds ---------------------------------------------------------------

def run(command, **kwargs):
    """Runs a command (a list), returning its stdout; stops with its stderr on failure."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"kernel_report: {' '.join(map(str, command))} failed ({result.returncode}):\n{result.stderr}")
    return result


def find_nvcc():
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        sys.exit("kernel_report: nvcc not found (set CUDACXX, or put the CUDA toolkit's bin on PATH)")
    return nvcc


def nvcc_version(nvcc):
    """The toolkit's release, e.g. "13.0.88"."""
    return re.search(r"V(\d+\.\d+\.\d+)", run([nvcc, "--version"]).stdout).group(1)


def fetch_tool(name, wheel, major, tools_dir):
    """tools_dir/bin/name, unpacked from NVIDIA's PyPI wheel of the toolkit's
    major version the first time (pip download; a wheel is a zip)."""
    binary = tools_dir / "bin" / name
    if binary.exists():
        return binary
    download = tools_dir / "wheels"
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(download), f"{wheel}=={major}.*"])
    archive = next(download.glob(wheel.replace("-", "_") + "-*.whl"))
    with zipfile.ZipFile(archive) as z:
        member = next(m for m in z.namelist() if m.endswith("/bin/" + name))
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_bytes(z.read(member))
    binary.chmod(0o755)
    return binary


def tool_version(binary):
    return re.search(r"V(\d+\.\d+\.\d+)", run([str(binary), "--version"]).stdout).group(1)


@dataclasses.dataclass
class Launch:
    calls: list        # the launcher calls that launch it so
    mangled: str
    threads: int
    dynamic_smem: int


def build_recorder(build):
    """Builds step_kernels.cu against the emulated backend: the executable
    that prints the launches."""
    exe = build / "step_kernels_launches"
    cxx = os.environ.get("CXX", "c++")
    run([cxx, "-std=c++20", "-O0", "-DSNUG_CUDA_EMULATED=1", "-Wno-unknown-pragmas", "-Iinclude", "-x", "c++",
         str(SOURCE), "-o", str(exe), "-pthread", "-rdynamic", "-ldl"], cwd=ROOT)
    return exe


def record_launches(exe, arch, build):
    """Runs the recorder with the emulated device given arch's SM count and
    opt-in shared memory per block: the launches the launchers choose on such
    a card, one per kernel and configuration, in the order first seen."""
    output = run([str(exe), str(arch.multiprocessors), str(arch.max_smem_per_block)]).stdout
    (build / f"launches_{arch.name}.tsv").write_text(output)
    launches = {}
    for line in output.splitlines():
        call, mangled, threads, dynamic = line.split("\t")
        key = (mangled, int(threads), int(dynamic))
        if key not in launches:
            launches[key] = Launch([], mangled, int(threads), int(dynamic))
        if call not in launches[key].calls:
            launches[key].calls.append(call)
    return list(launches.values())


def compile_cubin(nvcc, arch, build):
    """One cubin of step_kernels.cu for `arch`; returns (cubin path, ptxas -v log)."""
    cubin = build / f"{arch.name}.cubin"
    result = run([nvcc, "-cubin", f"-arch={arch.name}", "-std=c++20", "--expt-relaxed-constexpr", "-O3", "-Iinclude",
                  "-Xptxas", "-v", str(SOURCE), "-o", str(cubin)], cwd=ROOT)
    (build / f"{arch.name}.ptxas.txt").write_text(result.stderr)
    return cubin, result.stderr


def check_resource_usage(arch, kernel, resources, usage):
    """Stops unless the cubin agrees with ptxas: the same registers, and the
    same shared memory but for the system's reserve on sm_90."""
    registers, shared = usage
    if registers != resources.registers or shared - resources.static_smem not in (0, arch.reserved_smem_per_block):
        sys.exit(f"kernel_report: {kernel} on {arch.name}: cuobjdump says {registers} registers, {shared} bytes "
                 f"of shared memory; ptxas said {resources.registers} and {resources.static_smem}")


def demangle(names):
    """{mangled: readable}, through c++filt: the kernel's qualified name and
    template arguments, without the return type, parameters and snug:: prefixes."""
    out = run(["c++filt"], input="\n".join(names) + "\n").stdout.splitlines()
    readable = {}
    for mangled, full in zip(names, out):
        name = full.removeprefix("void ")
        depth = 0
        for k, c in enumerate(name):  # cut at the parameter list's '(' outside template brackets
            depth += (c == "<") - (c == ">")
            if c == "(" and depth == 0:
                name = name[:k]
                break
        readable[mangled] = name.replace("snug::cuda::detail::", "").replace("snug::", "")
    return readable


def commit_name():
    """The first 12 hex digits of HEAD, with -dirty when tracked files changed."""
    sha = run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT).stdout.strip()
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT).stdout.strip()
    return sha + ("-dirty" if dirty else "")


# ---- the report ---------------------------------------------------------------------

@dataclasses.dataclass
class Row:
    arch: Arch
    launch: Launch
    kernel: str
    resources: Resources
    occupancy: Occupancy
    mma: object  # MmaLoop, or None without HMMA


COLUMNS_DOC = """\
Columns:
- **kernel**: the kernel template and its arguments (c++filt of the cubin symbol, without `snug::cuda::detail::`).
- **call**: the launcher call(s) that launch it with this configuration at these shapes (one row per kernel and
  configuration).
- **threads**: threads per block as launched. Each architecture's launches are recorded with the emulated device
  given a card's limits (its SM count, below, and its opt-in shared memory per block), so a launcher that sizes
  its launches by the card shows here what it launches on that card.
- **regs**: registers per thread (`ptxas -v`, the same in `cuobjdump --dump-resource-usage`).
- **spill st/ld**: bytes of spill stores / spill loads per thread (`ptxas -v`).
- **smem static / dyn**: shared memory per block in bytes: static (the kernel's own `__shared__` data, `ptxas -v`)
  and dynamic (as launched). On sm_90, `cuobjdump` shows 1024 bytes more static shared memory for every kernel:
  the cubin places the system's 1 KiB reserve per block inside the kernel's shared window. The occupancy below
  counts that reserve once, on every architecture (for sm_90 an assumption still to confirm against
  `cudaOccupancyMaxActiveBlocksPerMultiprocessor` on a Hopper GPU).
- **blocks/SM**, **warps/SM**: resident thread blocks and warps per SM that the launch's threads, registers and
  shared memory allow under the architecture's limits (below), by the arithmetic of CUDA's occupancy calculator;
  **occ.** is warps/SM over the architecture's maximum.
- **limited by**: the resource that sets blocks/SM (warps, blocks, registers, shared memory).
- **instr/MMA**: tensor-core kernels only (those with HMMA instructions): the SASS instructions of the innermost
  loop holding HMMA (found as a natural loop of the control flow graph; of several, the one with the most HMMA),
  counted statically over the instructions laid out from the loop's first instruction to its back-edge branch,
  inclusive (both sides of every branch inside the loop, not the out-of-line slow paths it jumps to), divided by
  the HMMA instructions among them (`n / m` gives both counts). Not a count of instructions executed.
"""


def limits_table(archs):
    def kib(n):
        return f"{n // KIB} KiB"

    lines = ["| limit | " + " | ".join(a.name for a in archs) + " |", "| --- |" + " --- |" * len(archs)]
    for label, get in [("max resident warps per SM", lambda a: a.max_warps_per_sm),
                       ("max resident blocks per SM", lambda a: a.max_blocks_per_sm),
                       ("32-bit registers per SM (to warps in units of 256, in 4 sub-partitions)",
                        lambda a: a.regs_per_sm),
                       ("shared memory per SM", lambda a: kib(a.smem_per_sm)),
                       ("max shared memory per block", lambda a: kib(a.max_smem_per_block)),
                       ("SMs of the card whose launches are recorded (RTX 3090, RTX 4090, H100 SXM)",
                        lambda a: a.multiprocessors),
                       ("shared memory reserved per block (to blocks in units of 128 bytes)",
                        lambda a: kib(a.reserved_smem_per_block))]:
        lines.append(f"| {label} | " + " | ".join(str(get(a)) for a in archs) + " |")
    return "\n".join(lines)


def mma_text(mma):
    return f"{mma.per_mma:.2f} ({mma.instructions} / {mma.hmma})" if mma else ""


def write_markdown(path, rows, header):
    out = [header, COLUMNS_DOC, "Limits (CUDA C++ Programming Guide, compute capabilities 8.6, 8.9, 9.0):", "",
           limits_table(ARCHS), ""]
    for arch in ARCHS:
        out += [f"## {arch.name}", "",
                "| kernel | call | threads | regs | spill st/ld | smem static / dyn | blocks/SM | warps/SM | occ. "
                "| limited by | instr/MMA |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for r in (r for r in rows if r.arch is arch):
            res, occ = r.resources, r.occupancy
            cells = [f"`{r.kernel}`", ", ".join(r.launch.calls), r.launch.threads, res.registers,
                     f"{res.spill_stores} / {res.spill_loads}", f"{res.static_smem} / {r.launch.dynamic_smem}",
                     occ.blocks, occ.warps, f"{occ.warps / arch.max_warps_per_sm:.0%}", occ.limited_by,
                     mma_text(r.mma)]
            out.append("| " + " | ".join(map(str, cells)) + " |")
        out.append("")
    path.write_text("\n".join(out))


def write_csv(path, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", "kernel", "mangled", "calls", "threads", "registers", "spill_store_bytes",
                    "spill_load_bytes", "static_smem_bytes", "dynamic_smem_bytes", "blocks_per_sm", "warps_per_sm",
                    "occupancy", "limited_by", "loop_instructions", "loop_hmma", "instructions_per_mma"])
        for r in rows:
            res, occ, mma = r.resources, r.occupancy, r.mma
            w.writerow([r.arch.name, r.kernel, r.launch.mangled, "; ".join(r.launch.calls), r.launch.threads,
                        res.registers, res.spill_stores, res.spill_loads, res.static_smem, r.launch.dynamic_smem,
                        occ.blocks, occ.warps, f"{occ.warps / r.arch.max_warps_per_sm:.4f}", occ.limited_by,
                        mma.instructions if mma else "", mma.hmma if mma else "", f"{mma.per_mma:.3f}" if mma else ""])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", nargs="?", type=Path, default=ROOT / "benchmarks" / "static",
                        help="where kernels.md and kernels.csv go (default: benchmarks/static)")
    parser.add_argument("--build", type=Path, default=ROOT / "build" / "kernel_report",
                        help="intermediate files: launches, cubins, ptxas logs, SASS (default: build/kernel_report)")
    args = parser.parse_args()
    output, build = args.output.resolve(), args.build.resolve()
    build.mkdir(parents=True, exist_ok=True)
    output.mkdir(parents=True, exist_ok=True)

    nvcc = find_nvcc()
    toolkit = nvcc_version(nvcc)
    major = toolkit.split(".")[0]
    cuobjdump = fetch_tool("cuobjdump", "nvidia-cuda-cuobjdump", major, ROOT / "third_party_tools")
    nvdisasm = fetch_tool("nvdisasm", "nvidia-cuda-nvdisasm", major, ROOT / "third_party_tools")

    print("recording launches (emulated backend) ...", flush=True)
    recorder = build_recorder(build)
    launches_of = {arch.name: record_launches(recorder, arch, build) for arch in ARCHS}
    kernels = demangle(sorted({launch.mangled for launches in launches_of.values() for launch in launches}))
    rows = []
    for arch in ARCHS:
        launches = launches_of[arch.name]
        print(f"compiling {arch.name} ...", flush=True)
        cubin, ptxas = compile_cubin(nvcc, arch, build)
        resources = parse_ptxas(ptxas)
        usage = parse_resource_usage(run([str(cuobjdump), "--dump-resource-usage", str(cubin)]).stdout)
        sass_text = run([str(nvdisasm), "-c", str(cubin)]).stdout
        (build / f"{arch.name}.sass").write_text(sass_text)
        sass = parse_sass(sass_text)
        for launch in launches:
            kernel = kernels[launch.mangled]
            if launch.mangled not in resources:
                sys.exit(f"kernel_report: {kernel} was launched but is not in {cubin}")
            res = resources[launch.mangled]
            check_resource_usage(arch, kernel, res, usage[launch.mangled])
            instructions, labels = sass[launch.mangled]
            mma = innermost_mma_loop(instructions, labels) if any(map(is_hmma, instructions)) else None
            rows.append(Row(arch, launch, kernel, res,
                            occupancy(arch, launch.threads, res.registers, res.static_smem, launch.dynamic_smem), mma))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    header = f"""# snug's CUDA kernels: a static report (no GPU)

A static reading of the compiled code: nothing ran on a GPU. Commit `{commit_name()}`, {date} (UTC).

The kernels and launch configurations of a GPT-2 124M bf16 training step (B 16, T 1024, C 768, 12 heads of 64;
flash attention also at head size 128), as `{SOURCE}` records them from snug's own launchers (its header says
which calls, at which dtypes). Compiled by nvcc {toolkit}
(`nvcc -cubin -arch=sm_XX -std=c++20 --expt-relaxed-constexpr -O3 -Xptxas -v`), read with cuobjdump
{tool_version(cuobjdump)} and nvdisasm {tool_version(nvdisasm)}; written by `python3 tools/kernel_report.py`.
"""
    write_markdown(output / "kernels.md", rows, header)
    write_csv(output / "kernels.csv", rows)
    print(f"wrote {output / 'kernels.md'} and {output / 'kernels.csv'}")


if __name__ == "__main__":
    main()
