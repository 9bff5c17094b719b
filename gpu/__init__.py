"""kernelrl's evaluation worker and the trusted code around each candidate: a package whose modules
import each other in one direction (tests/unit/test_layers.py checks it).

  worker          the fork server the C++ evaluator starts (`python gpu/worker.py`)
  sandbox         each candidate's confined process; cgroups, seccomp, devlock, bounded beside it
  harness         what runs inside the candidate's process, phase by phase
  judge           the separate process that holds the reference and gives the verdict
  timed_region, timing, checks, fused_check, defenses, protocol, devshare, verdict, scaffold,
  compile_cache, shared_timings: the parts they share

Modules are imported by their package names (`from gpu import harness`), never as top-level modules
of this folder.
"""
