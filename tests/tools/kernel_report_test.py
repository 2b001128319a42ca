#!/usr/bin/env python3
"""Unit tests of tools/kernel_report.py's arithmetic and parsers, on small fixed
snippets of ptxas, cuobjdump and nvdisasm output, against figures worked out by
hand: occupancy (CUDA's occupancy calculator rules), the resource figures, and
instructions per MMA in the innermost loop holding HMMA. No GPU, no compiler,
no network.
Run: python3 tests/tools/kernel_report_test.py
"""

import importlib.util
import sys
import unittest
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "tools" / "kernel_report.py"
_spec = importlib.util.spec_from_file_location("kernel_report", _path)
kr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kr)

SM86, SM89, SM90 = kr.ARCHS


class OccupancyTest(unittest.TestCase):
    def test_flash_forward_hs64_is_held_by_shared_memory(self):
        # 128 threads = 4 warps; 94 registers -> 94 * 32 = 3008, rounded to 3072 per warp;
        # 16384 / 3072 = 5 warps per sub-partition, 20 per SM, 5 blocks.
        # Shared: 46080 + 1024 reserved = 47104 bytes (a multiple of 128).
        # sm_86: 102400 // 47104 = 2 blocks, 8 warps.
        self.assertEqual(kr.occupancy(SM86, 128, 94, 0, 46080), kr.Occupancy(2, 8, "shared memory"))
        # sm_90: 233472 // 47104 = 4 blocks (5 would need 235520), 16 warps.
        self.assertEqual(kr.occupancy(SM90, 128, 94, 0, 46080), kr.Occupancy(4, 16, "shared memory"))

    def test_registers_are_allocated_per_sub_partition(self):
        # One warp of 96 registers: 3072 per warp; 16384 // 3072 = 5 per sub-partition,
        # so 20 blocks per SM (the whole file, 65536 // 3072, would give 21); sm_89 allows 24.
        self.assertEqual(kr.occupancy(SM89, 32, 96, 0, 0), kr.Occupancy(20, 20, "registers"))

    def test_static_and_dynamic_shared_memory_add_up_with_the_reserve(self):
        # 8 warps of 32 registers (64 warps' worth of registers); static 4096 + dynamic 20000
        # + 1024 = 25120, rounded up to 25216; 102400 // 25216 = 4 blocks on sm_86.
        self.assertEqual(kr.occupancy(SM86, 256, 32, 4096, 20000), kr.Occupancy(4, 32, "shared memory"))

    def test_ties_name_every_limit(self):
        # 96 threads = 3 warps: 48 // 3 = 16 blocks by warps, 16 by the block limit of sm_86.
        self.assertEqual(kr.occupancy(SM86, 96, 32, 0, 0), kr.Occupancy(16, 48, "warps, blocks"))

    def test_a_launch_that_does_not_fit_gets_zero(self):
        # 1024 threads of 255 registers: 8192 per warp x 32 warps > 65536 per block.
        self.assertEqual(kr.occupancy(SM90, 1024, 255, 0, 0), kr.Occupancy(0, 0, "registers"))
        # 100 KiB of shared memory: past sm_86's 99 KiB per block, within sm_90's 227 KiB.
        self.assertEqual(kr.occupancy(SM86, 128, 32, 0, 100 * 1024), kr.Occupancy(0, 0, "shared memory"))
        self.assertEqual(kr.occupancy(SM90, 128, 32, 0, 100 * 1024), kr.Occupancy(2, 8, "shared memory"))


PTXAS = """\
ptxas info    : 272 bytes gmem
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    728 bytes stack frame, 1404 bytes spill stores, 1096 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 728 bytes cumulative stack size, 33792 bytes smem
ptxas info    : Compile time = 74.143 ms
ptxas info    : Compiling entry function '_Z5otherv' for 'sm_90'
ptxas info    : Function properties for _Z5otherv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 36 registers, used 0 barriers
ptxas info    : Compile time = 5.308 ms
"""

# The same kernels in an sm_90 cubin: shared memory 1024 bytes more (the reserve in the window).
RESOURCE_USAGE = """\

Resource usage:
 Common:
  GLOBAL:272 CONSTANT[4]:16
 Function _Z6kernelPf:
  REG:255 STACK:728 SHARED:34816 LOCAL:0 CONSTANT[0]:380 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z5otherv:
  REG:36 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:376 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


class ParserTest(unittest.TestCase):
    def test_registers_shared_memory_and_spills_come_from_ptxas(self):
        self.assertEqual(kr.parse_ptxas(PTXAS), {
            "_Z6kernelPf": kr.Resources(registers=255, static_smem=33792, spill_stores=1404, spill_loads=1096),
            "_Z5otherv": kr.Resources(registers=36, static_smem=0, spill_stores=0, spill_loads=0),
        })

    def test_the_cubin_must_agree_with_ptxas(self):
        usage = kr.parse_resource_usage(RESOURCE_USAGE)
        self.assertEqual(usage, {"_Z6kernelPf": (255, 34816), "_Z5otherv": (36, 1024)})
        ptxas = kr.parse_ptxas(PTXAS)
        kr.check_resource_usage(SM90, "kernel", ptxas["_Z6kernelPf"], usage["_Z6kernelPf"])
        kr.check_resource_usage(SM86, "kernel", ptxas["_Z6kernelPf"], (255, 33792))
        with self.assertRaises(SystemExit):
            kr.check_resource_usage(SM90, "kernel", ptxas["_Z6kernelPf"], (254, 34816))
        with self.assertRaises(SystemExit):
            kr.check_resource_usage(SM90, "kernel", ptxas["_Z6kernelPf"], (255, 36864))


# A tensor-core kernel's shape, as nvdisasm prints it: an outer loop (.L_x_1 ..
# the BRA at 0x0130) holding an inner copy loop without HMMA (.L_x_2), three
# HMMA, a shuffle whose divergent fallback lies after EXIT and branches back into
# the loop (to .L_x_4, which does not dominate it: no back edge), and ptxas's
# loop exit by CALL.REL.NOINC. The outer loop is the innermost one holding HMMA:
# 0x0030 .. 0x0130 is 17 instructions, 3 of them HMMA; the fallback's 3
# instructions belong to the loop but lie outside that span.
SASS_ONE_LOOP = """\
//--------------------- .text._Z3mmav --------------------------
\t.section\t.text._Z3mmav,"ax",@progbits
_Z3mmav:
.text._Z3mmav:
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
        /*0010*/                   MOV R2, RZ ;
        /*0020*/                   MOV R3, RZ ;
