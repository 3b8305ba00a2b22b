"""Time on a Raspberry Pi's core, estimated from counted instructions (bench/counted.py).

A pipeline-bound estimate: each class of instruction (as bench/qemu_count/count.c
counts them) keeps some of the core's issue pipes busy, and the work can take no
fewer cycles than its busiest resource needs, dispatch included. It assumes the
out-of-order core overlaps everything else perfectly: no cache misses, no branch
mispredictions, no dependency chains. Real time is longer; how much longer is
the range given (BOUND_SHARE).

The pipes and throughputs are those of the cores' Software Optimization Guides
(Arm UAN 0016A for the Cortex-A72, PJDOC-466751330-7215 for the Cortex-A76), as
LLVM's machine models for them carry them (AArch64SchedA57.td, which LLVM uses
for the A72 too, and AArch64SchedNeoverseN1.td, the A76's core):

- Cortex-A72: 3 instructions decoded a cycle; two FP/ASIMD pipes (F0, F1); a
  Q-form FMLA takes both (1 a cycle); smull/smlal only on F0 and sadalp only on
  F1 (1 a cycle each); other ASIMD ops one pipe (2 a cycle); one load and one
  store pipe (loads taken as all of them: 1 a cycle); two integer ALUs, one
  multi-cycle pipe, one branch pipe.
- Cortex-A76: 4 instructions decoded a cycle; two 128-bit ASIMD pipes (V0, V1):
  FMLA and sdot/udot on either (2 a cycle), smull/smlal only on V0 and sadalp
  only on V1; two load/store pipes; three integer pipes and a branch pipe.
"""

from __future__ import annotations

# counted classes (count.c)
CLASSES = ("fp_mul", "int_mul_long", "pairwise_add_long", "dot", "load_store", "simd_other", "other")

CORES = {
    "cortex-a72": {
        "name": "Cortex-A72 (Raspberry Pi 4)",
        "decode": 3,
        # pipe-cycles each instruction of a class takes on the FP/ASIMD pair (2 pipes)
        "vector_pipes": 2, "fp_mul_slots": 2, "dot_slots": 1, "simd_other_slots": 1,  # no dot product: none counted
        "load_store_per_cycle": 1,  # one load pipe (and one store pipe: loads are most of them)
        "other_per_cycle": 2,  # two integer ALUs (the branch and multiply pipes besides)
        "clock_ghz": (1.5, 1.8),  # Pi 4 boards before / from 2020's revision on
    },
    "cortex-a76": {
        "name": "Cortex-A76 (Raspberry Pi 5)",
        "decode": 4,
        "vector_pipes": 2, "fp_mul_slots": 1, "dot_slots": 1, "simd_other_slots": 1,
        "load_store_per_cycle": 2,
        "other_per_cycle": 3,
        "clock_ghz": (2.4,),
    },
}

# The bound counts every resource as busy all the time; measured kernels on
# out-of-order Arm cores reach about 60-90 % of it (cache misses, dependency
# chains): the estimate is given as that range.
BOUND_SHARE = (0.6, 0.9)


def bound_cycles(counts: dict[str, float], core: str) -> tuple[float, str]:
    """The least cycles `counts` can take on `core`, and the resource that bounds them."""
    c = CORES[core]
    multiplies, pairwise = counts.get("int_mul_long", 0.0), counts.get("pairwise_add_long", 0.0)
    vector_slots = (counts.get("fp_mul", 0.0) * c["fp_mul_slots"]
                    + counts.get("simd_other", 0.0) * c["simd_other_slots"]
                    + multiplies + pairwise + counts.get("dot", 0.0) * c["dot_slots"])
    limits = {
        "decode": sum(counts.get(k, 0.0) for k in CLASSES) / c["decode"],
        "FP/ASIMD pipes": vector_slots / c["vector_pipes"],
        # F0 / V0 alone; on the A72 a Q-form fmla takes F0 too (with F1)
        "multiply-long pipe": multiplies + counts.get("fp_mul", 0.0) * (c["fp_mul_slots"] - 1),
        "pairwise-add pipe": pairwise,  # F1 / V1 alone
        "loads/stores": counts.get("load_store", 0.0) / c["load_store_per_cycle"],
        "integer pipes": counts.get("other", 0.0) / c["other_per_cycle"],
    }
    bound = max(limits, key=limits.get)
    return limits[bound], bound


def seconds(counts: dict[str, float], core: str, clock_ghz: float) -> tuple[float, float]:
    """Estimated seconds on one core at `clock_ghz`: (fastest, slowest) of the range."""
    cycles, _ = bound_cycles(counts, core)
    low, high = BOUND_SHARE
    return cycles / high / (clock_ghz * 1e9), cycles / low / (clock_ghz * 1e9)
