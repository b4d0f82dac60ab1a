"""Mitogen's linear strategy, for the bed's VM scenarios (molecule/README.md, "VM scenarios").

Under software emulation (TCG) most of a task's time is a new Python in the guest that unpacks and compiles the
module and its module_utils again; Mitogen keeps one interpreter per host and its imports, which measured 4.5x less
wall time for the same 11 tasks on a 2-vCPU TCG twin (74-107 s plain SSH with pipelining, 16-25 s Mitogen). The
modules and their results are the same; the container scenarios over SSH (site_e2e, hardening) keep the plain path
operators use. HMK_BED_STRATEGY=linear runs a VM scenario without it.
"""
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401  pylint: disable=unused-import
