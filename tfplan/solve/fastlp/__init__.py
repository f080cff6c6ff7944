"""fastlp: an exact, fast solver for the three-phase TimelyFreeze LP (tfplan.solve.lp; the same optima as
tfplan.solve.solver).

    from tfplan.schedule import schedules
    from tfplan.cost import profile
    from tfplan.step import dag
    from tfplan.solve import fastlp
    d = dag.build(schedules.generate("1f1b", 32, 512), profile.uniform(32))
    sol = fastlp.solve(d, 0.9)          # an lp.Solution, like solver.solve(d, 0.9)

The LP grows with the micro-batch count M but its hard part does not: pipeline schedules repeat the same
per-rank pattern every micro-batch (or round), with the same per-stage costs. We solve two small LPs per
phase whose sizes depend on the pipeline depth, not on M, and that sandwich the true optimum.

The files, in reading order (each imports only those above it):
  graph.py    the Dag as flat numpy arrays with the LP's precedence rows (GraphArrays), the repeating chains
              of actions (Runs) and the ties of a margin (Ties);
  tied.py     the two small LPs of a phase: the tied primal (an upper bound U) and the tied dual (a lower
              bound), as sparse COO matrices (SparseLP, Compressed, Phase);
  dual.py     the tied dual's columns (dual_layout), the LP itself (tied_dual) and phase 3's from phase 2's basis;
  exact.py    sums of products in double-double arithmetic (Note [bound rounding]: the bound's terms are
              nine orders of magnitude above its value at a million actions);
  bound.py    the safe lower bound L from any dual vector of the full LP (weak duality), and the start-time
              windows that tighten it (Windows);
  margins.py  the margin schedule: how many periods of each run stay untied, phase by phase (Margins);
  glop.py     GLOP on a SparseLP, its parameters, warm starts from a basis, and the race of two simplex methods
              (solve_glop, solve_lp, solve_warm, race);
  refine.py   a GLOP point recomputed from its basis with scipy's sparse LU, when scipy is there (Note [refined
              duals]: the tied duals' rows then hold to rounding, not to GLOP's tolerance);
  lower.py    a phase's lower bound L from its tied dual: the safe bound, refined and tightened where it falls
              short of GLOP's own value (dual_bound, tighter_bound);
  rounds.py   one phase certified: rounds of tied primal and tied dual in two threads, margins growing until
              U - L meets the tolerance (certified; Notes [warm margins], [unneeded duals]);
  phases.py   the solve itself: the three phases chained, the time limit, and the plan (solve; Note [LP
              tolerance]);
  goodput_lp.py  the goodput search's LP in GLOP: the tied primal of phase 1 with stage means, progress
              variables and Kelley's cuts, re-solved warm (GoodputLP; Note [warm goodput LP]);
  goodput.py  the goodput objective on the same compressed LP (solve_goodput; Notes [goodput LP],
              [goodput certificate], [goodput handover]): the stage means that maximise predicted progress per
              second, which then become the caps of `solve`, with the bases its phase 2 starts from.
Only `solve` and `solve_goodput` are this package's interface; the modules' public names are there for
tests and benchmarks.

Note [periodic compression]
  Runs. For a period q, actions v = (stage, kind, m) and w = (stage, kind, m + q) are "shift-equal" when each
  predecessor slot of w holds the shifted predecessor of v with the same lag (and w sits as many list
  positions after v as is usual for that stage and kind). Maximal chains of shift-equal actions are runs:
  the steady state of every stage and kind (graph.Runs). All actions of a run have the same
  durations, since costs are per stage.
  Ties. Leaving `margin` periods free at both ends of each run, the rest of a run is tied to its first tied
  action rep, off periods later: r_v = r_rep and t_v = t_rep + off * tau_run (graph.Ties).
  Upper bound U (tied.tied_primal). Substituting the ties restricts the LP, so U >= OPT. The
  substituted precedence rows collapse: rows with the same (run_u, run_v, off_v - off_u, lag) differ only in
  off_u, on which they depend affinely, so the rows at the smallest and largest off_u imply all others. A
  tied ratio column weighs as many actions as it stands for in the caps and objectives. Size: the untied
  actions plus a few columns and rows per run.
  Lower bound L (tied.tied_dual, bound). Write the dual of the full LP (a flow per precedence
  row, a price per cap, ...) and tie its variables the same way: one flow for all rows of a group above, one
  price per tied ratio bound. That restricts the (maximising) dual; dual constraints of tied actions that see
  the same tied flows are identical and kept once, so the tied dual is about as small as the tied primal. Its
  solution, expanded to one value per row of the full LP, is a dual vector y of the full LP, and L = b'y minus
  the positive parts of (A'y - c) times the columns' finite upper bounds is a lower bound on OPT for ANY y
  (bound.py, Note [LP certificate] in tfplan.solve.lp): GLOP's tolerances and the ties can only loosen it.
  Exactness. A phase is certified (OPTIMAL) when U - L <= gap_tol max(1, |U|) (tfplan.solve.lp: 1e-9, phase 3
  1e-7): the phase reports max(U, L) and its gap U - L, and the last phase's tied primal solution, expanded
  to every action, is the plan. Otherwise the margins grow (2 margin + 1, in phase 3 by half, Note [phase 3
  growth]; in phases 2-3 at least the runs' median, Note [lagging runs]; the primal's and the dual's each on its
  own, Note [two margins]; all in margins.py) and the phase is solved again; once nothing is tied, the tied
  primal is the full LP and its own row duals give L. Both bounds hold for any choice of ties, so a wrong guess
  of the structure costs time, never correctness. The two LPs of a margin are solved in two threads (GLOP
  releases the GIL).
  Time limit. Every GLOP call gets what is left of the solve's time limit. When it runs out, the solve stops
  at the first uncertified phase and returns the best tied primal point found so far (of that phase, or of
  the last certified one) as a FEASIBLE plan with its gap, with a warning; with no feasible point at all it
  raises lp.TimeLimitReached.
  Margins. Phase 1 starts at 2 periods and usually needs no more (the goodput optimum's caps are an
  exception: 47 periods on 1F1B 32 x 512, reached by doubling from 2, which is why the goodput search hands its
  certified phase 1 over, tfplan.solve.fastlp.goodput); where it does, it grows at once to where phases 2-3
  start (Note [phase 1's growth] in margins.py). Phases 2-3 need more: their optima are
  periodic only after the pipeline's fill and before its drain, and in between a stage with slack unfreezes
  a block of about S (stages) of its last steady-state actions (measured: uniform 1F1B 8 x 96 needs 8,
  heterogeneous 32 x 512 needs 32; too small a margin shows as U > L and costs a round). They start at the
  cheaper of S for every run and margins aligned on the unfrozen schedule's timing (margins.aligned_margins:
  1F1B 32 x 512 then needs 5.2k LP columns instead of 7.8k). The LPs have O(S^2) columns whatever M is:
  1F1B 32 x 512 and 32 x 16384 solve LPs of the same size, and 64 stages (~30k columns) take GLOP minutes.
  The phases are chained as in Note [three-phase LP] (tfplan.solve.lp): phase 2 bounds T by T1 (1 + 1e-9),
  phase 3 the total freeze by R2 (1 + 1e-9) + 1e-9, with T1 and R2 the certified optima.
"""

from tfplan.solve.fastlp.goodput import solve_goodput
from tfplan.solve.fastlp.phases import solve

__all__ = ["solve", "solve_goodput"]