.L_x_1:
        /*0030*/                   LDSM.16.M88.4 R4, [R2] ;
.L_x_2:
        /*0040*/                   LDG.E.128 R8, [R2.64] ;
        /*0050*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0060*/                   ISETP.GE.AND P1, PT, R3, 0x4, PT ;
        /*0070*/              @!P1 BRA `(.L_x_2) ;
        /*0080*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0090*/                   HMMA.16816.F32.BF16 R16, R4, R10, R16 ;
        /*00a0*/                   BRA.DIV ~URZ, `(.L_x_3) ;
        /*00b0*/                   SHFL.BFLY PT, R5, R12, 0x1, 0x1f ;
.L_x_4:
        /*00c0*/                   FMNMX R6, R5, R12, !PT ;
        /*00d0*/               @P2 BRA `(.L_x_5) ;
        /*00e0*/                   HMMA.16816.F32.BF16 R20, R4, R8, R20 ;
.L_x_5:
        /*00f0*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0100*/                   ISETP.GE.AND P0, PT, R2, c[0x0][0x160], PT ;
        /*0110*/                   NOP ;
        /*0120*/               @P0 CALL.REL.NOINC `(.L_x_6) ;
        /*0130*/                   BRA `(.L_x_1) ;
.L_x_6:
        /*0140*/                   STG.E [R2.64], R6 ;
        /*0150*/                   EXIT ;
.L_x_3:
        /*0160*/                   WARPSYNC 0xffffffff ;
        /*0170*/                   SHFL.BFLY PT, R5, R12, 0x1, 0x1f ;
        /*0180*/                   BRA `(.L_x_4) ;
.L_x_7:
        /*0190*/                   BRA `(.L_x_7) ;
"""

# Two nested loops that both hold HMMA: the inner one (.L_x_9 .. 0x0060, 4
# instructions, 2 HMMA) is the innermost.
SASS_NESTED = """\
\t.section\t.text._Z6nestedv,"ax",@progbits
.text._Z6nestedv:
        /*0000*/                   MOV R2, RZ ;
.L_x_8:
        /*0010*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0020*/                   MOV R3, RZ ;
.L_x_9:
        /*0030*/                   HMMA.16816.F32.BF16 R16, R4, R8, R16 ;
        /*0040*/                   HMMA.16816.F32.BF16 R20, R4, R8, R20 ;
        /*0050*/                   ISETP.GE.AND P1, PT, R3, 0x4, PT ;
        /*0060*/              @!P1 BRA `(.L_x_9) ;
        /*0070*/                   ISETP.GE.AND P0, PT, R2, 0x4, PT ;
        /*0080*/              @!P0 BRA `(.L_x_8) ;
        /*0090*/                   EXIT ;
"""


class MmaLoopTest(unittest.TestCase):
    def test_the_loop_spans_header_to_back_edge_without_out_of_line_code(self):
        functions = kr.parse_sass(SASS_ONE_LOOP)
        instructions, labels = functions["_Z3mmav"]
        self.assertEqual(len(instructions), 26)
        self.assertEqual(labels[".L_x_4"], 0xC0)
        loop = kr.innermost_mma_loop(instructions, labels)
        self.assertEqual(loop, kr.MmaLoop(instructions=17, hmma=3))
        self.assertAlmostEqual(loop.per_mma, 17 / 3)

    def test_the_innermost_of_nested_loops_with_hmma(self):
        instructions, labels = kr.parse_sass(SASS_NESTED)["_Z6nestedv"]
        self.assertEqual(kr.innermost_mma_loop(instructions, labels), kr.MmaLoop(instructions=4, hmma=2))

    def test_no_loop_holds_hmma(self):
        sass = SASS_NESTED.replace("@!P0 BRA `(.L_x_8)", "NOP").replace("@!P1 BRA `(.L_x_9)", "NOP")
        instructions, labels = kr.parse_sass(sass)["_Z6nestedv"]
        self.assertIsNone(kr.innermost_mma_loop(instructions, labels))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[1:])
