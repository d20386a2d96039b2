"""Placement: decide which device runs each op (Baechi's placers)."""

from tfopt.placement.api import (AUTO, PLACERS, Candidate, PlacementResult,
                                 place)
from tfopt.placement.m_etf import m_etf
from tfopt.placement.m_topo import m_topo
from tfopt.placement.placement import Placement
from tfopt.placement.problem import (InfeasiblePlacement, PlacementProblem,
                                     make_problem)

__all__ = ["AUTO", "Candidate", "InfeasiblePlacement", "PLACERS", "Placement",
           "PlacementProblem", "PlacementResult", "m_etf", "m_topo",
           "make_problem", "place"]
