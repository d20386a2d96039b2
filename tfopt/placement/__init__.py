"""Placement: decide which device runs each op (Baechi's placers)."""

from tfopt.placement.api import (AUTO, PLACERS, Candidate, PlacementResult,
                                 place)
from tfopt.placement.bound import MakespanBound, makespan_bound
from tfopt.placement.coarsen import Coarsening, coarsen
from tfopt.placement.exact import ExactResult, exact
from tfopt.placement.m_etf import m_etf
from tfopt.placement.m_sct import favourite_children, m_sct
from tfopt.placement.m_topo import m_topo
from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     make_problem)

__all__ = ["AUTO", "Candidate", "Coarsening", "ExactResult",
           "InfeasiblePlacement", "MakespanBound", "PLACERS", "Placement",
           "PlacementProblem", "PlacementResult", "coarsen", "exact",
           "favourite_children", "m_etf", "m_sct", "m_topo", "make_problem",
           "makespan_bound", "place"]
