"""Plans: a job (profile, schedule, caps) solved into the file that tfrun runs.

Read in this order:
  plan.py          the Plan, its predictions (step times against no freezing, uniform freezing, all frozen),
                   the versioned JSON and schedule CSV it is written as (docs/formats.md)
  plan_ratios.py   the stage x micro-batch table of ratios in a plan file, and its older versions
  plan_profile.py  the profile a plan file carries: its source's provenance, and the section read back
  job.py           the user's options resolved into a DAG, solved by the backend that fits, the stage-0 anchor
                   (Note [stage-0 anchor]), and the plan made from it
"""
